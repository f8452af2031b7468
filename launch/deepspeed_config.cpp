// launch/deepspeed_config.cpp -- DeepSpeed JSON keys to kiln settings (see the header).
#include "launch/deepspeed_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>

#include "distributed/error.h"
#include "distributed/mesh.h"
#include "distributed/suggest.h"

namespace kiln {

namespace {

// The notice of a key accepted without effect: "<key>: accepted; <why>".
constexpr const char* kAccepted = ": accepted; ";

using json = nlohmann::json;

// Keys that only tune performance, memory placement kiln decides itself, or logging: accepted,
// with the reason kiln does not act on them.
const std::map<std::string, std::string>& tuning_keys() {
  static const std::map<std::string, std::string> keys = {
      {"steps_per_print", ""},  // mapped to --log-every; listed so it is known
      {"wall_clock_breakdown", "kiln's step records always carry the forward/backward/optimizer times"},
      {"memory_breakdown", "kiln's step records always carry the device memory"},
      {"zero_optimization.allgather_partitions", "kiln's ZeRO all-gathers the updated parameters itself"},
      {"zero_optimization.allgather_bucket_size", "kiln sizes its ZeRO communication itself"},
      {"zero_optimization.reduce_bucket_size", "kiln sizes its ZeRO communication itself"},
      {"zero_optimization.overlap_comm", "kiln schedules its ZeRO communication itself"},
      {"zero_optimization.reduce_scatter", "kiln's ZeRO-2/3 always reduce-scatter gradients"},
      {"zero_optimization.contiguous_gradients", "kiln lays gradients out itself"},
      {"zero_optimization.round_robin_gradients", "kiln lays gradients out itself"},
      {"zero_optimization.sub_group_size", "kiln steps the optimizer on whole shards"},
      {"zero_optimization.stage3_prefetch_bucket_size", "kiln's ZeRO-3 gathers one block ahead"},
      {"zero_optimization.stage3_param_persistence_threshold", "kiln's ZeRO-3 shards every parameter"},
      {"zero_optimization.stage3_model_persistence_threshold", "kiln's ZeRO-3 shards every parameter"},
      {"zero_optimization.stage3_max_live_parameters", "kiln's ZeRO-3 holds one gathered block at a time"},
      {"zero_optimization.stage3_max_reuse_distance", "kiln's ZeRO-3 holds one gathered block at a time"},
      {"zero_optimization.stage3_gather_16bit_weights_on_model_save", "kiln's checkpoints always hold the whole model"},
      {"zero_optimization.stage3_gather_fp16_weights_on_model_save", "kiln's checkpoints always hold the whole model"},
      {"zero_optimization.elastic_checkpoint", "kiln's checkpoints load on any layout"},
      {"zero_optimization.load_from_fp32_weights", "kiln's checkpoints hold fp32 weights"},
      {"zero_optimization.ignore_unused_parameters", "every parameter of kiln's GPT is used"},
      {"zero_optimization.legacy_stage1", "kiln has one ZeRO-1"},
      {"zero_optimization.use_multi_rank_bucket_allreduce", "kiln sizes its ZeRO communication itself"},
      {"zero_optimization.memory_efficient_linear", "kiln's linear layers are its own"},
      {"zero_optimization.zero_hpz_partition_size", "kiln's ZeRO-3 shards over all data-parallel ranks"},
      {"zero_optimization.mics_shard_size", "kiln's ZeRO-3 shards over all data-parallel ranks"},
      {"zero_optimization.mics_hierarchical_params_gather", "kiln's ZeRO-3 shards over all data-parallel ranks"},
      {"zero_optimization.offload_optimizer.pin_memory", "kiln pins its host buffers itself"},
      {"zero_optimization.offload_optimizer.buffer_count", "kiln pins its host buffers itself"},
      {"zero_optimization.offload_optimizer.fast_init", "kiln initialises the host state itself"},
      {"zero_optimization.offload_optimizer.ratio", "kiln offloads the whole optimizer state"},
      {"zero_optimization.offload_param.pin_memory", "kiln pins its host buffers itself"},
      {"zero_optimization.offload_param.buffer_count", "kiln pins its host buffers itself"},
      {"zero_optimization.offload_param.buffer_size", "kiln pins its host buffers itself"},
      {"zero_optimization.offload_param.max_in_cpu", "kiln keeps every offloaded parameter in host memory"},
      {"optimizer.params.torch_adam", "kiln's AdamW is its own (the same update)"},
      {"optimizer.params.fused", "kiln's AdamW is its own (the same update)"},
      {"bf16.immediate_grad_update", "kiln applies the update once per step"},
      {"activation_checkpointing.partition_activations", "kiln keeps each block's input whole on its rank"},
      {"activation_checkpointing.cpu_checkpointing", "kiln keeps the checkpointed activations on the device"},
      {"activation_checkpointing.contiguous_memory_optimization", "kiln's allocator places the activations"},
      {"activation_checkpointing.number_checkpoints", "kiln checkpoints every block"},
      {"activation_checkpointing.synchronize_checkpoint_boundary", "kiln does not synchronise there"},
      {"activation_checkpointing.profile", "kiln's step records carry the phase times"},
      {"zero_allow_untested_optimizer", "kiln's ZeRO runs its own AdamW"},
      {"zero_force_ds_cpu_optimizer", "kiln's offloaded step is its own CPU AdamW"},
      {"prescale_gradients", "kiln averages the summed gradients once (the same result)"},
      {"gradient_predivide_factor", "kiln averages the summed gradients once (the same result)"},
      {"tensorboard", "kiln logs JSONL (--log-json); kiln report plots it"},
      {"wandb", "kiln logs JSONL (--log-json); kiln report plots it"},
      {"csv_monitor", "kiln logs JSONL (--log-json); kiln report plots it"},
      {"comet", "kiln logs JSONL (--log-json); kiln report plots it"},
      {"flops_profiler", "kiln's step records carry TFLOP/s and MFU"},
      {"comms_logger", "kiln's step records carry the communication times"},
      {"dump_state", "kiln prints its config record"},
      {"checkpoint", "kiln's checkpoints are its own (--save-dir)"},
      {"dataloader_drop_last", "kiln's loader reads fixed windows"},
      // DeepSpeed's own sections that change nothing kiln computes.
      {"aio", "DeepSpeed's asynchronous I/O serves NVMe offload; kiln offloads to host memory only"},
      {"autotuning", "kiln plan --search chooses a layout (docs/plan.md)"},
      {"nebula", "kiln's checkpoints are its own (--save-dir)"},
      {"compile", "kiln runs its own model code, not torch.compile"},
      {"timers", "kiln's step records always carry the phase times"},
      {"disable_allgather", "kiln schedules its communication itself"},
      {"graph_harvesting", "kiln does not capture CUDA graphs"},
      {"sparse_gradients", "kiln reduces the embedding's gradient densely (the same result)"},
      {"hybrid_engine", "DeepSpeed's RLHF generation engine; kiln trains only"},
      {"seq_parallel_communication_data_type", "kiln's sequence parallelism communicates in the compute dtype"},
  };
  return keys;
}

// Keys whose only value kiln implements is the default: anything else changes the numerics.
struct DefaultOnly {
  json value;        // the one accepted value (null accepts null)
  std::string why;   // what kiln does instead
};
const std::map<std::string, DefaultOnly>& default_only_keys() {
  static const std::map<std::string, DefaultOnly> keys = {
      {"fp16.consecutive_hysteresis", {false, "kiln's scaler restores its hysteresis only when the scale grows"}},
      {"fp16.auto_cast", {false, "kiln's fp16 runs whole layers in fp16 with fp32 master weights"}},
      {"fp16.fp16_master_weights_and_grads", {false, "kiln keeps fp32 master weights"}},
      {"bf16.bf16_master_weights_and_grads", {false, "kiln keeps fp32 master weights"}},
      {"bf16.bf16_optimizer_states", {false, "kiln keeps the optimizer state in fp32"}},
      {"optimizer.params.amsgrad", {false, "kiln's AdamW has no AMSGrad"}},
      {"optimizer.params.bias_correction", {true, "kiln's AdamW always corrects the moments' bias"}},
      {"zero_optimization.zero_quantized_weights", {false, "kiln gathers weights unquantized"}},
      {"zero_optimization.zero_quantized_gradients", {false, "kiln reduces gradients unquantized"}},
      {"zero_optimization.zero_quantized_nontrainable_weights", {false, "kiln gathers weights unquantized"}},
      {"communication_data_type", {nullptr, "kiln reduces gradients in fp32"}},
      {"data_types.grad_accum_dtype", {nullptr, "kiln accumulates gradients in fp32"}},
  };
  return keys;
}

// Whole sections kiln has no counterpart for: refused with the reason.
const std::map<std::string, std::string>& refused_sections() {
  static const std::map<std::string, std::string> keys = {
      {"amp", "NVIDIA Apex AMP: use fp16 or bf16"},
      {"sparse_attention", "kiln's attention is dense"},
      {"compression_training", "kiln does not compress during training"},
      {"curriculum_learning", "kiln's data order is fixed by the seed"},
      {"data_efficiency", "kiln's data order is fixed by the seed"},
      {"elasticity", "kiln's batch does not change with the world size"},
      {"pipeline", "use kiln's --pp (1F1B)"},
      {"moe", "kiln's GPT has no experts yet"},
      {"sequence_parallel_size", "kiln has no sequence parallelism yet"},
      {"eigenvalue", "kiln does not estimate the Hessian's eigenvalues"},
      {"progressive_layer_drop", "kiln runs every layer at every step"},
      {"quantize_training", "kiln trains unquantized"},
      {"weight_quantization", "kiln trains unquantized"},
      {"torch_autocast", "use fp16 or bf16 (kiln's own autocast)"},
      {"use_data_before_expert_parallelism", "kiln's ep ranks read their own data-parallel samples"},
      {"zero_optimization.offload_optimizer.nvme_path", "kiln offloads to host memory only"},
      {"zero_optimization.offload_param.nvme_path", "kiln offloads to host memory only"},
  };
  return keys;
}

// Other tools' names for DeepSpeed's keys, by a key's last part: what a config written from the
// Hugging Face Trainer's, nanoGPT's or torchtitan's settings holds instead ('learning_rate' at the
// top level or under optimizer.params). Suggested before edit distance, which cannot find them.
const std::map<std::string, std::string>& foreign_keys() {
  static const std::map<std::string, std::string> keys = {
      {"learning_rate", "optimizer.params.lr"}, {"lr", "optimizer.params.lr"},
      {"weight_decay", "optimizer.params.weight_decay"}, {"adam_epsilon", "optimizer.params.eps"},
      {"epsilon", "optimizer.params.eps"}, {"beta1", "optimizer.params.betas"}, {"beta2", "optimizer.params.betas"},
      {"batch_size", "train_micro_batch_size_per_gpu"}, {"micro_batch_size", "train_micro_batch_size_per_gpu"},
      {"per_device_train_batch_size", "train_micro_batch_size_per_gpu"}, {"global_batch_size", "train_batch_size"},
      {"gradient_accumulation", "gradient_accumulation_steps"}, {"grad_accum", "gradient_accumulation_steps"},
      {"max_grad_norm", "gradient_clipping"}, {"grad_clip", "gradient_clipping"}, {"clip_grad", "gradient_clipping"},
      {"max_steps", "scheduler.params.total_num_steps"}, {"total_steps", "scheduler.params.total_num_steps"},
      {"max_iters", "scheduler.params.total_num_steps"}, {"warmup_steps", "scheduler.params.warmup_num_steps"},
      {"warmup_iters", "scheduler.params.warmup_num_steps"}, {"zero_stage", "zero_optimization.stage"},
  };
  return keys;
}

// Every key kiln reads from a DeepSpeed file, and each dotted prefix of one (a section's name).
const std::vector<std::string>& known_keys() {
  static const std::vector<std::string> known = [] {
    std::vector<std::string> k = {
        "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
        "steps_per_print", "fp16.enabled", "fp16.loss_scale", "fp16.initial_scale_power", "fp16.loss_scale_window",
        "fp16.hysteresis", "fp16.min_loss_scale", "bf16.enabled", "optimizer.type", "optimizer.params.lr",
        "optimizer.params.betas", "optimizer.params.eps", "optimizer.params.weight_decay", "optimizer.params.adam_w_mode",
        "scheduler.type", "scheduler.params.warmup_min_lr", "scheduler.params.warmup_max_lr",
        "scheduler.params.warmup_num_steps", "scheduler.params.warmup_type", "scheduler.params.total_num_steps",
        "scheduler.params.warmup_min_ratio", "scheduler.params.cos_min_ratio", "zero_optimization.stage",
        "zero_optimization.offload_optimizer", "zero_optimization.offload_param", "zero_optimization.cpu_offload",
        "activation_checkpointing", "tensor_parallel.autotp_size"};
    for (const auto& [key, why] : tuning_keys()) k.push_back(key);
    for (const auto& [key, why] : default_only_keys()) k.push_back(key);
    for (const auto& [key, why] : refused_sections()) k.push_back(key);
    // A misspelt section ("zero_optimisation") is near the section's name, not its keys': every
    // dotted prefix is a candidate too. DeepSpeed's own keys are all in the tables above, so a
    // real DeepSpeed key is never "corrected" into another.
    for (size_t i = 0, n = k.size(); i < n; ++i) {
      for (size_t dot = k[i].find('.'); dot != std::string::npos; dot = k[i].find('.', dot + 1)) k.push_back(k[i].substr(0, dot));
    }
    return k;
  }();
  return known;
}

class Reader {
 public:
  explicit Reader(DeepSpeedSettings& ds) : ds_(ds), file_("--deepspeed " + ds.path) {}

  // One line naming the key and why; the unknown keys found so far ride along, so that one run
  // names them all.
  [[noreturn]] void refuse(const std::string& key, const std::string& why) const {
    throw ConfigError(file_ + ": " + key + ": " + why + " (docs/deepspeed.md)" +
                      (unknown_.empty() ? "" : "; and " + unknown_line()));
  }
  // After the whole file is read: the unknown keys, all of them in one line.
  void refuse_unknown() const {
    if (unknown_.empty()) return;
    throw ConfigError(file_ + ": " + unknown_line() + " (docs/deepspeed.md)");
  }
  static bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

  bool boolean(const std::string& key, const json& v) const {
    if (v.is_boolean()) return v.get<bool>();
    if (v.is_string() && (v == "true" || v == "false")) return v == "true";
    refuse(key, "must be true or false (got " + v.dump() + ")");
  }
  double number(const std::string& key, const json& v) const {
    if (!v.is_number()) refuse(key, "must be a number (got " + v.dump() + ")");
    return v.get<double>();
  }
  int64_t integer(const std::string& key, const json& v) const {
    const double d = number(key, v);
    if (d != std::floor(d) || std::abs(d) > 9e15) refuse(key, "must be a whole number (got " + v.dump() + ")");
    return static_cast<int64_t>(d);
  }
  std::string text(const std::string& key, const json& v) const {
    if (!v.is_string()) refuse(key, "must be a string (got " + v.dump() + ")");
    return v.get<std::string>();
  }
  const json& object(const std::string& key, const json& v) const {
    if (!v.is_object()) refuse(key, "must be a JSON object (got " + v.dump() + ")");
    return v;
  }

  // The kiln flag `flag` takes `value`, from DeepSpeed key `key`.
  void set(const std::string& flag, json value, const std::string& key) {
    ds_.values[flag] = std::move(value);
    ds_.from[flag] = key;
  }
  void automatic(const std::string& key, const std::string& kiln_setting) { ds_.auto_keys[key] = kiln_setting; }
  void notice(const std::string& line) { ds_.notices.push_back(line); }
  // A key kiln accepts without acting on it, with the reason (deepspeed_console_lines groups them).
  void accepted(const std::string& key, const std::string& why) { notice(key + kAccepted + why); }

  // A key every section handles alike: tuning (notice), default-only, refused. Returns false
  // when the key is none of these (the caller maps it, or refuses it as unknown).
  bool common(const std::string& key, const json& v) {
    if (auto it = refused_sections().find(key); it != refused_sections().end()) {
      if (v.is_null() || (v.is_boolean() && !v.get<bool>())) return true;
      if (v.is_object() && v.contains("enabled") && v["enabled"].is_boolean() && !v["enabled"].get<bool>()) return true;
      refuse(key, "not implemented: " + it->second);
    }
    if (auto it = default_only_keys().find(key); it != default_only_keys().end()) {
      const json& ok = it->second.value;
      const bool fine = ok.is_null() ? (v.is_null() || v == "fp32" || v == "float32" || v == "fp32_master")
                                     : (ok.is_boolean() ? boolean(key, v) == ok.get<bool>() : v == ok);
      if (!fine) refuse(key, v.dump() + " is not implemented: " + it->second.why);
      return true;
    }
    if (auto it = tuning_keys().find(key); it != tuning_keys().end()) {
      // A switch left off needs no word.
      if (!it->second.empty() && !v.is_null() && !(v.is_boolean() && !v.get<bool>())) accepted(key, it->second);
      return true;
    }
    return false;
  }
  // A key kiln does not know: noted (with the nearest known key, or the DeepSpeed key another
  // tool's name stands for), and reported with the others once the file is read.
  void unknown(const std::string& key) {
    const size_t dot = key.rfind('.');
    const std::string last = dot == std::string::npos ? key : key.substr(dot + 1);
    const auto alias = foreign_keys().find(last);
    unknown_.emplace_back(key, alias != foreign_keys().end() && alias->second != key
                                   ? " (did you mean '" + alias->second + "'?)"
                                   : did_you_mean(key, known_keys()));
  }

 private:
  std::string unknown_line() const {
    std::vector<std::pair<std::string, std::string>> unknown = unknown_;  // in the order of the file's keys
    std::sort(unknown.begin(), unknown.end());
    if (unknown.size() == 1) {
      return unknown[0].first + ": not a key kiln knows" + unknown[0].second + "; remove it, or see the table of keys";
    }
    std::string s = std::to_string(unknown.size()) + " keys kiln does not know:";
    for (size_t i = 0; i < unknown.size(); ++i) s += (i ? ", " : " ") + unknown[i].first + unknown[i].second;
    return s + "; remove them, or see the table of keys";
  }

  DeepSpeedSettings& ds_;
  std::string file_;
  std::vector<std::pair<std::string, std::string>> unknown_;  // key, its suggestion
};

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

void read_precision(Reader& r, const json& file) {
  bool fp16 = false, bf16 = false, said = false;
  for (const char* section : {"fp16", "bf16", "bfloat16"}) {
    if (!file.contains(section)) continue;
    const json& s = r.object(section, file.at(section));
    const std::string name = std::string(section) == "bfloat16" ? "bf16" : section;
    bool enabled = false, automatic = false;
    if (s.contains("enabled")) {
      automatic = Reader::is_auto(s.at("enabled"));
      if (automatic) r.automatic(name + ".enabled", "precision");
      else enabled = r.boolean(name + ".enabled", s.at("enabled")), said = true;
    }
    (name == "fp16" ? fp16 : bf16) |= enabled;
    for (const auto& [k, v] : s.items()) {
      const std::string key = name + "." + k;
      if (k == "enabled" || r.common(key, v)) continue;
      const char* flag = name == "bf16" ? nullptr
                       : k == "loss_scale" ? "loss-scale" : k == "initial_scale_power" ? "initial-scale-power"
                       : k == "loss_scale_window" ? "loss-scale-window" : k == "hysteresis" ? "hysteresis"
                       : k == "min_loss_scale" ? "min-loss-scale" : nullptr;
      if (!flag) {
        r.unknown(key);
        continue;
      }
      if (!enabled && !automatic) continue;  // the scaler of a disabled fp16 section changes nothing
      if (Reader::is_auto(v)) r.automatic(key, flag);
      else if (k == "loss_scale" || k == "min_loss_scale") r.set(flag, r.number(key, v), key);
      else r.set(flag, r.integer(key, v), key);
    }
  }
  if (fp16 && bf16) r.refuse("fp16.enabled", "fp16 and bf16 are both enabled; enable one");
  if (fp16) r.set("precision", "fp16", "fp16.enabled");
  else if (bf16) r.set("precision", "bf16", "bf16.enabled");
  else if (said) r.set("precision", "fp32", "fp16.enabled / bf16.enabled");
}

void read_optimizer(Reader& r, const json& file) {
  if (!file.contains("optimizer")) return;  // the HF Trainer's own AdamW: kiln's flags
  const json& opt = r.object("optimizer", file.at("optimizer"));
  for (const auto& [k, v] : opt.items())
    if (k != "type" && k != "params") r.unknown("optimizer." + k);
  const std::string type = opt.contains("type") ? r.text("optimizer.type", opt.at("type")) : "";
  const std::string t = lower(type);
  if (t != "adamw" && t != "adam") {
    r.refuse("optimizer.type", "'" + type + "' is not implemented (kiln's optimizer is AdamW: \"AdamW\", or \"Adam\" with adam_w_mode)");
  }
  const json params = opt.contains("params") ? r.object("optimizer.params", opt.at("params")) : json::object();
  // DeepSpeed's defaults where the file says nothing: torch.optim.AdamW's (torch_adam) or
  // FusedAdam's (its own) -- betas (0.9, 0.999), eps 1e-8, weight decay 0.01 or 0.
  bool torch_adam = false;
  if (params.contains("torch_adam") && !Reader::is_auto(params.at("torch_adam"))) torch_adam = r.boolean("optimizer.params.torch_adam", params.at("torch_adam"));
  bool adam_w_mode = true;
  if (params.contains("adam_w_mode") && !Reader::is_auto(params.at("adam_w_mode"))) adam_w_mode = r.boolean("optimizer.params.adam_w_mode", params.at("adam_w_mode"));
  if (t == "adamw") adam_w_mode = true;  // DeepSpeed's AdamW is AdamW whatever adam_w_mode says
  if (!params.contains("betas")) {
    r.set("beta1", 0.9, "optimizer.params.betas (DeepSpeed's default)");
    r.set("beta2", 0.999, "optimizer.params.betas (DeepSpeed's default)");
  }
  if (!params.contains("weight_decay")) {
    r.set("weight-decay", torch_adam ? 0.01 : 0.0, "optimizer.params.weight_decay (DeepSpeed's default)");
  }
  double weight_decay = torch_adam ? 0.01 : 0.0;
  for (const auto& [k, v] : params.items()) {
    const std::string key = "optimizer.params." + k;
    if (k == "adam_w_mode" || r.common(key, v)) continue;
    if (Reader::is_auto(v)) {
      if (k == "lr") r.automatic(key, "lr");
      else if (k == "betas") r.automatic(key, "beta1, beta2");
      else if (k == "eps") r.automatic(key, "adam_eps");
      else if (k == "weight_decay") r.automatic(key, "weight_decay"), weight_decay = -1;
      else r.unknown(key);
      continue;
    }
    if (k == "lr") r.set("lr", r.number(key, v), key);
    else if (k == "eps") r.set("adam-eps", r.number(key, v), key);
    else if (k == "weight_decay") r.set("weight-decay", weight_decay = r.number(key, v), key);
    else if (k == "betas") {
      if (!v.is_array() || v.size() != 2) r.refuse(key, "must be a list of two numbers (got " + v.dump() + ")");
      r.set("beta1", r.number(key, v[0]), key);
      r.set("beta2", r.number(key, v[1]), key);
    } else {
      r.unknown(key);
    }
  }
  if (!adam_w_mode && weight_decay != 0.0) {
    r.refuse("optimizer.params.adam_w_mode", "false (Adam with L2 regularisation) is not implemented; kiln's weight decay is "
                                             "AdamW's, decoupled (the same when weight_decay is 0)");
  }
}

// DeepSpeed's schedule parameters, with DeepSpeed's defaults for the absent ones.
void read_scheduler(Reader& r, const json& file) {
  if (!file.contains("scheduler")) return;  // the HF Trainer's own schedule: kiln's flags
  const json& sched = r.object("scheduler", file.at("scheduler"));
  for (const auto& [k, v] : sched.items())
    if (k != "type" && k != "params") r.unknown("scheduler." + k);
  const std::string type = sched.contains("type") ? r.text("scheduler.type", sched.at("type")) : "";
  std::string shape;
  if (type == "WarmupLR") shape = "warmup";
  else if (type == "WarmupDecayLR") shape = "warmup-decay";
  else if (type == "WarmupCosineLR") shape = "warmup-cosine";
  else r.refuse("scheduler.type", "'" + type + "' is not implemented (kiln has WarmupLR, WarmupDecayLR, WarmupCosineLR)");
  r.set("lr-schedule", shape, "scheduler.type");
  const json params = sched.contains("params") ? r.object("scheduler.params", sched.at("params")) : json::object();
  const std::set<std::string> known = shape == "warmup-cosine"
      ? std::set<std::string>{"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type"}
      : shape == "warmup" ? std::set<std::string>{"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"}
                          : std::set<std::string>{"total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"};
  for (const auto& [k, v] : params.items())
    if (!known.count(k) && k != "last_batch_iteration") r.unknown("scheduler.params." + k);
  auto param = [&](const std::string& k) -> const json* { return params.contains(k) ? &params.at(k) : nullptr; };
  const std::string p = "scheduler.params.";

  // warmup_num_steps: default 1000; "auto": kiln's --warmup.
  if (const json* v = param("warmup_num_steps"); v && Reader::is_auto(*v)) r.automatic(p + "warmup_num_steps", "warmup");
  else {
    const int64_t w = v ? r.integer(p + "warmup_num_steps", *v) : 1000;
    if (w <= 0) r.refuse(p + "warmup_num_steps", "must be a positive whole number, as DeepSpeed requires (got " + std::to_string(w) + ")");
    r.set("warmup", w, v ? p + "warmup_num_steps" : p + "warmup_num_steps (DeepSpeed's default)");
  }
  // warmup_type: default "log".
  if (const json* v = param("warmup_type"); v && Reader::is_auto(*v)) r.automatic(p + "warmup_type", "warmup_type");
  else {
    const std::string w = v ? r.text(p + "warmup_type", *v) : "log";
    if (w != "log" && w != "linear") r.refuse(p + "warmup_type", "must be \"log\" or \"linear\" (got \"" + w + "\")");
    r.set("warmup-type", w, v ? p + "warmup_type" : p + "warmup_type (DeepSpeed's default)");
  }
  // total_num_steps: required by DeepSpeed; "auto": kiln's --steps.
  if (shape != "warmup") {
    const json* v = param("total_num_steps");
    if (!v) r.refuse(p + "total_num_steps", "is required by " + type);
    if (Reader::is_auto(*v)) r.automatic(p + "total_num_steps", "lr_decay_steps");
    else r.set("lr-decay-steps", r.integer(p + "total_num_steps", *v), p + "total_num_steps");
  }
  if (shape == "warmup-cosine") {
    // The peak is the optimizer's lr; the start and the floor are ratios of it (applied after the flags).
    if (const json* v = param("warmup_min_ratio"); v && Reader::is_auto(*v)) r.automatic(p + "warmup_min_ratio", "warmup_start_lr");
    else r.set("warmup-min-ratio", v ? r.number(p + "warmup_min_ratio", *v) : 0.0, p + "warmup_min_ratio");
    if (const json* v = param("cos_min_ratio"); v && Reader::is_auto(*v)) r.automatic(p + "cos_min_ratio", "min_lr");
    else r.set("cos-min-ratio", v ? r.number(p + "cos_min_ratio", *v) : 1e-4, p + "cos_min_ratio");
    return;
  }
  // warmup_min_lr: default 0, and "auto" is 0 as the HF Trainer fills it.
  if (const json* v = param("warmup_min_lr"); v && Reader::is_auto(*v)) {
    r.automatic(p + "warmup_min_lr", "warmup_start_lr");
    r.set("warmup-start-lr", 0.0, p + "warmup_min_lr (auto: 0, as the HF Trainer fills it)");
  } else {
    r.set("warmup-start-lr", v ? r.number(p + "warmup_min_lr", *v) : 0.0, p + "warmup_min_lr");
  }
  // warmup_max_lr: the peak (DeepSpeed's scheduler overrides the optimizer's lr). Default: the
  // optimizer's lr for WarmupLR, 0.001 for WarmupDecayLR; "auto": kiln's --lr.
  if (const json* v = param("warmup_max_lr"); v && Reader::is_auto(*v)) r.automatic(p + "warmup_max_lr", "lr");
  else if (v) r.set("lr", r.number(p + "warmup_max_lr", *v), p + "warmup_max_lr");
  else if (shape == "warmup-decay") r.set("lr", 0.001, p + "warmup_max_lr (DeepSpeed's default)");
}

void read_zero(Reader& r, const json& file) {
  if (!file.contains("zero_optimization")) return;
  const json& z = r.object("zero_optimization", file.at("zero_optimization"));
  int64_t stage = -1;
  bool optimizer_cpu = false, param_cpu = false;
  for (const auto& [k, v] : z.items()) {
    const std::string key = "zero_optimization." + k;
    if (r.common(key, v)) continue;
    if (Reader::is_auto(v)) {
      if (k == "stage") r.automatic(key, "zero");
      else if (k == "offload_optimizer" || k == "offload_param" || k == "cpu_offload") r.automatic(key, "offload");
      else r.unknown(key);
      continue;
    }
    if (k == "stage") {
      stage = r.integer(key, v);
      if (stage < 0 || stage > 3) r.refuse(key, "must be 0, 1, 2 or 3 (got " + v.dump() + ")");
      r.set("zero", stage, key);
    } else if (k == "cpu_offload") {  // DeepSpeed's old spelling of offload_optimizer.device "cpu"
      optimizer_cpu |= r.boolean(key, v);
    } else if (k == "offload_optimizer" || k == "offload_param") {
      const json& o = r.object(key, v);
      std::string device = "none";
      for (const auto& [ok, ov] : o.items()) {
        const std::string okey = key + "." + ok;
        if (r.common(okey, ov)) continue;
        if (ok == "device") {
          device = Reader::is_auto(ov) ? "auto" : r.text(okey, ov);
        } else if (ok == "pipeline" || ok == "pipeline_read" || ok == "pipeline_write") {
          r.accepted(okey, "kiln does not offload to NVMe");
        } else {
          r.unknown(okey);
        }
      }
      if (device == "nvme") r.refuse(key + ".device", "\"nvme\" is not implemented: kiln offloads to host memory (\"cpu\")");
      if (device == "auto") r.automatic(key + ".device", "offload");
      else if (device != "cpu" && device != "none") r.refuse(key + ".device", "must be \"cpu\" or \"none\" (got \"" + device + "\")");
      (k == "offload_param" ? param_cpu : optimizer_cpu) |= device == "cpu";
    } else {
      r.unknown(key);
    }
  }
  if (param_cpu && stage != 3) {
    r.refuse("zero_optimization.offload_param", "offloads parameters, which only stage 3 shards (stage is " +
                                                (stage < 0 ? std::string("not given") : std::to_string(stage)) + ")");
  }
  // kiln's --offload all moves the parameters and the optimizer state; DeepSpeed's offload_param
  // alone keeps the optimizer on the device -- kiln offloads both then (a placement, not numerics).
  if (param_cpu) {
    r.set("offload", "all", "zero_optimization.offload_param.device");
    if (!optimizer_cpu) r.notice("zero_optimization.offload_param without offload_optimizer: kiln's --offload all moves the optimizer state to the host too");
  } else if (optimizer_cpu) {
    r.set("offload", "optimizer", "zero_optimization.offload_optimizer.device");
  }
}

void read_batch(Reader& r, const json& file, DeepSpeedSettings& ds) {
  auto take = [&](const char* key, std::optional<int64_t>& out, bool* is_auto) {
    if (!file.contains(key)) return;
    const json& v = file.at(key);
    if (Reader::is_auto(v)) {
      if (is_auto) *is_auto = true;
      return;
    }
    out = r.integer(key, v);
    if (*out < 1) r.refuse(key, "must be at least 1 (got " + v.dump() + ")");
  };
  take("train_batch_size", ds.train_batch_size, nullptr);
  take("train_micro_batch_size_per_gpu", ds.micro_batch, &ds.micro_auto);
  take("gradient_accumulation_steps", ds.grad_accum, &ds.accum_auto);
  if (file.contains("train_batch_size") && Reader::is_auto(file.at("train_batch_size"))) r.automatic("train_batch_size", "micro_batch x grad_accum x data-parallel ranks");
  if (ds.micro_auto) r.automatic("train_micro_batch_size_per_gpu", "micro_batch");
  if (ds.accum_auto) r.automatic("gradient_accumulation_steps", "grad_accum");
}

}  // namespace

bool deepspeed_structural_flag(const std::string& flag) {
  return flag == "zero" || flag == "offload" || flag == "precision" || flag == "tp";
}

DeepSpeedSettings read_deepspeed_config(const std::string& path) {
  DeepSpeedSettings ds;
  ds.path = path;
  std::ifstream in(path);
  if (!in) throw ConfigError("--deepspeed " + path + ": cannot open the file");
  json file;
  try {
    file = json::parse(in);
  } catch (const json::parse_error& e) {
    throw ConfigError("--deepspeed " + path + ": malformed JSON: " + e.what());
  }
  Reader r(ds);
  if (!file.is_object()) r.refuse("(top level)", "must be a JSON object");
  read_precision(r, file);
  read_optimizer(r, file);
  read_scheduler(r, file);
  read_zero(r, file);
  read_batch(r, file, ds);
  static const std::set<std::string> sections = {"fp16", "bf16", "bfloat16", "optimizer", "scheduler", "zero_optimization",
                                                 "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"};
  for (const auto& [k, v] : file.items()) {
    if (sections.count(k) || r.common(k, v)) {
      if (k == "steps_per_print" && !Reader::is_auto(v)) {
        const int64_t n = r.integer(k, v);
        if (n < 1) r.refuse(k, "must be at least 1");
        r.set("log-every", n, k);
      }
      continue;
    }
    if (k == "gradient_clipping") {
      if (Reader::is_auto(v)) r.automatic(k, "grad_clip");
      else r.set("grad-clip", r.number(k, v), k);
    } else if (k == "activation_checkpointing") {
      const json& a = r.object(k, v);
      for (const auto& [ak, av] : a.items())
        if (!r.common(k + "." + ak, av)) r.unknown(k + "." + ak);
      r.set("activation-checkpointing", "full", k);
    } else if (k == "tensor_parallel") {
      const json& t = r.object(k, v);
      for (const auto& [tk, tv] : t.items()) {
        if (tk != "autotp_size") {
          r.unknown(k + "." + tk);
          continue;
        }
        if (Reader::is_auto(tv)) r.automatic(k + ".autotp_size", "tp");
        else r.set("tp", r.integer(k + "." + tk, tv), k + "." + tk);
      }
    } else {
      r.unknown(k);
    }
  }
  r.refuse_unknown();
  // DeepSpeed does not clip unless told to.
  if (!file.contains("gradient_clipping")) ds.values["grad-clip"] = 0.0, ds.from["grad-clip"] = "gradient_clipping (absent: DeepSpeed does not clip)";
  // WarmupCosineLR's ratios are applied once the lr is known (finish_deepspeed).
  for (const char* k : {"warmup-min-ratio", "cos-min-ratio"}) {
    auto it = ds.values.find(k);
    if (it == ds.values.end()) continue;
    (std::string(k) == "warmup-min-ratio" ? ds.warmup_min_ratio : ds.cos_min_ratio) = it->second.get<double>();
    ds.values.erase(it);
  }
  return ds;
}

void finish_deepspeed(const DeepSpeedSettings& ds, const std::set<std::string>& flags_given, int world_size,
                      TrainConfig& config) {
  const std::string file = "--deepspeed " + ds.path;
  // WarmupCosineLR: the warm-up start and the floor as ratios of the lr in use.
  if (ds.warmup_min_ratio && !flags_given.count("warmup-start-lr")) config.warmup_start_lr = *ds.warmup_min_ratio * config.lr;
  if (ds.cos_min_ratio && !flags_given.count("min-lr")) config.min_lr = *ds.cos_min_ratio * config.lr;

  // The batch, as DeepSpeed derives it (runtime/config.py): with dp data-parallel ranks,
  // train_batch_size = micro x accumulation x dp; two of the three give the third.
  const int64_t dp = MeshShape::resolve(world_size, static_cast<int>(config.tp), static_cast<int>(config.pp)).dp;
  std::optional<int64_t> micro = ds.micro_batch, accum = ds.grad_accum;
  if (ds.micro_auto || flags_given.count("micro-batch")) micro = config.micro_batch;
  if (ds.accum_auto || flags_given.count("grad-accum")) accum = config.grad_accum;
  if (ds.train_batch_size) {
    const int64_t t = *ds.train_batch_size;
    auto need = [&](bool ok, const std::string& what) {
      if (!ok) {
        throw ConfigError(file + ": train_batch_size " + std::to_string(t) + " " + what + " (" + std::to_string(dp) +
                          " data-parallel rank(s); docs/deepspeed.md)");
      }
    };
    if (micro && accum) {
      need(t == *micro * *accum * dp, "!= micro-batch " + std::to_string(*micro) + " x gradient accumulation " +
                                          std::to_string(*accum) + " x data-parallel ranks");
    } else if (micro) {
      need(t % (*micro * dp) == 0, "is not a multiple of micro-batch " + std::to_string(*micro) + " x data-parallel ranks");
      accum = t / (*micro * dp);
    } else if (accum) {
      need(t % (*accum * dp) == 0, "is not a multiple of gradient accumulation " + std::to_string(*accum) + " x data-parallel ranks");
      micro = t / (*accum * dp);
    } else {
      need(t % dp == 0, "is not a multiple of the data-parallel ranks");
      accum = 1;
      micro = t / dp;
    }
  }
  if (micro) config.micro_batch = *micro;
  if (accum) config.grad_accum = *accum;

  // steps_per_print beyond the run (a template's 2000 on a 20-step run) left the console without
  // a step line but the last: kiln keeps its own --log-every then, and says so.
  std::vector<std::string> notices = ds.notices;
  if (ds.from.count("log-every") && !flags_given.count("log-every") && config.steps > 0 && config.log_every > config.steps) {
    const int64_t kiln_default = TrainConfig().log_every;
    notices.push_back("steps_per_print " + std::to_string(config.log_every) + " is beyond --steps " + std::to_string(config.steps) +
                      ": the console keeps kiln's --log-every " + std::to_string(kiln_default) + " (give --log-every N to choose)");
    config.log_every = kiln_default;
  }

  // The record: every "auto" key with the value used, the notices.
  const json used = config.to_json();
  json autos = json::object();
  for (const auto& [key, setting] : ds.auto_keys) {
    if (key == "train_batch_size") autos[key] = config.micro_batch * config.grad_accum * dp;
    else if (key == "optimizer.params.betas") autos[key] = {config.beta1, config.beta2};
    else if (key == "scheduler.params.total_num_steps") autos[key] = config.resolved_lr_decay_steps();
    else if (key == "zero_optimization.offload_optimizer.device" || key == "zero_optimization.offload_param.device") autos[key] = config.offload;
    else if (std::string k = setting; std::replace(k.begin(), k.end(), '-', '_'), used.contains(k)) autos[key] = used.at(k);
    else autos[key] = setting;
  }
  config.deepspeed = ds.path;
  config.deepspeed_used = {{"file", ds.path}, {"auto", autos}, {"notices", notices}};
}

std::vector<std::string> deepspeed_console_lines(const nlohmann::json& deepspeed_used) {
  std::vector<std::string> lines;
  std::string accepted;
  int n = 0;
  for (const auto& item : deepspeed_used.value("notices", nlohmann::json::array())) {
    const std::string line = item.get<std::string>();
    const size_t at = line.find(kAccepted);
    if (at == std::string::npos) lines.push_back(line);
    else accepted += (n++ > 0 ? ", " : "") + line.substr(0, at);
  }
  if (n > 0) {
    lines.push_back(std::to_string(n) + " key(s) accepted that change nothing kiln does: " + accepted +
                    " (why: the config record's deepspeed.notices)");
  }
  return lines;
}

}  // namespace kiln
