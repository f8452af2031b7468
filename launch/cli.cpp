// launch/cli.cpp -- table-driven flag and config-file parsing (cxxopts + nlohmann/json).
#include "launch/cli.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>

#include <cxxopts.hpp>

#include "data/paths.h"
#include "data/tokenizer.h"
#include "distributed/error.h"
#include "distributed/suggest.h"
#include "launch/deepspeed_config.h"
#include "launch/flags.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/init_from.h"

namespace kiln {

namespace {

using json = nlohmann::json;

enum class Kind { Int, Float, String, List, Bool };

// One `kiln train` setting: its flag name, type, help, and where it lands in TrainConfig.
struct Flag {
  std::string name;
  Kind kind;
  std::string help;
  std::function<void(TrainConfig&, const json&)> set;
};

template <typename T>
std::function<void(TrainConfig&, const json&)> field(T TrainConfig::*member) {
  return [member](TrainConfig& c, const json& v) { c.*member = v.get<T>(); };
}
template <typename T>
std::function<void(TrainConfig&, const json&)> model_field(T GPTConfig::*member) {
  return [member](TrainConfig& c, const json& v) { c.gpt.*member = v.get<T>(); };
}

const std::vector<Flag>& train_flags() {
  static const std::vector<Flag> flags = {
      // --model comes first: the preset is the base the other model flags override.
      {"model", Kind::String, "model preset: tiny, tiny-moe, gpt2-124m, gpt2-124m-moe, gpt2-350m, gpt2-774m, gpt2-1.5b, gpt3-6.7b, "
       "tiny-llama, llama3-1b, llama3-8b, llama3-70b, mistral-7b, qwen2-0.5b, tiny-mixtral, mixtral-8x7b (docs/models.md)",
       [](TrainConfig& c, const json& v) {
         c.model = v.get<std::string>();
         c.gpt = GPTConfig::preset(c.model);
       }},
      {"n-layer", Kind::Int, "transformer blocks (overrides the preset)", model_field(&GPTConfig::n_layer)},
      {"n-head", Kind::Int, "attention heads", model_field(&GPTConfig::n_head)},
      {"n-kv-head", Kind::Int, "key/value heads (GQA; 1 = multi-query; default: n-head)", model_field(&GPTConfig::n_kv_head)},
      {"d-model", Kind::Int, "model width", model_field(&GPTConfig::d_model)},
      {"seq-len", Kind::Int, "context length", model_field(&GPTConfig::seq_len)},
      {"vocab-size", Kind::Int, "vocabulary size (padded to a multiple of 128; default: the preset's, or the data's tokenizer's where "
       "the preset's cannot hold its ids)", model_field(&GPTConfig::vocab_size)},
      {"dropout", Kind::Float, "dropout probability", model_field(&GPTConfig::dropout)},
      {"position", Kind::String, "position embedding: learned (GPT-2) | rope (rotary, the Llama family)", model_field(&GPTConfig::position)},
      {"rope-theta", Kind::Float, "rotary base", model_field(&GPTConfig::rope_theta)},
      {"rope-factor", Kind::Float, "Llama-3.1's rotary frequency scaling factor (0: none)", model_field(&GPTConfig::rope_factor)},
      {"rope-low-freq-factor", Kind::Float, "Llama-3.1's scaling: low_freq_factor", model_field(&GPTConfig::rope_low_freq_factor)},
      {"rope-high-freq-factor", Kind::Float, "Llama-3.1's scaling: high_freq_factor", model_field(&GPTConfig::rope_high_freq_factor)},
      {"rope-original-context", Kind::Int, "Llama-3.1's scaling: original_max_position_embeddings", model_field(&GPTConfig::rope_original_context)},
      {"norm", Kind::String, "layernorm | rmsnorm", model_field(&GPTConfig::norm)},
      {"norm-eps", Kind::Float, "the norms' epsilon", model_field(&GPTConfig::layer_norm_eps)},
      {"mlp", Kind::String, "feed-forward: gelu (GPT-2) | swiglu (the Llama family)", model_field(&GPTConfig::mlp)},
      {"ffn-hidden", Kind::Int, "feed-forward width (0: 4 x d-model for gelu, Llama's rule for swiglu)", model_field(&GPTConfig::ffn_hidden)},
      {"bias", Kind::String, "linear layers' biases: all (GPT-2) | none (Llama, Mistral) | qkv (Qwen2: query, key, value only)", model_field(&GPTConfig::bias)},
      {"tie-embeddings", Kind::Bool, "the output layer is the token embedding (false: an lm_head of its own)", model_field(&GPTConfig::tie_embeddings)},
      {"head-dim", Kind::Int, "the attention heads' width (default 0: d-model / n-head; Qwen3 gives it apart)", model_field(&GPTConfig::head_width)},
      {"sliding-window", Kind::Int, "Mistral's sliding window: a query sees the last W positions, itself included (default 0: every earlier one)", model_field(&GPTConfig::sliding_window)},
      {"qk-norm", Kind::Bool, "an RMSNorm over each query and key head before the rotary turn (Qwen3's q_norm, k_norm)", model_field(&GPTConfig::qk_norm)},
      {"n-experts", Kind::Int, "Mixture-of-Experts: experts per MoE layer (0: a dense model; docs/moe.md)", model_field(&GPTConfig::n_experts)},
      {"top-k", Kind::Int, "MoE: experts per token", model_field(&GPTConfig::top_k)},
      {"moe-every", Kind::Int, "MoE: an MoE layer in blocks 0, N, 2N, ... (dense MLP elsewhere)", model_field(&GPTConfig::moe_every)},
      {"moe-capacity-factor", Kind::Float, "MoE: assignments an expert takes per sequence, ceil(factor x k x T / E); past it they are dropped (0: dropless)",
       model_field(&GPTConfig::moe_capacity_factor)},
      {"moe-aux-loss-coef", Kind::Float, "MoE: weight of the load-balancing loss per MoE layer", model_field(&GPTConfig::moe_aux_loss_coef)},
      {"moe-z-loss-coef", Kind::Float, "MoE: weight of the router z-loss per MoE layer", model_field(&GPTConfig::moe_z_loss_coef)},
      {"data", Kind::List, "token shards: paths or quoted globs, comma-separated (default: synthetic corpus)", field(&TrainConfig::data)},
      {"data-format", Kind::String, "auto | shard (llm.c) | raw (uint16, nanoGPT train.bin)", field(&TrainConfig::data_format)},
      {"val-data", Kind::List, "evaluation shards (paths or globs)", field(&TrainConfig::val_data)},
      {"tokenizer", Kind::String, "the data's tokenizer.json, saved with every checkpoint (default: the tokenizer.json kiln prep "
       "wrote beside the --data files; byte-level for synthetic data)", field(&TrainConfig::tokenizer)},
      {"eval-every", Kind::Int, "steps between evaluations (0: after the last step only)", field(&TrainConfig::eval_every)},
      {"eval-batches", Kind::Int, "micro-batches per evaluation (0: the validation set once, its whole micro-batches)", field(&TrainConfig::eval_batches)},
      {"sample-every", Kind::Int, "steps between printed samples, as llm.c's (64 tokens from end-of-text, temperature 1, "
       "seeded by --seed and the step; 0: none)", field(&TrainConfig::sample_every)},
      {"synthetic-tokens", Kind::Int, "tokens in the synthetic corpus", field(&TrainConfig::synthetic_tokens)},
      {"micro-batch", Kind::Int, "sequences per micro-batch per rank", field(&TrainConfig::micro_batch)},
      {"grad-accum", Kind::Int, "micro-batches per optimizer step per rank", field(&TrainConfig::grad_accum)},
      {"steps", Kind::Int, "optimizer steps (0: build, log the config record, exit)", field(&TrainConfig::steps)},
      {"lr", Kind::Float, "peak learning rate", field(&TrainConfig::lr)},
      {"min-lr", Kind::Float, "final learning rate of the cosine (default: lr/10)", field(&TrainConfig::min_lr)},
      {"warmup", Kind::Int, "warm-up steps", field(&TrainConfig::warmup)},
      {"lr-schedule", Kind::String, "cosine | constant | warmup | warmup-decay | warmup-cosine (the last three: DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR)", field(&TrainConfig::lr_schedule)},
      {"warmup-type", Kind::String, "linear | log: DeepSpeed schedules' warm-up curve", field(&TrainConfig::warmup_type)},
      {"warmup-start-lr", Kind::Float, "DeepSpeed schedules: lr the warm-up starts from (warmup_min_lr)", field(&TrainConfig::warmup_start_lr)},
      {"lr-decay-steps", Kind::Int, "step at which the decay ends (default: --steps)", field(&TrainConfig::lr_decay_steps)},
      {"weight-decay", Kind::Float, "AdamW decoupled weight decay (matrices only)", field(&TrainConfig::weight_decay)},
      {"grad-clip", Kind::Float, "max global gradient norm (0: off)", field(&TrainConfig::grad_clip)},
      {"beta1", Kind::Float, "AdamW beta1", field(&TrainConfig::beta1)},
      {"beta2", Kind::Float, "AdamW beta2", field(&TrainConfig::beta2)},
      {"adam-eps", Kind::Float, "AdamW epsilon", field(&TrainConfig::adam_eps)},
      {"seed", Kind::Int, "seed of weights, data order and dropout", [](TrainConfig& c, const json& v) {
         if (v.get<int64_t>() < 0) throw ConfigError("--seed must be non-negative");
         c.seed = v.get<uint64_t>();
       }},
      {"device", Kind::String, "auto | cpu | cuda | cuda:N", field(&TrainConfig::device)},
      {"backend", Kind::String, "auto | nccl | mpi", field(&TrainConfig::backend)},
      {"comm-timeout", Kind::Float, "seconds a collective may take before the job is aborted", field(&TrainConfig::comm_timeout)},
      {"comm-init-timeout", Kind::Float, "the same for start-up and the first step", field(&TrainConfig::comm_init_timeout)},
      {"save-timeout", Kind::Float, "seconds the ranks wait while rank 0 writes or reads a checkpoint", field(&TrainConfig::save_timeout)},
      {"tp", Kind::Int, "tensor-parallel size", field(&TrainConfig::tp)},
      {"sp", Kind::Bool, "sequence parallelism in the tensor-parallel group (Megatron's SP; needs --tp 2+)", field(&TrainConfig::sp)},
      {"cp", Kind::Int, "context-parallel size: each sequence split over cp ranks (2 x cp must divide --seq-len)", field(&TrainConfig::cp)},
      {"ep", Kind::Int, "expert-parallel size: an MoE model's experts divided over ep data-parallel ranks, tokens moved by all-to-all (divides dp and --n-experts)", field(&TrainConfig::ep)},
      {"pp", Kind::Int, "pipeline-parallel size (1F1B; --grad-accum micro-batches per step)", field(&TrainConfig::pp)},
      {"pp-split", Kind::String, "blocks per pipeline stage, e.g. 4,4,3 (default: balanced by count, extras to the middle stages); per virtual stage under --pp-virtual", field(&TrainConfig::pp_split)},
      {"pp-virtual", Kind::Int, "model chunks a pipeline rank holds (interleaved 1F1B: the bubble shrinks V-fold; --grad-accum a multiple of --pp)", field(&TrainConfig::pp_virtual)},
      {"pp-schedule", Kind::String, "auto | 1f1b | interleaved | zb-h1 (default auto: interleaved when --pp-virtual > 1, else 1f1b; zb-h1: each backward split in input and weight passes, a third of 1F1B's bubble)", field(&TrainConfig::pp_schedule)},
      {"zero", Kind::Int, "ZeRO stage 0-3", field(&TrainConfig::zero)},
      {"offload", Kind::String, "none | optimizer (ZeRO 1-3) | all (ZeRO-3): optimizer state and step on the host; all: parameters too", field(&TrainConfig::offload)},
      {"offload-delayed-update", Kind::Bool, "with --offload optimizer: each step's host AdamW runs under the next step's forward and backward, its result reaching the weights one step late (ZeRO-Offload's delayed parameter update; every save, evaluation and sample publishes it first: docs/zero.md)", field(&TrainConfig::offload_delayed_update)},
      {"offload-delay-from", Kind::Int, "with --offload-delayed-update: the first N updates undelayed, the delay from update N + 1 on (ZeRO-Offload's paper waits a few dozen steps, while the gradients change fastest; default 0: from the first)", field(&TrainConfig::offload_delay_from)},
      {"zero-accum", Kind::String, "reduce | local: ZeRO-2/3 with --grad-accum > 1 reduce-scatters every micro-step, or accumulates a full local buffer and reduces once", field(&TrainConfig::zero_accum)},
      {"precision", Kind::String, "fp32 | bf16 | fp16 | fp8 (fp8: the blocks' linear layers in float8, the rest bf16; docs/precision.md)", field(&TrainConfig::precision)},
      {"fp8-recipe", Kind::String, "with --precision fp8: tensorwise (dynamic scaling, a scale per tensor) | rowwise (a scale per row of each product's operands)", field(&TrainConfig::fp8_recipe)},
      {"fp8-grad", Kind::String, "with --precision fp8: the output gradients' format, auto (e5m2 tensorwise, e4m3 rowwise) | e5m2 | e4m3", field(&TrainConfig::fp8_grad)},
      {"fp8-filter", Kind::String, "with --precision fp8: auto (default: leave the layer shapes torchao measured no gain for on an H100 in bf16) | all (every block layer whose dims are multiples of 16)", field(&TrainConfig::fp8_filter)},
      {"param-dtype", Kind::String, "working weights: auto | fp32 | bf16 | fp16 (default auto: the compute precision, so bf16 / fp16 "
       "runs keep 16-bit weights with fp32 masters in the optimizer state, sharded with it under ZeRO; fp32: autocast over fp32 weights)",
       field(&TrainConfig::param_dtype)},
      {"reduce-dtype", Kind::String, "the data-parallel gradient reduction (DDP's all-reduce, ZeRO's reduce-scatter): fp32 | bf16", field(&TrainConfig::reduce_dtype)},
      {"loss-scale", Kind::Float, "fp16 loss scale (0: dynamic)", field(&TrainConfig::loss_scale)},
      {"loss-scale-window", Kind::Int, "clean steps before the dynamic scale doubles", field(&TrainConfig::loss_scale_window)},
      {"initial-scale-power", Kind::Int, "initial dynamic scale 2^N", field(&TrainConfig::initial_scale_power)},
      {"hysteresis", Kind::Int, "overflows tolerated before the scale halves", field(&TrainConfig::hysteresis)},
      {"min-loss-scale", Kind::Float, "smallest dynamic scale", field(&TrainConfig::min_loss_scale)},
      {"activation-checkpointing", Kind::String, "none | full | selective", field(&TrainConfig::activation_checkpointing)},
      {"deterministic", Kind::Bool, "deterministic kernels (LibTorch's deterministic algorithms, cuBLAS's fixed workspace): on a GPU a replay from a checkpoint is bit-identical, at some cost in speed (docs/checkpoints.md)", field(&TrainConfig::deterministic)},
      {"kernels", Kind::String, "fused | reference (default fused): kiln's own CUDA kernels for the norms, SwiGLU and the loss's softmax, or the composite LibTorch ops they replace (the CPU always runs these; the config record's \"kernels\" says what ran)", field(&TrainConfig::kernels)},
      {"gelu-epilogue", Kind::Bool, "with --kernels fused on a GPU: the GELU feed-forward's bias and activation inside cuBLASLt's products (GELU_AUX_BIAS forward, DGELU backward; llm.c's GELU fusion), where the layer is whole (no tp) and selective recomputation is off; off by default until measured (docs/kernels.md)", field(&TrainConfig::gelu_epilogue)},
      {"cuda-graph", Kind::Bool, "on one GPU: the step captured as CUDA graphs at the run's third step and replayed from then on (the forward, backward, norm and verdict; the clip factor and AdamW, the rate read on the device) -- no launch gaps between kernels; one process, bf16 or fp32, ZeRO-0, no recomputation, no MoE (docs/kernels.md)", field(&TrainConfig::cuda_graph)},
      {"main-grads", Kind::String, "auto | always: with 16-bit working weights, fp32 main gradients always, or (auto, the default) only where there is something to accumulate or reduce -- at --grad-accum 1 with no data-parallel reduction and no pipeline, AdamW reads the 16-bit gradients as they are (the same update bit for bit; 2 bytes a parameter less, no zero fill, no add: docs/precision.md)", field(&TrainConfig::main_grads)},
      {"document-mask", Kind::Bool, "attention kept inside each document of a packed sample (documents open with the tokenizer's end-of-text token, as kiln prep writes them): a query sees the earlier tokens of its own document only (Llama 3's pretraining; packed fine-tuning examples); every layout (docs/data.md)", field(&TrainConfig::document_mask)},
      {"document-positions", Kind::String, "continue | restart: with --document-mask, rotary positions counted through the packed sample (default) or from 0 at every document's opening token (docs/data.md)", field(&TrainConfig::document_positions)},
      {"logits-dtype", Kind::String, "fp32 | bf16: the chunked loss's logits (default fp32: the products of the bf16 operands kept in fp32; bf16: rounded as autocast's linear and the PyTorch peers round them, half the bytes of the loss's passes -- an A/B for the GPU: docs/kernels.md)", field(&TrainConfig::logits_dtype)},
      {"loss-chunk-rows", Kind::Int, "rows per chunk of the output layer + cross-entropy (0: 256 MiB of fp32 logits; -1: the plain whole-logits way, to compare)", field(&TrainConfig::loss_chunk_rows)},
      {"on-nonfinite", Kind::String, "stop | skip: a non-finite loss or gradient norm (bf16, fp32) stops the run, or skips the step", field(&TrainConfig::on_nonfinite)},
      {"spike-rollback", Kind::Float, "Z: when the loss is Z running standard deviations above its running mean for --spike-patience steps, reload the last checkpoint before it in place and skip the data since (0: off)", field(&TrainConfig::spike_rollback)},
      {"spike-patience", Kind::Int, "spiking steps in a row that trigger --spike-rollback (default 2)", field(&TrainConfig::spike_patience)},
      {"max-rollbacks", Kind::Int, "the most --spike-rollback rollbacks a run makes, resumes included; the next spike ends it with exit 4 (default 5)", field(&TrainConfig::max_rollbacks)},
      {"async-save", Kind::Bool, "write checkpoints in the background (default true): the steps stall only for a copy of each rank's state into host memory; --async-save=false: every rank waits for the write (runtime/checkpoint/async_save.h)", field(&TrainConfig::async_save)},
      {"check-replicas", Kind::Int, "every N steps and before every save, the data-parallel replicas compare a hash of each weight; a mismatch (silent data corruption) ends the job (exit 4) naming the ranks and the tensor (0: never)", field(&TrainConfig::check_replicas)},
      {"straggler-factor", Kind::Float, "the summary names any rank whose median compute time a step is over this many times its pipeline stage's median (default 1.2)", field(&TrainConfig::straggler_factor)},
      {"max-skipped-steps", Kind::Int, "with --on-nonfinite skip: this many non-finite steps in a row end the run (exit 4, nothing saved), naming the rank and parameter it came from", field(&TrainConfig::max_skipped_steps)},
      {"save-dir", Kind::String, "checkpoint directory (none by default: a run without it saves nothing to resume or sample)", field(&TrainConfig::save_dir)},
      {"save-every", Kind::Int, "steps between checkpoints (0: only after the last step)", field(&TrainConfig::save_every)},
      {"stop-at-step", Kind::Int, "end this invocation after step N (checkpointed with --save-dir); the schedule still spans --steps (0: run to --steps)", field(&TrainConfig::stop_at_step)},
      {"keep-last", Kind::Int, "checkpoints kept in --save-dir (older ones are deleted; 0: keep all)", field(&TrainConfig::keep_last)},
      {"keep-best", Kind::Bool, "save a checkpoint at every new lowest val loss, name it in --save-dir's 'best', and never delete it", field(&TrainConfig::keep_best)},
      {"early-stop", Kind::Int, "end the run after N evaluations without a lower val loss (0: never)", field(&TrainConfig::early_stop)},
      {"resume", Kind::String, "auto (latest in --save-dir, if any) | none | PATH (a checkpoint or a save dir)", field(&TrainConfig::resume)},
      {"init-from", Kind::String, "start from the weights of DIR (a Hugging Face GPT-2, Llama, Mistral, Qwen2 or Mixtral directory, or a kiln checkpoint; the shape from its config.json), fresh optimizer, step 0", field(&TrainConfig::init_from)},
      {"log-json", Kind::String, "JSONL log file (rank 0)", field(&TrainConfig::log_json)},
      {"tensorboard", Kind::String, "TensorBoard directory: the log's scalars as an event file (rank 0)", field(&TrainConfig::tensorboard)},
      {"log-every", Kind::Int, "console line every N steps", field(&TrainConfig::log_every)},
      {"allow-config-change", Kind::Bool, "resume even when the data, seed, global batch, optimizer or precision differ from the checkpoint's (listed in the config record)", field(&TrainConfig::allow_config_change)},
      {"stop-signals", Kind::List, "signals that stop the run after the step under way, save and exit 75 (INT,TERM,USR1; '' for none)", field(&TrainConfig::stop_signals)},
      {"max-wall-time", Kind::Float, "seconds: stop and save before the run would pass this time (0: no limit)", field(&TrainConfig::max_wall_time)},
      {"peak-tflops", Kind::Float, "peak TFLOP/s of one device for MFU, on the CPU of one rank's share of the cores (default: from the device table)", field(&TrainConfig::peak_tflops)},
      {"device-memory-cap-gb", Kind::Float, "CUDA: let this process's allocator hold at most this many GB, as on a smaller GPU (0: no cap)", field(&TrainConfig::device_memory_cap_gb)},
      {"profile", Kind::String, "write a Chrome trace of --profile-steps steps (PyTorch's profiler: host operators, CUDA kernels) and print the top costs", field(&TrainConfig::profile)},
      {"profile-start", Kind::Int, "the profiled window's first step (0: this invocation's third)", field(&TrainConfig::profile_start)},
      {"profile-steps", Kind::Int, "steps in the profiled window", field(&TrainConfig::profile_steps)},
  };
  return flags;
}

// Other tools' names for kiln train's settings, as a --config file (or a flag) written for them
// spells them ('-' for '_'): the Hugging Face Trainer's TrainingArguments, nanoGPT's train.py
// globals, torchtitan's TOML keys (without their section) and Hugging Face model configs
// (config.json). Suggested for an unknown key or flag before edit distance, which cannot find
// 'lr' from 'learning_rate'. Names that are kiln's too (weight_decay, dropout, seed) need none.
const std::map<std::string, std::string>& foreign_names() {
  static const std::map<std::string, std::string> names = {
      // Hugging Face Trainer
      {"learning-rate", "lr"}, {"max-steps", "steps"}, {"warmup-steps", "warmup"},
      {"per-device-train-batch-size", "micro-batch"}, {"per-device-eval-batch-size", "micro-batch"},
      {"gradient-accumulation-steps", "grad-accum"}, {"max-grad-norm", "grad-clip"}, {"adam-beta1", "beta1"},
      {"adam-beta2", "beta2"}, {"adam-epsilon", "adam-eps"}, {"lr-scheduler-type", "lr-schedule"},
      {"logging-steps", "log-every"}, {"save-steps", "save-every"}, {"eval-steps", "eval-every"},
      {"output-dir", "save-dir"}, {"save-total-limit", "keep-last"}, {"gradient-checkpointing", "activation-checkpointing"},
      {"resume-from-checkpoint", "resume"}, {"model-name-or-path", "init-from"}, {"train-file", "data"},
      {"validation-file", "val-data"}, {"bf16", "precision"}, {"fp16", "precision"}, {"max-seq-length", "seq-len"},
      // nanoGPT
      {"batch-size", "micro-batch"}, {"block-size", "seq-len"}, {"n-embd", "d-model"}, {"max-iters", "steps"},
      {"warmup-iters", "warmup"}, {"lr-decay-iters", "lr-decay-steps"}, {"eval-interval", "eval-every"},
      {"eval-iters", "eval-batches"}, {"log-interval", "log-every"}, {"out-dir", "save-dir"}, {"dtype", "precision"},
      {"dataset", "data"},
      // torchtitan
      {"local-batch-size", "micro-batch"}, {"max-norm", "grad-clip"}, {"tensor-parallel-degree", "tp"},
      {"pipeline-parallel-degree", "pp"}, {"context-parallel-degree", "cp"}, {"expert-parallel-degree", "ep"},
      {"log-freq", "log-every"}, {"mixed-precision-param", "param-dtype"}, {"mixed-precision-reduce", "reduce-dtype"},
      {"flavor", "model"}, {"eps", "adam-eps"},
      // Hugging Face model configs
      {"num-hidden-layers", "n-layer"}, {"num-layers", "n-layer"}, {"hidden-size", "d-model"},
      {"num-attention-heads", "n-head"}, {"num-key-value-heads", "n-kv-head"}, {"max-position-embeddings", "seq-len"},
      {"n-positions", "seq-len"}, {"n-ctx", "seq-len"}, {"intermediate-size", "ffn-hidden"}, {"rms-norm-eps", "norm-eps"},
      {"layer-norm-epsilon", "norm-eps"}, {"num-local-experts", "n-experts"}, {"num-experts", "n-experts"},
      {"num-experts-per-tok", "top-k"}, {"tie-word-embeddings", "tie-embeddings"},
  };
  return names;
}

// The same as flags: "--learning-rate" -> "--lr".
const std::map<std::string, std::string>& foreign_flags() {
  static const std::map<std::string, std::string> flags = [] {
    std::map<std::string, std::string> m;
    for (const auto& [theirs, ours] : foreign_names()) m["--" + theirs] = "--" + ours;
    return m;
  }();
  return flags;
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Int: return "an integer";
    case Kind::Float: return "a number";
    case Kind::String: return "a string";
    case Kind::List: return "a list of strings";
    case Kind::Bool: return "true or false";
  }
  return "?";
}

// A flag's text value as typed JSON; throws ConfigError naming the flag.
json typed_from_text(const Flag& f, const std::string& text) {
  try {
    size_t used = 0;
    switch (f.kind) {
      case Kind::Int: {
        long long v = std::stoll(text, &used);
        if (used != text.size()) break;
        return json(static_cast<int64_t>(v));
      }
      case Kind::Float: {
        double v = std::stod(text, &used);
        if (used != text.size()) break;
        return json(v);
      }
      case Kind::String: return json(text);
      case Kind::Bool:
        if (text == "true" || text == "1") return json(true);
        if (text == "false" || text == "0") return json(false);
        break;
      case Kind::List: {
        json list = json::array();
        size_t start = 0;
        while (start <= text.size()) {
          size_t comma = text.find(',', start);
          if (comma == std::string::npos) comma = text.size();
          if (comma > start) list.push_back(text.substr(start, comma - start));
          start = comma + 1;
        }
        return list;
      }
    }
  } catch (const std::exception&) {
  }
  throw ConfigError("--" + f.name + ": '" + text + "' is not " + kind_name(f.kind));
}

// A config-file value, checked against the flag's type; throws ConfigError naming the key.
json typed_from_json(const Flag& f, const json& v, const std::string& file) {
  const bool ok = (f.kind == Kind::Int && v.is_number_integer()) || (f.kind == Kind::Bool && v.is_boolean()) ||
                  (f.kind == Kind::Float && v.is_number()) || (f.kind == Kind::String && v.is_string()) ||
                  (f.kind == Kind::List && (v.is_string() || (v.is_array() && std::all_of(v.begin(), v.end(),
                                                                  [](const json& e) { return e.is_string(); }))));
  if (!ok) throw ConfigError(file + ": key '" + f.name + "' must be " + kind_name(f.kind) + " (got " + v.dump() + ")");
  if (f.kind == Kind::Float) return json(v.get<double>());
  if (f.kind == Kind::List && v.is_string()) return typed_from_text(f, v.get<std::string>());
  return v;
}

std::string normalise_key(std::string key) {
  for (auto& ch : key)
    if (ch == '_') ch = '-';
  return key;
}

json read_config_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError("--config " + path + ": cannot open the file");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    throw ConfigError("--config " + path + ": malformed JSON: " + e.what());
  }
  if (!j.is_object()) throw ConfigError("--config " + path + ": must hold a JSON object of settings");
  return j;
}

// The flags given on the command line over `values` (settings from a file), then all of them set
// on `config` in table order (--model before the fields it seeds). A preset's n_kv_head follows
// --n-head unless --n-kv-head is given.
void apply_flags(const cxxopts::ParseResult& result, std::map<std::string, json>& values, TrainConfig& config) {
  for (const auto& f : train_flags())
    if (result.count(f.name)) values[f.name] = typed_from_text(f, result[f.name].as<std::string>());
  for (const auto& f : train_flags()) {
    auto it = values.find(f.name);
    if (it == values.end()) continue;
    f.set(config, it->second);
    if (f.name == "n-head" && !values.count("n-kv-head")) config.gpt.n_kv_head = config.gpt.n_head;
  }
}

// --vocab-size left out (no flag, config key or --init-from set it): where the data's tokenizer
// (--tokenizer, or the tokenizer.json kiln prep wrote beside the --data files) has more ids than
// the preset's vocabulary holds, the model takes the tokenizer's size -- as nanoGPT reads its
// vocabulary from the data's meta file -- rather than refusing the data (the default model held
// 512 ids, and no BPE). The embedding pads it to a multiple of 128 itself (padded_vocab_size). A
// preset already large enough keeps its own size: the runs and checkpoints made with it stay
// as they were. Data files that are missing are the trainer's to name.
void take_vocab_from_tokenizer(TrainConfig& config) {
  std::vector<std::string> files;
  try {
    if (!config.data.empty()) files = expand_paths(config.data, "--data");
  } catch (const DataError&) {
    return;
  }
  const DataTokenizer t = find_data_tokenizer(config.tokenizer, files);
  if (!t.tokenizer || t.tokenizer->vocab_size() <= config.gpt.vocab_size) return;
  config.gpt.vocab_size = t.tokenizer->vocab_size();
  config.vocab_from = t.source;
}

}  // namespace

TrainArgs parse_train_args(const std::vector<std::string>& args, int world_size) {
  cxxopts::Options opts("kiln train", "Train a GPT model.");
  opts.add_options()("h,help", "show this help")("config", "JSON file of settings (keys = flag names)",
                                                 cxxopts::value<std::string>())(
      "deepspeed", "a DeepSpeed JSON config (its keys mapped to these flags; flags override it; docs/deepspeed.md)",
      cxxopts::value<std::string>());
  // Each flag's help ends with its default (a default TrainConfig with the tiny preset), unless
  // it has none to show or says it itself.
  const json defaults = TrainConfig().to_json();
  for (const auto& f : train_flags()) {
    std::string help = f.help;
    std::string key = f.name;
    for (auto& ch : key)
      if (ch == '-') ch = '_';
    if (help.find("default") == std::string::npos && defaults.contains(key)) {
      const json& d = defaults.at(key);
      std::string text;
      if (d.is_string()) text = d.get<std::string>();
      else if (d.is_array()) for (const auto& e : d) text += (text.empty() ? "" : ",") + e.get<std::string>();
      else text = d.dump();
      if (!text.empty()) help += " (default: " + text + ")";
    }
    if (f.kind == Kind::Bool) opts.add_options()(f.name, help, cxxopts::value<std::string>()->implicit_value("true"));
    else opts.add_options()(f.name, help, cxxopts::value<std::string>());
  }
  auto result = parse_or_throw(opts, args, "train", "lists are comma-separated; quote globs", foreign_flags());

  TrainArgs out;
  if (result.count("help")) {
    out.help = true;
    out.help_text = opts.help();
    return out;
  }

  // Gather every setting as typed JSON: config file first, flags over it.
  std::map<std::string, json> values;
  std::map<std::string, const Flag*> by_name;
  for (const auto& f : train_flags()) by_name[f.name] = &f;
  if (result.count("config")) {
    const std::string path = result["config"].as<std::string>();
    const json file = read_config_file(path);
    // Every unknown key in one line, each with the suggestion a flag gets (another tool's name
    // for it, or the nearest), spelt as the file spells its keys.
    std::vector<std::string> names;
    for (const auto& f : train_flags()) names.push_back(f.name);
    std::vector<std::pair<std::string, std::string>> unknown;
    for (const auto& [key, v] : file.items()) {
      if (by_name.count(normalise_key(key))) continue;
      std::string hint = did_you_mean(normalise_key(key), names, foreign_names());
      if (key.find('_') != std::string::npos) std::replace(hint.begin(), hint.end(), '-', '_');
      unknown.emplace_back(key, hint);
    }
    if (!unknown.empty()) throw ConfigError("--config " + path + ": " + unknown_names("unknown key", "unknown keys", unknown));
    for (const auto& [key, v] : file.items()) {
      const auto it = by_name.find(normalise_key(key));
      values[it->first] = typed_from_json(*it->second, v, "--config " + path);
    }
  }
  // A DeepSpeed config over the --config file; a flag given overrides it (with a notice), except
  // a layout or precision flag that contradicts it (refused).
  std::optional<DeepSpeedSettings> ds;
  if (result.count("deepspeed")) {
    ds = read_deepspeed_config(result["deepspeed"].as<std::string>());
    for (const auto& [flag, v] : ds->values) {
      auto it = by_name.find(flag);
      if (it == by_name.end()) throw std::logic_error("deepspeed mapping names no flag '" + flag + "'");
      if (result.count(flag)) {
        const std::string text = result[flag].as<std::string>();
        if (typed_from_text(*it->second, text) != v) {
          const std::string what = ds->from.at(flag) + " (" + v.dump() + ")";
          if (deepspeed_structural_flag(flag)) {
            throw ConfigError("--" + flag + " " + text + " contradicts --deepspeed " + ds->path + "'s " + what +
                              ": remove one of them");
          }
          ds->notices.push_back("--" + flag + " " + text + " overrides " + what);
        }
      }
      values[flag] = v;
    }
  }
  apply_flags(result, values, out.config);
  apply_init_from(values, out.config);  // --init-from DIR: the shape from DIR/config.json (runtime/checkpoint/init_from.h)
  if (!values.count("vocab-size") && out.config.init_from.empty()) take_vocab_from_tokenizer(out.config);
  if (ds) {
    std::set<std::string> given;
    for (const auto& f : train_flags())
      if (result.count(f.name)) given.insert(f.name);
    finish_deepspeed(*ds, given, world_size, out.config);
  }
  out.config.validate();
  return out;
}

TrainArgs parse_eval_args(const std::vector<std::string>& args) {
  cxxopts::Options opts("kiln eval", "Evaluate a checkpoint: validation loss and perplexity, on any layout.");
  opts.add_options()("h,help", "show this help")("checkpoint", "a checkpoint directory, or a save dir (its latest)",
                                                 cxxopts::value<std::string>());
  // Every kiln train flag is accepted; --help shows those an evaluation is about (it listed all ~80).
  static const std::set<std::string> shown = {"val-data", "data-format", "eval-batches", "micro-batch", "seed",
                                              "device", "precision", "tp", "pp", "backend", "log-json", "comm-timeout"};
  for (const auto& f : train_flags()) {
    const std::string group = shown.count(f.name) ? "" : "train";
    if (f.kind == Kind::Bool) opts.add_options(group)(f.name, f.help, cxxopts::value<std::string>()->implicit_value("true"));
    else opts.add_options(group)(f.name, f.help, cxxopts::value<std::string>());
  }
  auto result = parse_or_throw(opts, args, "eval", "lists are comma-separated; quote globs", foreign_flags());
  TrainArgs out;
  if (result.count("help")) {
    out.help = true;
    out.help_text = opts.help({""}) +
                    "\nEvery other kiln train flag is accepted too (kiln train --help lists them); each setting is the\n"
                    "checkpoint's own unless given.\n";
    return out;
  }
  if (!result.count("checkpoint")) throw ConfigError("kiln eval: give --checkpoint DIR (a checkpoint, or a save dir)");
  const std::string given_dir = result["checkpoint"].as<std::string>();
  {
    // A Hugging Face GPT-2 directory (save_pretrained's config.json and model.safetensors, no kiln
    // state): its weights through --init-from's path (runtime/checkpoint/init_from.h) at step 0 --
    // a pretrained model's perplexity before fine-tuning. The flags given are the settings.
    if (is_hf_model_dir(given_dir)) {
      std::map<std::string, json> values;
      apply_flags(result, values, out.config);
      if (out.config.val_data.empty()) {
        throw ConfigError("kiln eval: " + given_dir + " is a Hugging Face model directory, with no run to take --val-data from: "
                          "give --val-data FILES (paths or quoted globs)");
      }
      out.config.init_from = given_dir;
      out.config.resume = "none";
      out.config.save_dir.clear();
      out.config.log_every = 1;
      apply_init_from(values, out.config, "--checkpoint");
      out.config.data = out.config.val_data;  // the training data is not read
      out.config.steps = 1;
      out.config.validate();
      return out;
    }
  }
  const std::string dir = resolve_checkpoint_dir(given_dir, "kiln eval");
  std::ifstream in(std::filesystem::path(dir) / "trainer_state.json");
  if (!in) throw ConfigError("kiln eval: cannot read " + dir + "/trainer_state.json");
  json state;
  try {
    state = json::parse(in);
  } catch (const json::parse_error& e) {
    throw ConfigError("kiln eval: " + dir + "/trainer_state.json: malformed JSON: " + e.what());
  }
  const json saved = state.contains("run") && state["run"].is_object() ? state["run"].value("config", json::object()) : json::object();
  const int64_t step = state.value("step", int64_t{0});

  // The checkpoint's settings (those that are flags), then the flags given.
  std::map<std::string, json> values;
  std::map<std::string, const Flag*> by_name;
  for (const auto& f : train_flags()) by_name[f.name] = &f;
  for (const auto& [key, v] : saved.items()) {
    auto it = by_name.find(normalise_key(key));
    if (it == by_name.end() || v.is_null()) continue;
    try {
      values[it->first] = typed_from_json(*it->second, v, dir + "/trainer_state.json");
    } catch (const ConfigError&) {
      // A setting this version reads differently: the default, or the flag given below.
    }
  }
  // Nothing of the training run's bookkeeping: no log, no saving, no stop, no resume policy. The
  // working weights follow the evaluation's precision (auto) unless given: the checkpoint holds
  // fp32 masters, whatever the run computed with.
  for (const char* k : {"log-json", "save-dir", "save-every", "stop-at-step", "keep-last", "keep-best", "early-stop", "resume", "max-wall-time", "steps", "sample-every", "init-from", "tokenizer", "tensorboard", "param-dtype"})
    values.erase(k);
  apply_flags(result, values, out.config);
  if (out.config.val_data.empty()) {
    throw ConfigError("kiln eval: the checkpoint's run had no --val-data; give --val-data FILES (paths or quoted globs)");
  }
  // The training data is not read; pointing the loader at the validation files keeps a moved or
  // deleted training set from failing the evaluation.
  out.config.data = out.config.val_data;
  out.config.steps = std::max<int64_t>(step, 1);
  out.config.resume = dir;
  out.config.allow_config_change = true;
  out.config.validate();
  return out;
}

PrepArgs parse_prep_args(const std::vector<std::string>& args) {
  cxxopts::Options opts("kiln prep",
                        "Turn text or JSONL files into llm.c token shards, with the tokenizer beside them (tokenizer.json).\n"
                        "Byte-level by default; a byte-level BPE (GPT-2's kind) with --tokenizer or --vocab/--merges.");
  opts.add_options()("h,help", "show this help")("out", "output directory", cxxopts::value<std::string>())(
      "input", "text or JSONL files, comma-separated (a text file: one document, or several with --separator; a .jsonl file: one per line)", cxxopts::value<std::string>())(
      "input-format", "auto (.jsonl: jsonl, else text) | text | jsonl (default: auto)", cxxopts::value<std::string>())(
      "jsonl-field", "the JSONL field holding a document's text (default: text; under --chat, a conversation's messages: messages)", cxxopts::value<std::string>())(
      "chat", "inputs are chat JSONL ({\"messages\": [{\"role\", \"content\"}, ...]} a line): each conversation through the tokenizer's chat template, "
              "and beside every shard a mask of the tokens trained on (the assistant's turns; docs/data.md)")(
      "chat-template", "with --chat: a Jinja chat template file instead of the tokenizer's own (tokenizer_config.json or chat_template.jinja beside it)",
      cxxopts::value<std::string>())(
      "separator", "text files: documents end where this text stands, e.g. '<|endoftext|>' (default: none, one per file)", cxxopts::value<std::string>())(
      "shard-tokens", "tokens per train shard (default 100000000, llm.c's)", cxxopts::value<std::string>())(
      "val-tokens", "tokens in the validation shard val_000000.bin, the corpus's first (default 0: none)", cxxopts::value<std::string>())(
      "tokenizer", "a Hugging Face tokenizer.json (byte-level BPE with <|endoftext|>) to encode with", cxxopts::value<std::string>())(
      "vocab", "GPT-2-style vocab.json (with --merges), instead of --tokenizer", cxxopts::value<std::string>())(
      "merges", "GPT-2-style merges.txt (with --vocab)", cxxopts::value<std::string>());
  auto result = parse_or_throw(opts, args, "prep", "lists are comma-separated; quote globs");
  PrepArgs out;
  if (result.count("help")) {
    out.help = true;
    out.help_text = opts.help();
    return out;
  }
  auto integer = [&](const char* name) {
    Flag f{name, Kind::Int, "", nullptr};
    return typed_from_text(f, result[name].as<std::string>()).get<int64_t>();
  };
  if (!result.count("out")) throw ConfigError("kiln prep: --out DIR is required");
  if (!result.count("input")) throw ConfigError("kiln prep: --input FILE[,FILE...] is required");
  out.config.out_dir = result["out"].as<std::string>();
  Flag list{"input", Kind::List, "", nullptr};
  out.config.inputs = typed_from_text(list, result["input"].as<std::string>()).get<std::vector<std::string>>();
  if (result.count("shard-tokens")) out.config.shard_tokens = integer("shard-tokens");
  if (result.count("input-format")) out.config.input_format = result["input-format"].as<std::string>();
  if (result.count("jsonl-field")) out.config.jsonl_field = result["jsonl-field"].as<std::string>();
  if (result.count("separator")) out.config.separator = result["separator"].as<std::string>();
  if (result.count("val-tokens")) out.config.val_tokens = integer("val-tokens");
  if (result.count("tokenizer")) out.config.tokenizer = result["tokenizer"].as<std::string>();
  if (result.count("vocab")) out.config.vocab = result["vocab"].as<std::string>();
  if (result.count("merges")) out.config.merges = result["merges"].as<std::string>();
  out.config.chat = result.count("chat") > 0;
  if (result.count("chat-template")) out.config.chat_template = result["chat-template"].as<std::string>();
  return out;
}

}  // namespace kiln
