// runtime/trainer/train_config.h -- everything a `kiln train` run is configured by, validated once.
//
// Filled by launch/cli.cpp from defaults, then the --model preset, then a --config JSON file,
// then flags (each later source overrides). validate() checks the whole once; the trainer
// trusts it afterwards. Field names are the flag names with '-' written '_'.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/gpt_config.h"

namespace kiln {

struct TrainConfig {
  // ---- model
  std::string model = "tiny";  // preset name; --n-layer ... override its fields
  GPTConfig gpt = GPTConfig::preset("tiny");

  // ---- data
  std::vector<std::string> data;       // shard paths / globs; empty = built-in synthetic corpus
  std::string data_format = "auto";    // auto | shard | raw (raw = nanoGPT uint16 .bin)
  std::vector<std::string> val_data;   // evaluation shards; empty = no evaluation
  std::string tokenizer;               // tokenizer.json of the data; empty = the one beside --data (data/tokenizer.h)
  std::string vocab_from;              // the tokenizer.json gpt.vocab_size was taken from (no --vocab-size given, and
                                       // the preset's too small for it; launch/cli.cpp); empty: not. Said at start-up
                                       // only: the record's vocab_size and tokenizer say the rest
  int64_t eval_every = 0;              // steps between evaluations; 0 = only after the last step
  int64_t eval_batches = 8;            // micro-batches per evaluation (0: the validation set once)
  int64_t sample_every = 0;            // steps between printed samples (llm.c's; runtime/inference/generate.h); 0 = none
  int64_t synthetic_tokens = 1 << 22;  // size of the synthetic corpus, tokens

  // ---- batch and schedule
  int64_t micro_batch = 8;  // sequences per micro-batch per rank
  int64_t grad_accum = 1;   // micro-batches per optimizer step per rank
  int64_t steps = 300;      // optimizer steps, counted from the start of training
  double lr = 1e-3;         // peak learning rate
  double min_lr = -1.0;     // cosine floor; negative = lr / 10
  int64_t warmup = 20;      // linear warm-up steps
  std::string lr_schedule = "cosine";  // cosine | constant | warmup | warmup-decay | warmup-cosine (optim/lr_schedule.h)
  std::string warmup_type = "linear";  // linear | log (DeepSpeed's schedules only)
  double warmup_start_lr = 0.0;        // lr before the warm-up (DeepSpeed's warmup_min_lr; its schedules only)
  int64_t lr_decay_steps = 0;          // update at which the decay ends; 0 = --steps
  double weight_decay = 0.1;
  double grad_clip = 1.0;   // max global gradient norm; 0 = no clipping
  double beta1 = 0.9, beta2 = 0.95, adam_eps = 1e-8;
  uint64_t seed = 1337;     // weights, data order and dropout all derive from it

  // ---- where and how
  std::string device = "auto";   // auto | cpu | cuda | cuda:N
  std::string backend = "auto";  // auto | nccl | mpi
  double comm_timeout = 300.0;       // seconds a collective may take before the job is aborted
  double comm_init_timeout = 900.0;  // the same, for start-up and the first step
  double save_timeout = 1800.0;      // seconds the other ranks wait while rank 0 writes or reads a
                                     // checkpoint (collectives of a save or load, not --comm-timeout)
  int64_t tp = 1, pp = 1;        // tensor / pipeline parallel sizes; dp = world / (cp tp pp)
  bool sp = false;               // sequence parallelism in the tp group (parallel/sequence_parallel.h)
  int64_t cp = 1;                // context-parallel size: each sequence split over cp ranks
  int64_t ep = 1;                // expert-parallel size: MoE experts divided over ep dp ranks (parallel/expert_parallel.h)
  std::string pp_split;          // blocks per pipeline stage, "4,4,3"; empty = balanced by count
                                 // (per virtual stage under --pp-virtual: pp x V counts)
  int64_t pp_virtual = 1;        // model chunks a pipeline rank holds (the interleaved schedule)
  std::string pp_schedule = "auto";  // auto (1f1b; interleaved when --pp-virtual > 1) | 1f1b | interleaved | zb-h1
  int64_t zero = 0;              // ZeRO stage 0..3
  std::string offload = "none";  // none | optimizer (ZeRO 1-3) | all (ZeRO-3)
  std::string zero_accum = "reduce";  // ZeRO-2/3 gradient accumulation: reduce | local
  bool offload_delayed_update = false;
  int64_t offload_delay_from = 0;  // with it: the first N updates undelayed (ZeRO-Offload's warm-up before the delay)  // offload optimizer: the host update one step late, under the next step's compute (parallel/zero.h)
  std::string precision = "fp32";             // fp32 | bf16 | fp16
  std::string param_dtype = "auto";           // working weights: auto (= precision) | fp32 | bf16 | fp16 (docs/precision.md)
  std::string reduce_dtype = "fp32";          // the dp gradient reduction: fp32 | bf16 (parallel/ddp.h, parallel/zero.h)
  double loss_scale = 0.0;                    // fp16: 0 = dynamic, else static
  int64_t loss_scale_window = 1000;           // clean steps before the scale doubles
  int64_t initial_scale_power = 16;           // initial dynamic scale 2^N
  int64_t hysteresis = 2;                     // overflows tolerated before the scale halves
  double min_loss_scale = 1.0;                // smallest dynamic scale
  std::string activation_checkpointing = "none";  // none | full | selective
  std::string on_nonfinite = "stop";          // bf16/fp32 non-finite loss or norm: stop | skip
  double spike_rollback = 0;                  // Z: a loss Z running std above its running mean, --spike-patience steps in a row, rolls back (0: off)
  int64_t spike_patience = 2;                 // spiking steps in a row that make a spike
  int64_t max_rollbacks = 5;                  // spike rollbacks a run may make (checkpoints carry the count); one more ends it (exit 4)
  bool async_save = true;                     // saves written by a background thread; the steps stall for a host copy (false: synchronous)
  int64_t check_replicas = 0;                 // every N steps and before saves: the replicas' weights compared (0: never)
  double straggler_factor = 1.2;              // the summary names ranks whose median compute is over this x their stage's
  int64_t max_skipped_steps = 10;             // bf16/fp32 with skip: this many skipped steps in a row end the run
  int64_t loss_chunk_rows = 0;  // output layer + loss in chunks of rows: 0 = by size, -1 = whole logits (plain)
  bool document_mask = false;  // attention within documents only (each opened by the tokenizer's eot: models/gpt.h)
  std::string document_positions = "continue";  // continue | restart: rotary positions from 0 at every document (with document_mask)
  std::string logits_dtype = "fp32";  // the chunked loss's logits: fp32 | bf16 (bf16 compute; models/linear_cross_entropy.h)
  // --precision fp8 (kernels/float8.h, docs/precision.md): the recipe (tensorwise | rowwise), the
  // output gradient's format (auto: e5m2 under tensorwise as torchao's default, e4m3 under rowwise
  // as torchtitan's rowwise recipe; e5m2 | e4m3), and which block layers: auto (torchao's H100 size
  // filter) or all (every one whose dims are multiples of 16).
  std::string fp8_recipe = "tensorwise";
  std::string fp8_grad = "auto";
  std::string fp8_filter = "auto";
  bool deterministic = false;   // deterministic kernels: GPU replay bit-identical (distributed/device.h)
  std::string kernels = "fused";  // fused | reference: kiln's CUDA kernels or the composite ops (kernels/kernel_choice.h)
  bool gelu_epilogue = false;     // with kernels fused: GELU's bias + activation inside cuBLASLt's products (kernels/gelu_mlp.h)
  bool cuda_graph = false;  // the step as two CUDA graphs, captured at the run's third step (runtime/trainer/trainer_graph.cpp)
  std::string main_grads = "auto";  // 16-bit working weights: auto (fp32 main grads only where there is something to
                                    // accumulate or reduce; else AdamW reads the 16-bit gradients: optim/adamw.h) | always

  // ---- checkpoints and logs
  std::string save_dir;        // empty = no checkpoints
  int64_t save_every = 0;      // steps between checkpoints; 0 = only at the end
  int64_t keep_last = 3;       // checkpoints kept in save_dir; 0 = all
  bool keep_best = false;      // save at each new lowest val loss, name it in save_dir/best, never delete it
  int64_t early_stop = 0;      // end the run after this many evaluations without a lower val loss; 0 = never
  int64_t stop_at_step = 0;    // end this invocation after this step (a time-limited job); 0 = at steps
  std::string resume = "auto"; // auto (latest in save_dir, if any) | none | PATH
  std::string init_from;       // HF GPT-2 or kiln checkpoint dir: its weights, fresh optimizer (runtime/checkpoint/init_from.h); empty = none
  std::string log_json;        // JSONL log path; empty = none
  std::string tensorboard;     // TensorBoard event directory (runtime/observe/tensorboard.h); empty = none
  int64_t log_every = 1;       // console line every N steps
  double peak_tflops = 0.0;    // one device's peak for MFU, TFLOP/s (CPU: one rank's share); 0 = from the device table
  bool allow_config_change = false;  // resume even when a setting that breaks the replay changed

  // ---- stopping cleanly (runtime/trainer/stop_requests.h)
  std::vector<std::string> stop_signals{"INT", "TERM", "USR1"};  // signals that stop after the step and save
  double max_wall_time = 0.0;  // seconds: stop and save before the run would pass it; 0 = no limit
  double device_memory_cap_gb = 0.0;  // CUDA: cap this process's allocator at this many GB; 0 = none

  // ---- profiling (runtime/observe/profiler.h)
  std::string profile;         // Chrome trace of a window of steps; empty = none
  int64_t profile_start = 0;   // the window's first step (1-based); 0 = this invocation's third step
  int64_t profile_steps = 3;   // steps in the window

  // ---- a DeepSpeed config file (launch/deepspeed_config.h)
  std::string deepspeed;          // --deepspeed FILE; empty = none
  nlohmann::json deepspeed_used;  // what the file set: {"file", "auto": {key: value used}, "notices": [...]}

  double resolved_min_lr() const { return min_lr < 0.0 ? lr / 10.0 : min_lr; }
  // The working weights' dtype: --param-dtype, or by default ("auto") the compute precision --
  // 16-bit weights with fp32 masters under bf16 / fp16, the fastest and smallest policy; fp32
  // (the "upcast" policy) when asked for.
  std::string resolved_param_dtype() const { return param_dtype == "auto" ? compute_precision() : param_dtype; }
  // --fp8-grad auto: e5m2 under tensorwise, e4m3 under rowwise.
  std::string resolved_fp8_grad() const { return fp8_grad != "auto" ? fp8_grad : fp8_recipe == "rowwise" ? "e4m3" : "e5m2"; }
  // The dtype the products run in outside float8's: fp8 computes the rest in bf16.
  std::string compute_precision() const { return precision == "fp8" ? "bf16" : precision; }
  // The pipeline schedule the run uses: 1f1b or interleaved (never "auto").
  std::string resolved_pp_schedule() const {
    return pp_schedule != "auto" ? pp_schedule : pp_virtual > 1 ? "interleaved" : "1f1b";
  }
  int64_t resolved_lr_decay_steps() const { return lr_decay_steps > 0 ? lr_decay_steps : steps; }

  // The model as the start-up line names it: the preset, and each of its fields the flags (or a
  // config file, or the data's tokenizer) changed -- "gpt2-124m (with n_layer 4, seq_len 256)";
  // the preset's name alone when none did.
  std::string model_description() const;

  // Throws ConfigError with one line naming the first setting that cannot be used.
  void validate() const;
  nlohmann::json to_json() const;

 private:
  // to_json()'s parts.
  void put_model(nlohmann::json& j) const;
  void put_data_and_optimizer(nlohmann::json& j) const;
  void put_layout_and_run(nlohmann::json& j) const;
  // validate()'s parts, in its order.
  void validate_run() const;
  void validate_comm_and_precision() const;
  void validate_layout() const;
  void validate_state() const;
  void validate_cuda_graph() const;
};

// A setting of a resumed run that differs from the one its checkpoint was saved with.
struct ConfigChange {
  std::string key;               // the flag's name ("seed", "global batch")
  nlohmann::json saved, now;
  bool breaks_replay = false;    // the resumed run can no longer be the uninterrupted one
};

// What differs between the run a checkpoint recorded (trainer_state.json's `run`: TrainConfig::
// to_json() of the run that saved it as "config", its "dp", its "data_sources") and this run
// (`now`, its dp, and its data_sources record: each training file's token count and fingerprint). Settings that break the documented replay: the data
// (sources, format, synthetic size), the seed, the model's dropout (its shape is checked with the
// tensors), the global batch (micro-batch x grad-accum x dp), the optimizer and its schedule
// (lr, min-lr, warmup, weight decay, clipping, AdamW's betas and eps) and the precision with its
// loss scaler. Others are legitimate and only logged: more steps, another layout (dp, tp, pp,
// ZeRO, offload, micro-batch and grad-accum at the same global batch), the device, logs,
// checkpoints, timeouts. Paths of this run's own outputs are not compared. The data is compared by
// what the sample order depends on where the checkpoint recorded it -- the files' token counts and
// fingerprints, not their names: the same file named another way is the same data, a shard added
// under an unchanged glob is not -- and by the --data text where it did not.
std::vector<ConfigChange> config_changes(const nlohmann::json& saved_run, const TrainConfig& now, int now_dp,
                                         const nlohmann::json& now_sources);

}  // namespace kiln
