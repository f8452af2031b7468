// runtime/trainer/train_config.cpp -- validation and JSON form of TrainConfig.
#include "runtime/trainer/train_config.h"

#include <set>
#include <utility>
#include <vector>

#include "distributed/error.h"
#include "parallel/pipeline_interleaved.h"
#include "parallel/pipeline_layout.h"
#include "parallel/pipeline_zero_bubble.h"

namespace kiln {

namespace {
void one_of(const char* flag, const std::string& v, const std::set<std::string>& allowed) {
  if (allowed.count(v)) return;
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
  throw ConfigError(std::string("--") + flag + " must be one of " + list + " (got '" + v + "')");
}
void at_least(const char* flag, int64_t v, int64_t lo) {
  if (v < lo) throw ConfigError(std::string("--") + flag + " must be at least " + std::to_string(lo) + " (got " + std::to_string(v) + ")");
}
void at_least(const char* flag, double v, double lo) {
  if (!(v >= lo)) {
    throw ConfigError(std::string("--") + flag + " must be at least " + nlohmann::json(lo).dump() +
                      " (got " + nlohmann::json(v).dump() + ")");
  }
}
}  // namespace

void TrainConfig::validate() const {
  gpt.validate();
  validate_run();
  validate_comm_and_precision();
  validate_layout();
  validate_state();
  validate_cuda_graph();
}

// --cuda-graph replays one captured step: what changes between steps must live on the device
// (the rate: filled in before each replay) or not exist. What the graph cannot take is refused
// here, each with its reason; the device and the world of one at set-up (Trainer::build_graphs).
void TrainConfig::validate_cuda_graph() const {
  if (!cuda_graph) return;
  auto refuse = [](const std::string& what, const std::string& why) {
    throw ConfigError("--cuda-graph does not go with " + what + ": " + why);
  };
  if (precision == "fp16") refuse("--precision fp16", "the loss scale changes on the host between steps (use bf16)");
  if (zero > 0) refuse("--zero " + std::to_string(zero), "the graph runs ZeRO-0's step (its shards' collectives are not captured)");
  if (tp > 1 || pp > 1 || cp > 1 || ep > 1) refuse("--tp, --pp, --cp or --ep", "the graph runs one process");
  if (activation_checkpointing != "none") {
    refuse("--activation-checkpointing " + activation_checkpointing, "recomputation keeps the RNG state on the host between the passes");
  }
  if (gpt.is_moe()) refuse("an MoE model", "the routing's statistics are read on the host each step");
  if (on_nonfinite == "skip") refuse("--on-nonfinite skip", "tracing a skipped step's gradients adds hooks the graph does not have");
  if (spike_rollback > 0) refuse("--spike-rollback", "a rollback replaces the weights the graph reads");
}

// The data, the loop, the schedule and the optimizer's numbers.
void TrainConfig::validate_run() const {
  one_of("data-format", data_format, {"auto", "shard", "raw"});
  at_least("micro-batch", micro_batch, int64_t{1});
  at_least("grad-accum", grad_accum, int64_t{1});
  at_least("steps", steps, int64_t{0});
  at_least("eval-every", eval_every, int64_t{0});
  at_least("eval-batches", eval_batches, int64_t{0});  // 0: the validation set once
  at_least("sample-every", sample_every, int64_t{0});
  if (sample_every > 0 && (pp > 1 || zero == 3)) {
    throw ConfigError("--sample-every needs the whole model on the ranks of one replica (tensor parallelism is fine): not with --pp " +
                      std::to_string(pp) + " or --zero 3");
  }
  at_least("loss-chunk-rows", loss_chunk_rows, int64_t{-1});
  at_least("synthetic-tokens", synthetic_tokens, gpt.seq_len + 1);
  at_least("lr", lr, 0);
  at_least("warmup", warmup, int64_t{0});
  one_of("lr-schedule", lr_schedule, {"cosine", "constant", "warmup", "warmup-decay", "warmup-cosine"});
  one_of("warmup-type", warmup_type, {"linear", "log"});
  at_least("warmup-start-lr", warmup_start_lr, 0);
  at_least("lr-decay-steps", lr_decay_steps, int64_t{0});
  if ((lr_schedule == "cosine" || lr_schedule == "constant") && (warmup_type != "linear" || warmup_start_lr != 0.0)) {
    throw ConfigError("--warmup-type and --warmup-start-lr shape DeepSpeed's schedules (--lr-schedule warmup, "
                      "warmup-decay, warmup-cosine), not --lr-schedule " + lr_schedule);
  }
  if (lr_schedule == "warmup-cosine" && !(lr > 0)) {
    throw ConfigError("--lr-schedule warmup-cosine needs --lr above 0 (its warm-up start and floor are ratios of it)");
  }
  at_least("weight-decay", weight_decay, 0);
  at_least("grad-clip", grad_clip, 0);
  at_least("log-every", log_every, int64_t{1});
  at_least("peak-tflops", peak_tflops, 0);
  at_least("device-memory-cap-gb", device_memory_cap_gb, 0);
  at_least("profile-start", profile_start, int64_t{0});
  at_least("profile-steps", profile_steps, int64_t{1});
  if (!(beta1 >= 0 && beta1 < 1)) throw ConfigError("--beta1 must be in [0, 1)");
  if (!(beta2 >= 0 && beta2 < 1)) throw ConfigError("--beta2 must be in [0, 1)");
  at_least("adam-eps", adam_eps, 0);
}

// Communication, precision and recomputation.
void TrainConfig::validate_comm_and_precision() const {
  one_of("backend", backend, {"auto", "nccl", "mpi"});
  if (!(comm_timeout > 0)) throw ConfigError("--comm-timeout must be positive (seconds)");
  if (!(comm_init_timeout > 0)) throw ConfigError("--comm-init-timeout must be positive (seconds)");
  if (!(save_timeout > 0)) throw ConfigError("--save-timeout must be positive (seconds)");
  at_least("max-wall-time", max_wall_time, 0);
  one_of("offload", offload, {"none", "optimizer", "all"});
  one_of("precision", precision, {"fp32", "bf16", "fp16", "fp8"});
  one_of("param-dtype", param_dtype, {"auto", "fp32", "bf16", "fp16"});
  one_of("reduce-dtype", reduce_dtype, {"fp32", "bf16"});
  if (param_dtype != "auto" && param_dtype != "fp32" && param_dtype != compute_precision()) {
    throw ConfigError("--param-dtype " + param_dtype + " keeps the working weights in the compute precision: give --precision " +
                      param_dtype + " (got --precision " + precision + ")");
  }
  if (precision == "fp8") {
    one_of("fp8-recipe", fp8_recipe, {"tensorwise", "rowwise"});
    one_of("fp8-grad", fp8_grad, {"auto", "e5m2", "e4m3"});
    one_of("fp8-filter", fp8_filter, {"auto", "all"});
  }
  one_of("activation-checkpointing", activation_checkpointing, {"none", "full", "selective"});
  one_of("kernels", kernels, {"fused", "reference"});
  one_of("main-grads", main_grads, {"auto", "always"});
  one_of("logits-dtype", logits_dtype, {"fp32", "bf16"});
  one_of("document-positions", document_positions, {"continue", "restart"});
  if (document_positions == "restart" && !document_mask)
    throw ConfigError("--document-positions restart counts positions within documents: give --document-mask too");
  if (logits_dtype == "bf16" && compute_precision() != "bf16") {
    throw ConfigError("--logits-dtype bf16 rounds the products of bf16 operands: give --precision bf16 (got --precision " + precision + ")");
  }
}

// The parallel layout: tp, sp, cp, ep, pp and ZeRO, and what each composes with.
void TrainConfig::validate_layout() const {
  at_least("tp", tp, int64_t{1});
  at_least("pp", pp, int64_t{1});
  at_least("cp", cp, int64_t{1});
  if (sp && tp < 2) throw ConfigError("--sp splits the sequence over the tensor-parallel group: it needs --tp 2 or more");
  if (sp && gpt.seq_len % tp != 0) {
    throw ConfigError("--sp needs --tp " + std::to_string(tp) + " to divide the sequence length (" + std::to_string(gpt.seq_len) + ")");
  }
  if (cp > 1 && gpt.seq_len % (2 * cp) != 0) {
    throw ConfigError("--cp " + std::to_string(cp) + " needs the sequence length (" + std::to_string(gpt.seq_len) +
                      ") to divide into 2 x cp = " + std::to_string(2 * cp) + " chunks (each rank holds two)");
  }
  if (cp > 1 && sp && gpt.seq_len % (2 * cp * tp) != 0) {
    throw ConfigError("--cp " + std::to_string(cp) + " with --sp needs the sequence length (" + std::to_string(gpt.seq_len) +
                      ") to divide into 2 x cp x tp = " + std::to_string(2 * cp * tp) + " blocks");
  }
  at_least("ep", ep, int64_t{1});
  if (ep > 1) {
    if (!gpt.is_moe()) throw ConfigError("--ep " + std::to_string(ep) + " divides the experts of an MoE model: give --n-experts (or --model tiny-moe)");
    if (gpt.n_experts % ep != 0) {
      std::string fits;  // the sizes that divide the experts (dp must take them too)
      for (int64_t e = 1; e <= gpt.n_experts; ++e)
        if (gpt.n_experts % e == 0) fits += (fits.empty() ? "" : ", ") + std::to_string(e);
      throw ConfigError("--ep " + std::to_string(ep) + " does not divide the experts (--n-experts " + std::to_string(gpt.n_experts) +
                        "); --ep values that do: " + fits);
    }
  }
  if (zero < 0 || zero > 3) throw ConfigError("--zero must be 0, 1, 2 or 3 (got " + std::to_string(zero) + ")");

  one_of("pp-schedule", pp_schedule, {"auto", "1f1b", "interleaved", "zb-h1"});
  if (pp_schedule == "zb-h1") {
    const std::string rule = zb_h1_rule(static_cast<int>(pp), static_cast<int>(pp_virtual), static_cast<int>(zero),
                                        activation_checkpointing == "full");
    if (!rule.empty()) throw ConfigError(rule);
  }
  if (pp_schedule == "interleaved" && pp_virtual < 2) {
    throw ConfigError("--pp-schedule interleaved runs --pp-virtual V >= 2 model chunks a rank: give --pp-virtual 2 or more");
  }
  if (pp_schedule == "1f1b" && pp_virtual > 1) {
    throw ConfigError("--pp-virtual " + std::to_string(pp_virtual) + " needs the interleaved schedule (--pp-schedule "
                      "interleaved, or leave it auto); --pp-schedule 1f1b holds one chunk a rank");
  }
  if (pp_virtual != 1) {
    const std::string rule = interleaved_rule(static_cast<int>(pp), static_cast<int>(pp_virtual), static_cast<int>(grad_accum));
    if (!rule.empty()) throw ConfigError(rule);
  }
  pipeline_block_counts(gpt.n_layer, pp, pp_split, pp_virtual);  // pp x V above the blocks, or a bad --pp-split
  one_of("zero-accum", zero_accum, {"reduce", "local"});
  if (offload != "none" && zero == 0) {
    throw ConfigError("--offload " + offload + " needs ZeRO (--zero 1, 2 or 3): it moves the sharded optimizer state");
  }
  if (offload == "all" && zero != 3) {
    throw ConfigError("--offload all needs --zero 3 (parameters are sharded only under ZeRO-3; got --zero " +
                      std::to_string(zero) + ")");
  }
  at_least("offload-delay-from", offload_delay_from, int64_t{0});
  if (offload_delay_from > 0 && !offload_delayed_update) {
    throw ConfigError("--offload-delay-from " + std::to_string(offload_delay_from) + " needs --offload-delayed-update (it says when the delay starts)");
  }
  if (offload_delayed_update && offload != "optimizer") {
    throw ConfigError("--offload-delayed-update needs --offload optimizer (got --offload " + offload +
                      "): it holds the host update back from the working weights the device keeps");
  }
}

// Non-finite steps, checkpoints, and fp16's loss scaler.
void TrainConfig::validate_state() const {
  one_of("on-nonfinite", on_nonfinite, {"stop", "skip"});
  at_least("max-skipped-steps", max_skipped_steps, int64_t{1});
  at_least("check-replicas", check_replicas, int64_t{0});
  at_least("spike-rollback", spike_rollback, 0.0);
  at_least("spike-patience", spike_patience, int64_t{1});
  at_least("max-rollbacks", max_rollbacks, int64_t{1});
  if (spike_rollback > 0 && save_dir.empty()) {
    throw ConfigError("--spike-rollback goes back to the last checkpoint before a spike: give --save-dir (and --save-every)");
  }
  if (check_replicas > 0 && zero == 3) {
    throw ConfigError("--check-replicas compares the weights of data-parallel replicas, and --zero 3 shards them: no two "
                      "ranks hold the same bytes (use --zero 1 or 2, or leave --check-replicas out)");
  }
  if (!(straggler_factor > 1.0)) throw ConfigError("--straggler-factor must be above 1 (got " + std::to_string(straggler_factor) + ")");
  at_least("save-every", save_every, int64_t{0});
  at_least("keep-last", keep_last, int64_t{0});
  at_least("early-stop", early_stop, int64_t{0});
  if ((keep_best || early_stop > 0) && (val_data.empty() || eval_every <= 0)) {
    throw ConfigError(std::string(keep_best ? "--keep-best" : "--early-stop") +
                      " follows the validation loss: give --val-data and --eval-every N");
  }
  if (keep_best && save_dir.empty()) throw ConfigError("--keep-best keeps a checkpoint: give --save-dir");
  at_least("stop-at-step", stop_at_step, int64_t{0});
  if (resume.empty()) throw ConfigError("--resume must be auto, none, or a checkpoint path");
  if (precision == "fp16") {
    at_least("loss-scale", loss_scale, 0);
    at_least("loss-scale-window", loss_scale_window, int64_t{1});
    at_least("hysteresis", hysteresis, int64_t{1});
    if (!(min_loss_scale > 0)) throw ConfigError("--min-loss-scale must be positive");
    if (initial_scale_power < 0 || initial_scale_power > 120) {
      throw ConfigError("--initial-scale-power must be in [0, 120] (got " + std::to_string(initial_scale_power) + ")");
    }
  }
}

// The config record in three parts (the model; the data and the optimizer; the layout, precision
// and the run's own settings). JSON objects keep their keys sorted: the record is the same.
void TrainConfig::put_model(nlohmann::json& j) const {
  j["model"] = model;
  j["n_layer"] = gpt.n_layer;
  j["n_head"] = gpt.n_head;
  j["n_kv_head"] = gpt.n_kv_head;
  j["d_model"] = gpt.d_model;
  j["seq_len"] = gpt.seq_len;
  j["vocab_size"] = gpt.vocab_size;
  j["padded_vocab_size"] = gpt.padded_vocab_size();
  j["dropout"] = gpt.dropout;
  gpt.put_architecture(j);  // the Llama family's fields (a GPT-2 run's record stays as it was)
  if (gpt.is_moe()) {  // a dense run's record (and checkpoint) stays as it was
    j["n_experts"] = gpt.n_experts;
    j["top_k"] = gpt.top_k;
    j["moe_every"] = gpt.moe_every;
    j["moe_capacity_factor"] = gpt.moe_capacity_factor;
    j["moe_aux_loss_coef"] = gpt.moe_aux_loss_coef;
    j["moe_z_loss_coef"] = gpt.moe_z_loss_coef;
  }
}

void TrainConfig::put_data_and_optimizer(nlohmann::json& j) const {
  j["data"] = data;
  j["data_format"] = data_format;
  j["val_data"] = val_data;
  j["tokenizer"] = tokenizer;
  j["eval_every"] = eval_every;
  j["eval_batches"] = eval_batches;
  j["sample_every"] = sample_every;
  j["synthetic_tokens"] = synthetic_tokens;
  j["micro_batch"] = micro_batch;
  j["grad_accum"] = grad_accum;
  j["steps"] = steps;
  j["lr"] = lr;
  j["min_lr"] = resolved_min_lr();
  j["warmup"] = warmup;
  j["lr_schedule"] = lr_schedule;
  j["warmup_type"] = warmup_type;
  j["warmup_start_lr"] = warmup_start_lr;
  j["lr_decay_steps"] = lr_decay_steps;  // 0: --steps (so more --steps is not a change of the schedule's setting)
  j["weight_decay"] = weight_decay;
  j["grad_clip"] = grad_clip;
  j["beta1"] = beta1;
  j["beta2"] = beta2;
  j["adam_eps"] = adam_eps;
}

void TrainConfig::put_layout_and_run(nlohmann::json& j) const {
  j["seed"] = seed;
  j["device"] = device;
  j["backend"] = backend;
  j["comm_timeout"] = comm_timeout;
  j["comm_init_timeout"] = comm_init_timeout;
  j["allow_config_change"] = allow_config_change;
  j["stop_signals"] = stop_signals;
  j["max_wall_time"] = max_wall_time;
  j["save_timeout"] = save_timeout;
  j["tp"] = tp;
  j["pp"] = pp;
  j["sp"] = sp;
  j["cp"] = cp;
  if (ep > 1) j["ep"] = ep;
  j["pp_split"] = pp_split;
  j["pp_virtual"] = pp_virtual;
  j["pp_schedule"] = resolved_pp_schedule();
  j["zero"] = zero;
  j["offload"] = offload;
  j["zero_accum"] = zero_accum;
  j["offload_delayed_update"] = offload_delayed_update;
  j["offload_delay_from"] = offload_delay_from;
  j["precision"] = precision;
  j["param_dtype"] = resolved_param_dtype();  // the policy the run used, never "auto"
  j["reduce_dtype"] = reduce_dtype;
  j["loss_scale"] = loss_scale;
  j["loss_scale_window"] = loss_scale_window;
  j["initial_scale_power"] = initial_scale_power;
  j["hysteresis"] = hysteresis;
  j["min_loss_scale"] = min_loss_scale;
  j["activation_checkpointing"] = activation_checkpointing;
  j["on_nonfinite"] = on_nonfinite;
  j["max_skipped_steps"] = max_skipped_steps;
  j["straggler_factor"] = straggler_factor;
  j["check_replicas"] = check_replicas;
  j["async_save"] = async_save;
  j["spike_rollback"] = spike_rollback;
  j["spike_patience"] = spike_patience;
  j["max_rollbacks"] = max_rollbacks;
  j["loss_chunk_rows"] = loss_chunk_rows;
  j["deterministic"] = deterministic;
  j["kernels"] = kernels;  // asked for; the config record's top-level "kernels" is what ran
  j["gelu_epilogue"] = gelu_epilogue;
  j["main_grads"] = main_grads;
  j["logits_dtype"] = logits_dtype;
  j["fp8_recipe"] = fp8_recipe;
  j["fp8_grad"] = resolved_fp8_grad();
  j["fp8_filter"] = fp8_filter;
  j["document_positions"] = document_positions;
  j["document_mask"] = document_mask;
  j["cuda_graph"] = cuda_graph;
  j["save_dir"] = save_dir;
  j["save_every"] = save_every;
  j["keep_last"] = keep_last;
  j["keep_best"] = keep_best;
  j["early_stop"] = early_stop;
  j["stop_at_step"] = stop_at_step;
  j["resume"] = resume;
  j["init_from"] = init_from;
  j["log_json"] = log_json;
  j["tensorboard"] = tensorboard;
  j["log_every"] = log_every;
  j["peak_tflops"] = peak_tflops;
  j["device_memory_cap_gb"] = device_memory_cap_gb;
  j["profile"] = profile;
  j["profile_start"] = profile_start;
  j["profile_steps"] = profile_steps;
  if (!deepspeed.empty()) j["deepspeed"] = deepspeed_used;
}

nlohmann::json TrainConfig::to_json() const {
  nlohmann::json j;
  put_model(j);
  put_data_and_optimizer(j);
  put_layout_and_run(j);
  return j;
}

std::string TrainConfig::model_description() const {
  GPTConfig base;
  try {
    base = GPTConfig::preset(model);
  } catch (const ConfigError&) {
    return model;  // not a preset's name: nothing to compare with
  }
  using json = nlohmann::json;
  const GPTConfig& g = gpt;
  // Every model field a flag sets, in the order of kiln train --help.
  const std::vector<std::pair<const char*, std::pair<json, json>>> fields = {
      {"n_layer", {g.n_layer, base.n_layer}},
      {"n_head", {g.n_head, base.n_head}},
      // --n-head alone carries n_kv_head with it (launch/cli.cpp): not a change of its own then.
      {"n_kv_head", {g.n_kv_head, g.n_kv_head == g.n_head && base.n_kv_head == base.n_head ? g.n_kv_head : base.n_kv_head}},
      {"d_model", {g.d_model, base.d_model}},
      {"seq_len", {g.seq_len, base.seq_len}},
      {"vocab_size", {g.vocab_size, base.vocab_size}},
      {"dropout", {g.dropout, base.dropout}},
      {"position", {g.position, base.position}},
      {"rope_theta", {g.rope_theta, base.rope_theta}},
      {"rope_factor", {g.rope_factor, base.rope_factor}},
      {"norm", {g.norm, base.norm}},
      {"norm_eps", {g.layer_norm_eps, base.layer_norm_eps}},
      {"mlp", {g.mlp, base.mlp}},
      {"ffn_hidden", {g.ffn_hidden, base.ffn_hidden}},
      {"bias", {g.bias, base.bias}},
      {"tie_embeddings", {g.tie_embeddings, base.tie_embeddings}},
      {"n_experts", {g.n_experts, base.n_experts}},
      {"top_k", {g.top_k, base.top_k}},
      {"moe_every", {g.moe_every, base.moe_every}},
      {"moe_capacity_factor", {g.moe_capacity_factor, base.moe_capacity_factor}},
  };
  std::string changed;
  for (const auto& [name, values] : fields) {
    if (values.first == values.second) continue;
    const json& v = values.first;
    changed += (changed.empty() ? " (with " : ", ") + std::string(name) + " " + (v.is_string() ? v.get<std::string>() : v.dump());
  }
  return changed.empty() ? model : model + changed + ")";
}

namespace {
// A data_sources record without its file names (what is compared), and its one-line description.
nlohmann::json without_names(const nlohmann::json& sources) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& s : sources) out.push_back({s.value("tokens", int64_t{0}), s.value("fingerprint", std::string())});
  return out;
}
std::string describe_sources(const nlohmann::json& sources) {
  int64_t tokens = 0;
  for (const auto& s : sources) tokens += s.value("tokens", int64_t{0});
  return std::to_string(sources.size()) + " file(s) of " + std::to_string(tokens) + " tokens";
}
}  // namespace

std::vector<ConfigChange> config_changes(const nlohmann::json& saved_run, const TrainConfig& now, int now_dp,
                                         const nlohmann::json& now_sources) {
  const nlohmann::json saved = saved_run.value("config", nlohmann::json::object());
  const int saved_dp = saved_run.value("dp", now_dp);
  const bool by_fingerprint = saved_run.contains("data_sources");
  static const std::set<std::string> replay = {"data",        "data_format", "synthetic_tokens", "seed",
                                               "dropout",     "lr",          "min_lr",           "warmup",
                                               "lr_schedule", "warmup_type", "warmup_start_lr", "lr_decay_steps",
                                               "weight_decay", "grad_clip",  "beta1",            "beta2",
                                               "adam_eps",    "precision",   "param_dtype", "reduce_dtype", "logits_dtype", "fp8_recipe", "fp8_grad", "fp8_filter", "document_mask", "document_positions", "loss_scale",       "loss_scale_window",
                                               "initial_scale_power", "hysteresis", "min_loss_scale", "offload_delayed_update", "offload_delay_from",
                                               // MoE: the routing and the losses (the shapes are checked with the tensors)
                                               "top_k", "moe_capacity_factor", "moe_aux_loss_coef", "moe_z_loss_coef"};
  // This run's own outputs and its way of resuming: not settings of the training.
  static const std::set<std::string> ignored = {"resume", "log_json", "tensorboard", "log_every", "save_dir", "stop_at_step",
                                                "allow_config_change", "deepspeed", "sample_every"};
  // Under --offload-delayed-update every save, evaluation and sample publishes the pending update
  // (parallel/zero.h, "The delayed update"): their schedule is part of the training then.
  static const std::set<std::string> publishing = {"save_every", "eval_every", "sample_every"};
  std::vector<ConfigChange> out;
  const nlohmann::json cur = now.to_json();
  const bool delayed = now.offload_delayed_update || saved.value("offload_delayed_update", false);
  for (const auto& [key, value] : cur.items()) {
    const bool publishes = delayed && publishing.count(key) > 0;
    if ((ignored.count(key) && !publishes) || !saved.contains(key)) continue;
    if (saved.at(key) == value) continue;
    // The --data text: its files are compared below where the checkpoint recorded them.
    out.push_back({key, saved.at(key), value, publishes || (replay.count(key) > 0 && !(key == "data" && by_fingerprint))});
  }
  if (by_fingerprint) {
    const nlohmann::json& was = saved_run.at("data_sources");
    if (without_names(was) != without_names(now_sources)) {
      out.push_back({"data files", describe_sources(was),
                     describe_sources(now_sources) + (was.size() == now_sources.size() ? " (other tokens)" : ""), true});
    }
  }
  const auto batch = [](const nlohmann::json& c, int dp) {
    return c.value("micro_batch", int64_t{0}) * c.value("grad_accum", int64_t{0}) * dp;
  };
  const int64_t before = batch(saved, saved_dp), after = batch(cur, now_dp);
  if (before != after) out.push_back({"global batch", before, after, true});
  return out;
}

}  // namespace kiln
