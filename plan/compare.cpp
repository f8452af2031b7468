// plan/compare.cpp -- read a kiln train JSONL log, predict the same run, set the two side by side.
#include "plan/compare.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "distributed/error.h"

namespace kiln::plan {

namespace {

using json = nlohmann::json;

// LibTorch's own libraries resident in a CPU process (docs/metrics.md: "about 0.4 GB"); the
// CPU's mem_gb is the whole process's high-water mark, a GPU's only the allocator's peak.
constexpr double kCpuProcessBase = 0.4e9;

template <typename T>
T need(const json& obj, const char* key, const std::string& where) {
  if (!obj.is_object() || !obj.contains(key) || obj.at(key).is_null()) {
    throw ConfigError(where + ": the config record has no '" + key + "'");
  }
  try {
    return obj.at(key).get<T>();
  } catch (const json::exception&) {
    throw ConfigError(where + ": the config record's '" + std::string(key) + "' has the wrong type");
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The run a config record describes: its model, its layout (plan/cost_model.h) and its nodes.
struct Run {
  GPTConfig model;
  Layout layout;
  int64_t nodes = 1;
};

Run run_of(const json& config, const std::string& where) {
  const json& c = config.contains("config") ? config.at("config") : json();
  const json& world = config.contains("world") ? config.at("world") : json();
  Run run;
  GPTConfig& model = run.model;
  model.n_layer = need<int64_t>(c, "n_layer", where);
  model.n_head = need<int64_t>(c, "n_head", where);
  model.n_kv_head = need<int64_t>(c, "n_kv_head", where);
  model.d_model = need<int64_t>(c, "d_model", where);
  model.seq_len = need<int64_t>(c, "seq_len", where);
  model.vocab_size = need<int64_t>(c, "vocab_size", where);
  model.dropout = c.value("dropout", 0.0);
  model.take_architecture(c);  // the Llama family's fields (absent from a GPT-2 run's record: GPT-2's)
  // Mixture-of-Experts (present only in an MoE run's record; absent: a dense model). The loss
  // coefficients change nothing the plan counts; they are read so that the model is the run's.
  model.n_experts = c.value("n_experts", int64_t{0});
  if (model.is_moe()) {
    model.top_k = need<int64_t>(c, "top_k", where);
    model.moe_every = need<int64_t>(c, "moe_every", where);
    model.moe_capacity_factor = c.value("moe_capacity_factor", model.moe_capacity_factor);
    model.moe_aux_loss_coef = c.value("moe_aux_loss_coef", model.moe_aux_loss_coef);
    model.moe_z_loss_coef = c.value("moe_z_loss_coef", model.moe_z_loss_coef);
  }

  // The device the run used: the record's device name ("cpu", or the GPU's), else the flag.
  const std::string device = config.contains("device") && config.at("device").is_string() ? config.at("device").get<std::string>()
                                                                                            : c.value("device", std::string("cpu"));
  const bool cpu = device == "cpu";
  Layout& l = run.layout;
  l.dp = need<int64_t>(world, "dp", where);
  l.tp = need<int64_t>(world, "tp", where);
  l.pp = need<int64_t>(world, "pp", where);
  // sequence / context parallelism: absent in logs from before them (false, 1)
  l.sp = world.is_object() && world.contains("sp") ? world.at("sp").get<bool>() : c.value("sp", false);
  l.cp = world.is_object() && world.contains("cp") ? world.at("cp").get<int64_t>() : c.value("cp", int64_t{1});
  l.pp_split = c.value("pp_split", std::string());
  l.pp_virtual = c.value("pp_virtual", int64_t{1});  // the interleaved schedule's chunks (absent: 1)
  l.zero_bubble = c.value("pp_schedule", std::string()) == "zb-h1";
  l.ep = c.value("ep", int64_t{1});  // expert parallelism (absent: 1, as kiln writes it)
  l.zero = static_cast<int>(need<int64_t>(c, "zero", where));
  l.offload = parse_offload(need<std::string>(c, "offload", where));
  l.zero_accum = parse_zero_accum(c.value("zero_accum", std::string("reduce")));
  l.delayed_update = c.value("offload_delayed_update", false);  // absent: a log from before the flag
  l.recompute = parse_recompute(need<std::string>(c, "activation_checkpointing", where));
  l.micro_batch = need<int64_t>(c, "micro_batch", where);
  l.grad_accum = need<int64_t>(c, "grad_accum", where);
  l.compute_bytes = need<std::string>(c, "precision", where) == "fp32" ? 4 : 2;
  if (need<std::string>(c, "precision", where) == "fp8") {  // kernels/float8.h: the recipe and the filter as the run had them
    l.float8 = c.value("fp8_recipe", std::string("tensorwise")) == "rowwise" ? 2 : 1;
    l.fp8_filter_all = c.value("fp8_filter", std::string("auto")) == "all";
  }
  // the loss's way (models/linear_cross_entropy.h): whole logits under fp16 or --loss-chunk-rows -1
  l.plain_loss = need<std::string>(c, "precision", where) == "fp16" || c.value("loss_chunk_rows", int64_t{0}) < 0;
  l.param_bytes = c.value("param_dtype", std::string("fp32")) == "fp32" ? 4 : 2;  // absent: a log from before the flag
  l.reduce_bytes = c.value("reduce_dtype", std::string("fp32")) == "fp32" ? 4 : 2;
  l.main_grads_always = c.value("main_grads", std::string("always")) == "always";  // absent: a kiln that always kept them
  l.dropout = model.dropout > 0;
  l.cpu = cpu;
  // the kernels that ran (the record's top-level "kernels"; absent: a kiln from before them)
  l.fused_kernels = !cpu && config.value("kernels", std::string("reference")) == "fused";
  // CPU SDPA runs its flash kernel only without dropout (grouped kv heads included: LibTorch
  // 2.11's CPU flash kernel takes enable_gqa; measured, tests/test_activation_checkpoint.cpp).
  l.attention = (!cpu || !l.dropout) ? Attention::Flash : Attention::Math;
  // kiln's rule (runtime/trainer/trainer.cpp): with dp x cp = 1 the DDP wrapper exists only when a
  // backend was named (mpirun -np 1 --backend mpi|nccl); ZeRO always has its communicator.
  l.comm_in_world_of_one = world.value("backend", std::string("none")) != "none" &&
                           (c.value("backend", std::string("auto")) != "auto" || l.zero > 0);
  l.base_bytes = cpu ? kCpuProcessBase : 0.0;
  // checkpoints: --save-dir makes the run save (at its end at least); --async-save (absent: a
  // kiln from before it, synchronous) holds the snapshot pool from set-up
  l.saves = !c.value("save_dir", std::string()).empty();
  l.save_every = c.value("save_every", int64_t{0});
  l.async_save = c.value("async_save", false);

  // The nodes the run spanned (the config record's topology; logs from before it: one node).
  const json& topo = config.contains("topology") ? config.at("topology") : json::object();
  run.nodes = topo.is_object() ? topo.value("nodes", int64_t{1}) : 1;
  if (run.nodes < 1 || l.devices() % run.nodes != 0) {
    throw ConfigError(where + ": the config record's topology (" + std::to_string(run.nodes) + " nodes) does not divide " +
                      std::to_string(l.devices()) + " ranks");
  }
  return run;
}

}  // namespace

double predicted_activation_bytes(const nlohmann::json& config_record) {
  const std::string where = "predicted_activation_bytes";
  const Run run = run_of(config_record, where);
  // Activations depend on the model and the layout only; the cluster is there to validate.
  ClusterSpec cluster = cluster_preset("h100");
  cluster.nodes = run.nodes;
  cluster.devices_per_node = run.layout.devices() / run.nodes;
  return make_plan(run.model, cluster, run.layout).stages[0].activation_bytes;
}

std::optional<double> CompareRow::rel_error() const {
  if (!predicted || !measured || lower_bound) return std::nullopt;
  if (*measured == 0) return *predicted == 0 ? std::optional<double>(0.0) : std::nullopt;
  return (*predicted - *measured) / *measured;
}

bool CompareResult::exact_ok() const {
  for (const auto& r : rows)
    if (r.mismatch()) return false;
  return true;
}

CompareResult compare_with_log(const std::string& path, ClusterSpec cluster, bool peak_given) {
  std::ifstream in(path);
  if (!in) throw ConfigError("--compare " + path + ": cannot open the file");
  json config;
  std::vector<json> steps;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json rec;
    try {
      rec = json::parse(line);
    } catch (const json::parse_error&) {
      throw ConfigError("--compare " + path + ":" + std::to_string(lineno) + ": not a JSON record (is this a kiln train --log-json file?)");
    }
    const std::string type = rec.is_object() ? rec.value("type", "") : "";
    if (type == "config") {
      config = rec;  // a resumed run appends: the last config record and its steps count
      steps.clear();
    } else if (type == "step") {
      steps.push_back(rec);
    }
  }
  if (config.is_null()) throw ConfigError("--compare " + path + ": no config record (is this a kiln train --log-json file?)");
  const std::string where = "--compare " + path;
  const Run run = run_of(config, where);
  const GPTConfig& model = run.model;
  const Layout& l = run.layout;
  const bool cpu = l.cpu;
  cluster.nodes = run.nodes;
  cluster.devices_per_node = l.devices() / run.nodes;
  CompareResult res;
  res.log_path = path;
  res.steps = static_cast<int64_t>(steps.size());
  if (!peak_given) {
    const json& peak = config.contains("peak_tflops") ? config.at("peak_tflops") : json();
    if (peak.is_number()) cluster.peak_flops = peak.get<double>() * 1e12;
    else if (cpu) cluster.peak_flops = 0;  // nothing to predict time against
  }
  res.timing = cluster.peak_flops > 0;
  if (!res.timing) cluster.peak_flops = 1e12;  // placeholder: memory and traffic do not depend on it
  res.plan = make_plan(model, cluster, l);
  const Plan& p = res.plan;
  const StagePlan& st = p.stages[0];  // rank 0's stage

  auto add = [&](std::string name, std::string unit, std::optional<double> pred, std::optional<double> meas, bool exact,
                 std::string note = "") {
    res.rows.push_back({std::move(name), std::move(unit), pred, meas, exact, std::move(note)});
  };
  auto logged = [&](const char* key) -> std::optional<double> {
    if (config.contains(key) && config.at(key).is_number()) return config.at(key).get<double>();
    return std::nullopt;
  };
  add("params", "count", static_cast<double>(model.num_params()), logged("params"), true);
  // MoE: the parameters a token's forward uses (the N of the FLOPs; = params for a dense model)
  if (model.is_moe()) add("params_active", "count", static_cast<double>(model.num_active_params()), logged("params_active"), true);
  // what rank 0 holds (its stage's units: its tp slices, an MoE layer whole): GPT::num_params()
  // of its model, the Psi its model-state bytes are counted on
  add("params_local", "count", static_cast<double>(st.psi), logged("params_local"), true,
      logged("params_local") ? "" : "not in this log");
  add("flops_per_token", "FLOP", p.flops_per_token, logged("flops_per_token"), true);
  add("tokens_per_step", "count", static_cast<double>(p.tokens_per_step), logged("tokens_per_step"), true);

  // the pipeline's split of the blocks (the config record's pipeline.blocks, per virtual stage:
  // a stage's are those of virtual stages s, s + pp, ..), every stage
  if (l.pp > 1) {
    const json* blocks = config.contains("pipeline") && config.at("pipeline").is_object() &&
                                 config.at("pipeline").contains("blocks") && config.at("pipeline").at("blocks").is_array()
                             ? &config.at("pipeline").at("blocks")
                             : nullptr;
    for (const auto& stage : p.stages) {
      std::optional<double> meas;
      const auto i = static_cast<size_t>(stage.stage);
      if (blocks && blocks->size() == static_cast<size_t>(l.pp * l.pp_virtual)) {
        double n = 0;
        for (size_t v = i; v < blocks->size(); v += static_cast<size_t>(l.pp))
          if (blocks->at(v).is_number()) n += blocks->at(v).get<double>();
        meas = n;
      }
      add("pipeline.stage_" + std::to_string(stage.stage) + ".blocks", "count", static_cast<double>(stage.blocks), meas, true,
          meas ? "" : "not in this log");
    }
  }

  // ZeRO's padded parameter count, Psi' (the config record's zero.padded_params)
  if (l.zero > 0) {
    std::optional<double> logged_padded;
    if (config.contains("zero") && config.at("zero").is_object() && config.at("zero").contains("padded_params") &&
        config.at("zero").at("padded_params").is_number()) {
      logged_padded = config.at("zero").at("padded_params").get<double>();
    }
    add("padded_params", "count", static_cast<double>(st.psi_padded), logged_padded, true,
        logged_padded ? "" : "not in this log");
  }

  // model-state bytes by kind; autocast's held weight copies (cast_copies) on the device only
  const json* ms = config.contains("model_state") && config.at("model_state").is_object() ? &config.at("model_state") : nullptr;
  const std::pair<const char*, const StateBytes*> places[] = {{"device", &st.state.device}, {"host", &st.state.host}};
  for (const auto& [place, bytes] : places) {
    const bool device_place = bytes == &st.state.device;
    const std::pair<const char*, int64_t> kinds[] = {
        {"params", bytes->params}, {"grads", bytes->grads}, {"optimizer", bytes->optimizer}, {"cast_copies", bytes->cast_copies}};
    for (const auto& [kind, value] : kinds) {
      const bool cast = std::string(kind) == "cast_copies";
      if (cast && !device_place) continue;
      std::optional<double> meas;
      std::string note;
      if (ms && ms->contains(place) && ms->at(place).contains(kind) && ms->at(place).at(kind).is_number()) {
        meas = ms->at(place).at(kind).get<double>();
      } else if (cast && ms && ms->contains(place)) {
        note = "not in this log (a kiln from before model_state.device.cast_copies)";
      } else {
        note = "not in this log (a kiln without ZeRO's model_state record)";
      }
      add(std::string("model_state.") + place + "." + kind, "bytes", static_cast<double>(value), meas, true, note);
    }
  }

  // --async-save's snapshot pool, rank 0's (the config record's snapshot_pool_bytes: 0 without it)
  add("snapshot_pool_bytes", "bytes", st.save_pool_bytes, logged("snapshot_pool_bytes"), true,
      logged("snapshot_pool_bytes") ? (l.holds_save_pool() ? "host memory, --async-save with --save-dir" : "no asynchronous saves")
                                    : "not in this log (a kiln from before snapshot_pool_bytes)");

  // comm_bytes per step: the same every step; a step that differs is reported. With --ep the
  // all-to-alls' rows depend on the routing: comm_bytes less the step's ep_comm_bytes is the
  // accounting (the same every step), and ep_comm_bytes is a lower bound (the counts and the
  // norm, exact) plus the rows, measured against the plan's balanced estimate.
  const bool ep = l.ep > 1;
  auto number = [](const json& s, const char* key) -> std::optional<double> {
    if (s.contains(key) && s.at(key).is_number()) return s.at(key).get<double>();
    return std::nullopt;
  };
  std::optional<double> comm, ep_min, ep_residue;
  std::string comm_note;
  // --ep: the rows' bytes are whole rows of d elements of b bytes, whatever the routing
  const EpRowBytes row_bytes = ep_row_bytes(l);
  const int64_t row_unit = model.d_model * std::min(row_bytes.in, row_bytes.out);
  double comm_sum = 0, ep_sum = 0, dropped_sum = 0;
  int64_t comm_n = 0, ep_n = 0, dropped_n = 0;
  bool ep_missing = false;
  // --ep: each step's ep_comm_bytes from its logged rows (parallel/expert_parallel.h, "Traffic"):
  // the counts and the norm (st.ep_exact_bytes), then d (S b_in + R b_out) over the forwards and
  // d (R b_in + S b_out) / f for the backward, S and R the rows sent and received over the f
  // forward passes. The first step it misses (or the first step).
  const double forwards = l.recompute == Recompute::Full ? 2.0 : 1.0, d = static_cast<double>(model.d_model);
  std::optional<double> rows_exact_pred, rows_exact_meas;
  int64_t rows_exact_step = 0;
  bool rows_missing = false;
  std::vector<double> step_s, mem;
  for (size_t i = 0; i < steps.size(); ++i) {
    const json& s = steps[i];
    if (const auto total = number(s, "comm_bytes")) {
      double b = *total;
      comm_sum += b, ++comm_n;
      if (ep) {
        const auto e = number(s, "ep_comm_bytes");
        if (!e) {
          ep_missing = true;
        } else {
          b -= *e;
          ep_sum += *e, ++ep_n;
          ep_min = ep_min ? std::min(*ep_min, *e) : *e;
          const double r = static_cast<double>((static_cast<int64_t>(*e) - static_cast<int64_t>(st.ep_exact_bytes)) % row_unit);
          if (!ep_residue || *ep_residue == 0) ep_residue = r;  // the first step that leaves a part row, if any
          const auto S = number(s, "ep_rows_sent"), R = number(s, "ep_rows_received");
          if (!S || !R) {
            rows_missing = true;
          } else {
            const double pred = st.ep_exact_bytes + d * (*S * row_bytes.in + *R * row_bytes.out) +
                                d * (*R * row_bytes.in + *S * row_bytes.out) / forwards;
            if (!rows_exact_pred || (*rows_exact_pred == *rows_exact_meas && pred != *e)) {
              rows_exact_pred = pred, rows_exact_meas = *e, rows_exact_step = static_cast<int64_t>(i + 1);
            }
          }
        }
      }
      if (!comm) comm = b;
      else if (b != *comm && comm_note.empty()) comm_note = "differs between steps (step " + std::to_string(i + 1) + ": " + std::to_string(static_cast<int64_t>(b)) + ")";
    }
    if (const auto d = number(s, "moe_dropped")) dropped_sum += *d, ++dropped_n;
    if (s.contains("mem_gb") && s.at("mem_gb").is_number()) mem.push_back(s.at("mem_gb").get<double>() * 1e9);
    if (i == 0 && steps.size() > 1) continue;  // step 1 pays for allocation and kernel selection
    if (s.contains("step_ms") && s.at("step_ms").is_number()) step_s.push_back(s.at("step_ms").get<double>() / 1e3);
  }
  if (ep && ep_missing) comm_note = "a step without ep_comm_bytes (a kiln from before it): the ep traffic cannot be separated";
  if (!comm_note.empty()) comm.reset();
  if (!ep) {
    add("comm_bytes", "bytes", st.comm_bytes, comm, true, comm_note);
  } else {
    auto mean = [](double sum, int64_t n) { return n > 0 ? std::optional<double>(sum / static_cast<double>(n)) : std::nullopt; };
    const double rows_pred = st.ep_comm_bytes - st.ep_exact_bytes;
    add("comm_bytes", "bytes", st.comm_bytes, mean(comm_sum, comm_n), false,
        "estimate (mean over steps): the all-to-alls' rows follow the routing; the rows below split it");
    res.rows.back().estimate = true;
    add("comm_bytes - ep_comm_bytes", "bytes", st.comm_bytes - st.ep_comm_bytes, comm, true,
        comm_note.empty() ? "the gradient reductions (dense over dp, experts over expert-dp), the verdict, tp, pp" : comm_note);
    CompareRow bound{"ep_comm_bytes >= counts+norm", "bytes", st.ep_exact_bytes, ep_min, false,
                     "lower bound: the counts all-to-alls (8 E per MoE layer and forward) and the norm's 16; measured: the least step's ep_comm_bytes"};
    bound.lower_bound = true;
    res.rows.push_back(bound);
    if (rows_exact_pred && !rows_missing) {
      add("ep_comm_bytes from the logged rows", "bytes", rows_exact_pred, rows_exact_meas, true,
          "every step: the counts and norm + d (S b_in + R b_out) + d (R b_in + S b_out) / f, S and R the step's ep_rows_sent "
          "and ep_rows_received, b_in " + std::to_string(row_bytes.in) + ", b_out " + std::to_string(row_bytes.out) + ", f " +
              std::to_string(static_cast<int>(forwards)) + " (shown: step " + std::to_string(rows_exact_step) + ")");
    } else {  // a kiln from before ep_rows_*: whole rows at least
      add("ep rows mod " + std::to_string(row_unit), "bytes", 0.0, ep_residue, true,
          "ep_comm_bytes less the counts and norm is whole rows, d x " + std::to_string(std::min(row_bytes.in, row_bytes.out)) +
              " bytes, every step (no ep_rows_sent / ep_rows_received in this log)");
    }
    std::string note = "estimate: balanced load, no dropping; measured: mean over steps of ep_comm_bytes less the counts and norm";
    if (dropped_n > 0) {
      const double dropped = dropped_sum / static_cast<double>(dropped_n);
      char buf[160];
      std::snprintf(buf, sizeof buf, "; the run dropped %.1f%% of assignments (at that rate: %.0f)", 100.0 * dropped, rows_pred * (1.0 - dropped));
      note += buf;
    }
    std::optional<double> rows_meas;
    if (ep_n > 0) rows_meas = ep_sum / static_cast<double>(ep_n) - st.ep_exact_bytes;
    add("ep_comm_bytes: all-to-all rows", "bytes", rows_pred, rows_meas, false, note);
    res.rows.back().estimate = true;
  }

  const std::string cpu_note = cpu ? "CPU: process high-water mark, predicted with 0.4 GB for LibTorch itself" : "";
  add("peak_memory", "bytes", st.peak_device_bytes,
      mem.empty() ? std::nullopt : std::optional<double>(*std::max_element(mem.begin(), mem.end())), false, cpu_note);
  const std::string no_peak = "no peak FLOP/s for this device: give --peak-tflops (and --achieved)";
  std::optional<double> meas_step = step_s.empty() ? std::nullopt : std::optional<double>(median(step_s));
  add("step_s", "s", res.timing ? std::optional<double>(p.step_s) : std::nullopt, meas_step, false,
      res.timing ? "median after step 1" : no_peak);
  // MFU measured from the median step time against the same peak the prediction uses, as the
  // trainer defines it: the job's model FLOP/s / (distinct devices x peak). The devices are the
  // config record's (ranks sharing a GPU count it once; a log without them: one per rank). The
  // model gives every rank a device of its own, so it predicts for dp x tp x pp devices.
  const double devices = logged("devices").value_or(static_cast<double>(l.devices()));
  std::string mfu_note = res.timing ? "from the median step time" : no_peak;
  if (devices != static_cast<double>(l.devices())) {
    mfu_note += "; the run's " + std::to_string(l.devices()) + " ranks shared " + std::to_string(static_cast<int64_t>(devices)) +
                " device(s), the model gives each rank its own";
  }
  std::optional<double> meas_mfu;
  if (meas_step && res.timing) {
    meas_mfu = p.flops_per_token * static_cast<double>(p.tokens_per_step) / *meas_step / (devices * cluster.peak_flops);
  }
  add("mfu", "fraction", res.timing ? std::optional<double>(p.mfu) : std::nullopt, meas_mfu, false, mfu_note);
  if (res.timing && meas_step) {
    // The fraction of peak the run's arithmetic sustained: the measured step less the predicted
    // exposed communication, less the bubble (which scales with compute: (pp-1)/K of it).
    double compute = *meas_step - p.exposed_comm_s;
    if (compute < 0.5 * *meas_step) compute = *meas_step;  // the comm estimate is off: keep it all
    compute /= 1.0 + static_cast<double>(l.pp - 1) / static_cast<double>(l.grad_accum);
    const double hw = (p.flops_per_token + p.recompute_flops_per_token) * static_cast<double>(p.tokens_per_step);
    // Per device of the model (one per rank), so that --achieved reproduces this run's step time.
    res.calibrated_achieved = hw / compute / (static_cast<double>(l.devices()) * cluster.peak_flops);
  }
  return res;
}

}  // namespace kiln::plan
