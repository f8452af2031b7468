// launch/plan_cli.cpp -- `kiln plan` flags (cxxopts) and the dispatch of its modes.
#include "launch/plan_cli.h"

#include <cctype>
#include <cstdio>
#include <fstream>

#include <cxxopts.hpp>

#include "launch/flags.h"

#include "distributed/error.h"
#include "kernels/kernel_choice.h"
#include "models/flops.h"
#include "plan/compare.h"
#include "plan/report.h"

namespace kiln {

namespace {

struct FlagHelp {
  const char* name;
  const char* help;
};

// Grouped so that each mode can refuse the flags that do not belong to it.
const std::vector<FlagHelp> kModelFlags = {
    {"model", "model preset: tiny, tiny-moe, gpt2-124m, gpt2-124m-moe, gpt2-350m, gpt2-774m, gpt2-1.5b, gpt3-6.7b; "
              "tiny-llama, llama3-1b, llama3-8b, llama3-70b, mistral-7b, qwen2-0.5b, tiny-mixtral, mixtral-8x7b"},
    {"n-layer", "transformer blocks (overrides the preset)"},
    {"n-head", "attention heads"},
    {"n-kv-head", "key/value heads (default: n-head)"},
    {"d-model", "model width"},
    {"seq-len", "context length"},
    {"vocab-size", "vocabulary size (padded to a multiple of 128)"},
    {"dropout", "dropout probability (masks are kept when > 0)"},
    {"position", "learned (GPT-2: wpe) | rope (the Llama family: no position parameters)"},
    {"norm", "layernorm | rmsnorm"},
    {"mlp", "gelu | swiglu (three matrices)"},
    {"ffn-hidden", "feed-forward width (0: 4 x d-model for gelu, Llama's rule for swiglu)"},
    {"bias", "all | none | qkv (c_attn's only)"},
    {"tie-embeddings", "the output layer is the token embedding; =false: an lm_head of its own (default: the preset's)"},
    {"n-experts", "Mixture-of-Experts: experts per MoE layer (0: a dense model; every rank holds every expert, or E/ep with --ep)"},
    {"top-k", "MoE: experts per token (default 2)"},
    {"moe-every", "MoE: an MoE layer in blocks 0, N, 2N, ... (default 1)"},
    {"moe-capacity-factor", "MoE: capacity per expert and sequence, ceil(factor x k x T / E) (0: dropless); not in the cost"},
    {"moe-aux-loss-coef", "MoE: load-balancing loss weight; not in the cost, only passed to the suggested command"},
    {"moe-z-loss-coef", "MoE: router z-loss weight; not in the cost, only passed to the suggested command"},
};
const std::vector<FlagHelp> kClusterFlags = {
    {"gpu", "device preset: h100, h200, a100, v100, mi250x (default h100; --compare: from the log's device)"},
    {"nodes", "nodes (default 1)"},
    {"gpus-per-node", "devices per node (default: the preset's, 8)"},
    {"device-memory-gb", "memory per device, GB (1e9 bytes)"},
    {"peak-tflops", "dense BF16 peak per device, TFLOP/s"},
    {"achieved", "fraction of peak the step's math sustains (default 0.4; --compare prints a calibrated one)"},
    {"watts", "average power per device, W"},
    {"intra-node-gbs", "collective bus bandwidth inside a node, GB/s"},
    {"inter-node-gbs", "collective bus bandwidth between nodes, per device, GB/s"},
    {"host-link-gbs", "host <-> device bandwidth per device (offload), GB/s"},
    {"host-memory-gb", "host memory per node (offload), GB"},
    {"host-adam-gparams", "host AdamW rate per node (offload), 1e9 parameters/s"},
    {"disk-gbs", "the rate rank 0 writes a checkpoint at, GB/s (default 2)"},
};
const std::vector<FlagHelp> kLayoutFlags = {
    {"dp", "data-parallel size (default: devices / (cp x tp x pp))"},
    {"tp", "tensor-parallel size (default 1)"},
    {"pp", "pipeline-parallel size (default 1)"},
    {"cp", "context-parallel size: each sequence split over cp ranks, 2 cp chunks (default 1)"},
    {"ep", "expert-parallel size: each MoE layer's experts divided over ep dp ranks, tokens moved by all-to-all; divides dp and "
           "--n-experts; with DDP and tp, not ZeRO or pp (default 1)"},
    {"pp-split", "blocks per pipeline stage, e.g. 4,4,3 (default: balanced by count, extras to the middle stages; as kiln train)"},
    {"pp-virtual", "model chunks a pipeline stage holds: the interleaved 1F1B schedule, bubble / V (default 1; as kiln train)"},
    {"pp-schedule", "auto | 1f1b | interleaved | zb-h1 (as kiln train)"},
    {"zero", "ZeRO stage 0-3 (default 0)"},
    {"offload", "none | optimizer | all (default none)"},
    {"zero-accum", "ZeRO-2/3 gradient accumulation: reduce (every micro-step) | local (default reduce)"},
    {"activation-checkpointing", "none | selective | full (default none)"},
    {"micro-batch", "sequences per micro-batch per device (default 8)"},
    {"grad-accum", "micro-batches per optimizer step per dp rank (default 1)"},
    {"param-dtype", "working weights: auto | fp32 | bf16 | fp16 (default auto: the compute precision; 16-bit: fp32 masters with the optimizer state)"},
    {"reduce-dtype", "the dp gradient reduction (DDP's all-reduce, ZeRO's reduce-scatters): fp32 | bf16 (default fp32)"},
    {"main-grads", "auto | always: fp32 main gradients for 16-bit weights always, or only where something accumulates or reduces (default auto, as kiln train)"},
};
// Layout switches without a value (cxxopts booleans).
const std::vector<FlagHelp> kLayoutSwitches = {
    {"sp", "sequence parallelism inside the tp group (needs --tp 2 or more)"},
    {"offload-delayed-update", "with --offload optimizer: the host AdamW under the next step's forwards and backwards (as kiln train)"},
};
const std::vector<FlagHelp> kRunFlags = {
    {"precision", "fp32 | bf16 | fp16 | fp8 (default bf16; fp8: the block layers' products at the device's 8-bit peak, "
                  "memory as bf16's)"},
    {"fp8-recipe", "with --precision fp8: tensorwise | rowwise (rowwise also puts the experts in float8)"},
    {"fp8-filter", "with --precision fp8: auto | all (which layers, as kiln train's)"},
    {"attention", "auto | flash | math: the attention kernel, for activation memory (default auto = flash)"},
    {"kernels", "fused | reference: kiln's CUDA kernels or the composite ops, for activation memory and tp's bytes (default fused, kiln train's on a GPU)"},
    {"save-every", "steps between checkpoints: their stall, per step, in the step time (default 0: none)"},
    {"async-save", "with --save-every: checkpoints written in the background, as kiln train's default (true): the stall is a "
                   "host copy, and each rank's snapshot pool is held in host memory; =false: synchronous saves"},
};
const std::vector<FlagHelp> kTrainingFlags = {
    {"params", "P alone (no model shape): training compute, runtime and energy only"},
    {"tokens", "training tokens D (default 20 P, compute-optimal)"},
};
const std::vector<FlagHelp> kSearchFlags = {
    {"global-batch", "--search: sequences per optimizer step (default 8 per device)"},
    {"max-micro-batch", "--search: largest micro-batch tried (default: no limit)"},
    {"top", "--search: layouts shown (default 5)"},
};

class Values {
 public:
  explicit Values(const cxxopts::ParseResult& r) : r_(r) {}
  bool has(const char* name) const { return r_.count(name) > 0; }
  std::string text(const char* name) const { return r_[name].as<std::string>(); }
  int64_t integer(const char* name) const {
    const std::string t = text(name);
    try {
      size_t used = 0;
      const long long v = std::stoll(t, &used);
      if (used == t.size()) return v;
    } catch (const std::exception&) {
    }
    throw ConfigError(std::string("--") + name + ": '" + t + "' is not an integer");
  }
  // A bare switch (its implicit "true"), =true or =false.
  bool boolean(const char* name) const {
    const std::string t = text(name);
    if (t != "true" && t != "false") throw ConfigError(std::string("--") + name + " takes true or false (got '" + t + "')");
    return t == "true";
  }
  double number(const char* name) const {
    const std::string t = text(name);
    try {
      size_t used = 0;
      const double v = std::stod(t, &used);
      if (used == t.size()) return v;
    } catch (const std::exception&) {
    }
    throw ConfigError(std::string("--") + name + ": '" + t + "' is not a number");
  }
  // The first flag of `group` that was given, or "".
  std::string any_of(const std::vector<FlagHelp>& group) const {
    for (const auto& f : group)
      if (has(f.name)) return f.name;
    return "";
  }

 private:
  const cxxopts::ParseResult& r_;
};

void refuse(const Values& v, const std::vector<FlagHelp>& group, const std::string& why) {
  const std::string f = v.any_of(group);
  if (!f.empty()) throw ConfigError("--" + f + " " + why);
}

std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// The preset a logged device name belongs to (for --compare without --gpu); h100 otherwise.
// The name is in the first record (the config record); compare_with_log checks the file itself.
std::string preset_for_device(const std::string& path) {
  std::ifstream in(path);
  std::string first;
  if (!in || !std::getline(in, first)) return "h100";
  first = lower(first);
  for (const char* key : {"h200", "h100", "a100", "v100", "mi250x"})
    if (first.find(std::string("\"device\":\"nvidia ") + key) != std::string::npos ||
        first.find(std::string("\"device\":\"amd instinct ") + key) != std::string::npos)
      return key;
  return "h100";
}

// A word the shell reads back as itself.
std::string shell_word(const std::string& w) {
  if (!w.empty() && w.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._,=/:+-") == std::string::npos)
    return w;
  std::string q = "'";
  for (char ch : w) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

// `kiln plan` with the arguments given less the layout's flags and --json, searching at `global_batch`
// sequences a step: the command that finds the layouts of the same model and cluster that fit.
std::string search_command(const std::vector<std::string>& args, int64_t global_batch) {
  auto in = [](const std::vector<FlagHelp>& group, const std::string& name) {
    for (const auto& f : group)
      if (name == f.name) return true;
    return false;
  };
  std::string out = "kiln plan";
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const std::string name = a.rfind("--", 0) == 0 ? a.substr(2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2) : "";
    if (name == "json" || in(kLayoutSwitches, name)) continue;
    if (in(kLayoutFlags, name)) {
      if (a.find('=') == std::string::npos) ++i;  // its value, the next word
      continue;
    }
    out += " " + shell_word(a);
  }
  return out + " --search --global-batch " + std::to_string(global_batch);
}

}  // namespace

PlanArgs parse_plan_args(const std::vector<std::string>& args) {
  cxxopts::Options opts("kiln plan", "Memory, communication, time and energy of training a GPT on a cluster.");
  opts.add_options()("h,help", "show this help");
  opts.add_options("mode")("search", "rank the layouts that fit")("compare", "a kiln train --log-json file: predicted vs measured (give it again for more logs: their reports in turn, JSON an array)",
                                                                  cxxopts::value<std::string>())(
      "json", "print JSON with every figure")("attention-flops", "add the attention term 12 L d T per token to T = 6 P D");
  auto add = [&](const char* group, const std::vector<FlagHelp>& flags) {
    for (const auto& f : flags) {
      auto value = cxxopts::value<std::string>();
      const std::string name = f.name;
      if (name == "tie-embeddings" || name == "async-save") value->implicit_value("true");  // bare, as kiln train's
      opts.add_options(group)(f.name, f.help, value);
    }
  };
  add("model", kModelFlags);
  add("cluster", kClusterFlags);
  add("layout", kLayoutFlags);
  for (const auto& f : kLayoutSwitches) opts.add_options("layout")(f.name, f.help);
  add("run", kRunFlags);
  add("training", kTrainingFlags);
  add("search", kSearchFlags);
  const auto result = parse_or_throw(opts, args, "plan", "");
  PlanArgs out;
  if (result.count("help")) {
    out.help = true;
    out.help_text = opts.help({"", "mode", "model", "cluster", "layout", "run", "training", "search"});
    return out;
  }
  const Values v(result);
  out.json = v.has("json");
  out.attention_flops = v.has("attention-flops");
  out.peak_given = v.has("peak-tflops");

  // ---- mode
  if (v.has("compare")) {
    out.mode = PlanArgs::Mode::Compare;
    // every --compare given, in order (cxxopts keeps the last one): several logs in one run
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i] == "--compare" && i + 1 < args.size()) out.compare_paths.push_back(args[++i]);
      else if (args[i].rfind("--compare=", 0) == 0) out.compare_paths.push_back(args[i].substr(10));
    }
    if (out.compare_paths.empty()) out.compare_paths.push_back(v.text("compare"));
    const std::string why = "does not go with --compare (the model and layout come from the log)";
    refuse(v, kModelFlags, why);
    refuse(v, kLayoutFlags, why);
    refuse(v, kLayoutSwitches, why);
    refuse(v, kRunFlags, why);
    refuse(v, kTrainingFlags, why);
    refuse(v, kSearchFlags, why);
    if (v.has("search")) throw ConfigError("--search does not go with --compare");
    if (out.attention_flops) throw ConfigError("--attention-flops does not go with --compare");
  } else if (v.has("search")) {
    out.mode = PlanArgs::Mode::Search;
    refuse(v, kLayoutFlags, "does not go with --search (the search chooses the layout)");
    refuse(v, kLayoutSwitches, "does not go with --search (the search chooses the layout)");
    if (v.has("params")) throw ConfigError("--search needs a model shape (--model, or --n-layer --d-model ...), not --params");
  } else if (v.has("params")) {
    out.mode = PlanArgs::Mode::Totals;
    refuse(v, kModelFlags, "does not go with --params (P alone gives training totals; a shape gives the full plan)");
    refuse(v, kLayoutFlags, "needs a model shape (--model ...), not --params");
    refuse(v, kLayoutSwitches, "needs a model shape (--model ...), not --params");
    refuse(v, kRunFlags, "needs a model shape (--model ...), not --params");
    if (out.attention_flops) throw ConfigError("--attention-flops needs a model shape (--model ...), not --params");
  } else {
    out.mode = PlanArgs::Mode::Layout;
  }
  if (out.mode != PlanArgs::Mode::Search) refuse(v, kSearchFlags, "only goes with --search");
  if ((out.mode == PlanArgs::Mode::Layout || out.mode == PlanArgs::Mode::Search) && v.any_of(kModelFlags).empty()) {
    throw ConfigError("kiln plan: give a model (--model NAME, or --n-layer --d-model ...), --params P, or --compare FILE");
  }

  // ---- model
  if (v.has("model")) out.model = GPTConfig::preset(v.text("model"));
  if (v.has("n-layer")) out.model.n_layer = v.integer("n-layer");
  if (v.has("n-head")) {
    out.model.n_head = v.integer("n-head");
    if (!v.has("n-kv-head")) out.model.n_kv_head = out.model.n_head;
  }
  if (v.has("n-kv-head")) out.model.n_kv_head = v.integer("n-kv-head");
  if (v.has("d-model")) out.model.d_model = v.integer("d-model");
  if (v.has("seq-len")) out.model.seq_len = v.integer("seq-len");
  if (v.has("vocab-size")) out.model.vocab_size = v.integer("vocab-size");
  if (v.has("dropout")) out.model.dropout = v.number("dropout");
  if (v.has("position")) out.model.position = v.text("position");
  if (v.has("norm")) out.model.norm = v.text("norm");
  if (v.has("mlp")) out.model.mlp = v.text("mlp");
  if (v.has("ffn-hidden")) out.model.ffn_hidden = v.integer("ffn-hidden");
  if (v.has("bias")) out.model.bias = v.text("bias");
  if (v.has("tie-embeddings")) out.model.tie_embeddings = v.boolean("tie-embeddings");
  if (v.has("n-experts")) out.model.n_experts = v.integer("n-experts");
  if (v.has("top-k")) out.model.top_k = v.integer("top-k");
  if (v.has("moe-every")) out.model.moe_every = v.integer("moe-every");
  if (v.has("moe-capacity-factor")) out.model.moe_capacity_factor = v.number("moe-capacity-factor");
  if (v.has("moe-aux-loss-coef")) out.model.moe_aux_loss_coef = v.number("moe-aux-loss-coef");
  if (v.has("moe-z-loss-coef")) out.model.moe_z_loss_coef = v.number("moe-z-loss-coef");
  if (out.mode == PlanArgs::Mode::Layout || out.mode == PlanArgs::Mode::Search) out.model.validate();
  if (out.mode == PlanArgs::Mode::Totals) {
    out.params = v.number("params");
    if (!(out.params > 0)) throw ConfigError("--params must be positive (got " + v.text("params") + ")");
  }
  if (v.has("tokens")) {
    out.tokens = v.number("tokens");
    if (!(out.tokens > 0)) throw ConfigError("--tokens must be positive (got " + v.text("tokens") + ")");
  }

  // ---- cluster: a preset (--gpu; --compare: each log's device) and the fields given
  auto cluster_of = [&](const std::string& gpu) {
    plan::ClusterSpec c = plan::cluster_preset(gpu);
    if (v.has("nodes")) c.nodes = v.integer("nodes");
    if (v.has("gpus-per-node")) c.devices_per_node = v.integer("gpus-per-node");
    if (v.has("device-memory-gb")) c.device_memory = v.number("device-memory-gb") * 1e9;
    if (v.has("peak-tflops")) c.peak_flops = v.number("peak-tflops") * 1e12;
    if (v.has("achieved")) c.achieved = v.number("achieved");
    if (v.has("watts")) c.watts = v.number("watts");
    if (v.has("intra-node-gbs")) c.intra_node_busbw = v.number("intra-node-gbs") * 1e9;
    if (v.has("inter-node-gbs")) c.inter_node_busbw = v.number("inter-node-gbs") * 1e9;
    if (v.has("host-link-gbs")) c.host_link = v.number("host-link-gbs") * 1e9;
    if (v.has("host-memory-gb")) c.host_memory = v.number("host-memory-gb") * 1e9;
    if (v.has("host-adam-gparams")) c.host_adam_rate = v.number("host-adam-gparams") * 1e9;
    if (v.has("disk-gbs")) c.disk_write = v.number("disk-gbs") * 1e9;
    if (gpu != "custom" && v.has("gpu")) c.name = gpu;
    c.validate();
    return c;
  };
  const std::string gpu = v.has("gpu") ? lower(v.text("gpu")) : "h100";
  out.cluster = cluster_of(gpu);
  for (const auto& path : out.compare_paths) out.compare_clusters.push_back(v.has("gpu") ? out.cluster : cluster_of(preset_for_device(path)));
  const plan::ClusterSpec& c = out.cluster;

  // ---- how the run executes (every candidate of a search too)
  plan::Layout base;
  const std::string precision = v.has("precision") ? v.text("precision") : "bf16";
  if (precision != "fp32" && precision != "bf16" && precision != "fp16" && precision != "fp8") {
    throw ConfigError("--precision must be fp32, bf16, fp16 or fp8 (got '" + precision + "')");
  }
  base.compute_bytes = precision == "fp32" ? 4 : 2;
  if (precision == "fp8") {
    const std::string recipe = v.has("fp8-recipe") ? v.text("fp8-recipe") : "tensorwise";
    const std::string filter = v.has("fp8-filter") ? v.text("fp8-filter") : "auto";
    if (recipe != "tensorwise" && recipe != "rowwise") throw ConfigError("--fp8-recipe must be tensorwise or rowwise (got '" + recipe + "')");
    if (filter != "auto" && filter != "all") throw ConfigError("--fp8-filter must be auto or all (got '" + filter + "')");
    base.float8 = recipe == "rowwise" ? 2 : 1;
    base.fp8_filter_all = filter == "all";
  }
  if (v.has("save-every")) base.save_every = v.integer("save-every");
  if (v.has("async-save")) base.async_save = v.boolean("async-save");  // kiln train's default: true
  if (base.save_every < 0) throw ConfigError("--save-every must be at least 0 (got " + std::to_string(base.save_every) + ")");
  base.plain_loss = precision == "fp16";  // fp16's loss keeps whole logits (models/linear_cross_entropy.h)
  // Working weights (kiln train's --param-dtype): auto, the default, is the compute precision.
  base.param_bytes = base.compute_bytes;
  for (const char* flag : {"param-dtype", "reduce-dtype"}) {
    if (!v.has(flag)) continue;
    const std::string d = v.text(flag), f = flag;
    if (f == "param-dtype" && d == "auto") continue;
    if (d != "fp32" && d != "bf16" && !(d == "fp16" && f == "param-dtype")) {
      throw ConfigError("--" + f + " must be " + (f == "param-dtype" ? "auto, fp32, bf16 or fp16" : "fp32 or bf16") + " (got '" + d + "')");
    }
    (f == "param-dtype" ? base.param_bytes : base.reduce_bytes) = d == "fp32" ? 4 : 2;
  }
  if (v.has("main-grads")) {
    const std::string mg = v.text("main-grads");
    if (mg != "auto" && mg != "always") throw ConfigError("--main-grads must be auto or always (got '" + mg + "')");
    base.main_grads_always = mg == "always";
  }
  const std::string attention = v.has("attention") ? v.text("attention") : "auto";
  base.attention = attention == "auto" ? plan::Attention::Flash : plan::parse_attention(attention);
  base.dropout = out.model.dropout > 0;
  base.fused_kernels = parse_kernels(v.has("kernels") ? v.text("kernels") : "fused") == Kernels::fused;

  // ---- layout
  if (out.mode == PlanArgs::Mode::Layout) {
    plan::Layout& l = out.layout;
    l = base;
    if (v.has("tp")) l.tp = v.integer("tp");
    if (v.has("pp")) l.pp = v.integer("pp");
    if (v.has("pp-split")) l.pp_split = v.text("pp-split");
    if (v.has("pp-virtual")) l.pp_virtual = v.integer("pp-virtual");
    if (v.has("pp-schedule")) {
      const std::string sched = v.text("pp-schedule");
      if (sched != "auto" && sched != "1f1b" && sched != "interleaved" && sched != "zb-h1")
        throw ConfigError("--pp-schedule must be auto, 1f1b, interleaved or zb-h1 (got '" + sched + "')");
      l.zero_bubble = sched == "zb-h1";
    }
    if (v.has("cp")) l.cp = v.integer("cp");
    if (v.has("ep")) l.ep = v.integer("ep");
    l.sp = v.has("sp");
    if (l.tp < 1 || l.pp < 1 || l.cp < 1) throw ConfigError("--tp, --pp and --cp must be at least 1");
    if (v.has("dp")) {
      l.dp = v.integer("dp");
    } else {
      if (c.devices() % (l.cp * l.tp * l.pp) != 0) {
        throw ConfigError((l.cp > 1 ? "--cp " + std::to_string(l.cp) + " x " : std::string()) + "--tp " + std::to_string(l.tp) +
                          " x --pp " + std::to_string(l.pp) + " does not divide the cluster's " + std::to_string(c.devices()) +
                          " devices");
      }
      l.dp = c.devices() / (l.cp * l.tp * l.pp);
    }
    if (v.has("zero")) l.zero = static_cast<int>(v.integer("zero"));
    if (v.has("offload")) l.offload = plan::parse_offload(v.text("offload"));
    if (v.has("zero-accum")) l.zero_accum = plan::parse_zero_accum(v.text("zero-accum"));
    l.delayed_update = v.has("offload-delayed-update");
    if (v.has("activation-checkpointing")) l.recompute = plan::parse_recompute(v.text("activation-checkpointing"));
    l.micro_batch = v.has("micro-batch") ? v.integer("micro-batch") : 8;
    if (v.has("grad-accum")) l.grad_accum = v.integer("grad-accum");
    l.validate(out.model, c);
    out.search_command = search_command(args, l.micro_batch * l.grad_accum * l.dp);
  }

  // ---- search space
  if (out.mode == PlanArgs::Mode::Search) {
    out.space.base = base;
    out.space.global_batch = v.has("global-batch") ? v.integer("global-batch") : 8 * c.devices();
    if (v.has("max-micro-batch")) out.space.max_micro_batch = v.integer("max-micro-batch");
    if (v.has("top")) out.space.top = v.integer("top");
    if (out.space.global_batch < 1) throw ConfigError("--global-batch must be at least 1 (got " + std::to_string(out.space.global_batch) + ")");
    if (out.space.max_micro_batch < 0) throw ConfigError("--max-micro-batch must be positive");
    if (out.space.top < 1) throw ConfigError("--top must be at least 1 (got " + std::to_string(out.space.top) + ")");
  }
  return out;
}

int run_plan(const PlanArgs& a) {
  using namespace kiln::plan;
  auto emit = [&](const nlohmann::json& j, const std::string& text) {
    if (a.json) std::printf("%s\n", j.dump(2).c_str());
    else std::fputs(text.c_str(), stdout);
  };
  // P of T = 6 P D: N_active less the position embedding (models/flops.h; all parameters for
  // a dense model, k experts per MoE layer for an MoE one)
  const double P = static_cast<double>(a.model.num_active_params_non_embedding_pos());
  const double attention_term = a.attention_flops ? flops_per_token(a.model) - 6.0 * P : 0.0;
  switch (a.mode) {
    case PlanArgs::Mode::Totals: {
      const TrainingTotals t = training_totals(a.params, a.tokens, 0, a.cluster);
      emit({{"type", "totals"}, {"cluster", cluster_json(a.cluster)}, {"training", totals_json(t)}}, totals_text(t, a.cluster));
      break;
    }
    case PlanArgs::Mode::Layout: {
      const Plan p = make_plan(a.model, a.cluster, a.layout);
      const TrainingTotals t = training_totals(P, a.tokens, attention_term, a.cluster);
      const LayoutTotals run = layout_totals(p, t.tokens);
      if (p.fits()) {
        emit(plan_json(p, t, run), plan_text(p, t, run));
        break;
      }
      // Memory and traffic, no step time (plan_text), and where to look instead: on stdout with
      // the plan, and as one line on stderr (under --json too).
      const std::string why = does_not_fit(p);
      nlohmann::json j = plan_json(p, t, run);
      j["does_not_fit"] = {{"reason", why}, {"search_command", a.search_command}};
      emit(j, plan_text(p, t, run) + "\n" + why + "\n  layouts that fit: " + a.search_command + "\n");
      std::fflush(stdout);
      std::fprintf(stderr, "kiln: plan: %s; for layouts that fit: %s\n", why.c_str(), a.search_command.c_str());
      return kExitPlanDoesNotFit;
    }
    case PlanArgs::Mode::Search: {
      const SearchResult r = search(a.model, a.cluster, a.space);
      const TrainingTotals t = training_totals(P, a.tokens, attention_term, a.cluster);
      emit(search_json(r, t, t.tokens), search_text(r, a.cluster, a.space.global_batch));
      break;
    }
    case PlanArgs::Mode::Compare: {  // one log: its document; several: an array of them, in order
      nlohmann::json all = nlohmann::json::array();
      std::string text;
      for (size_t i = 0; i < a.compare_paths.size(); ++i) {
        const CompareResult r = compare_with_log(a.compare_paths[i], a.compare_clusters[i], a.peak_given);
        all.push_back(compare_json(r));
        text += (i > 0 ? "\n" : "") + compare_text(r);
      }
      emit(all.size() == 1 ? all[0] : all, text);
      break;
    }
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace kiln
