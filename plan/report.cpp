// plan/report.cpp -- text and JSON renderings of plans, searches and comparisons.
#include "plan/report.h"

#include <cmath>
#include <cstdio>

#include "distributed/strprintf.h"
#include "parallel/pipeline_interleaved.h"

namespace kiln::plan {

namespace {

using json = nlohmann::json;

std::string bytes(double b) {
  const double a = std::fabs(b);
  if (a >= 1e9) return strprintf("%.2f GB", b / 1e9);
  if (a >= 1e6) return strprintf("%.2f MB", b / 1e6);
  if (a >= 1e3) return strprintf("%.2f kB", b / 1e3);
  return strprintf("%.0f B", b);
}

std::string duration(double s) {
  if (s < 1e-3) return strprintf("%.1f us", s * 1e6);
  if (s < 1) return strprintf("%.2f ms", s * 1e3);
  if (s < 120) return strprintf("%.2f s", s);
  if (s < 7200) return strprintf("%.1f min", s / 60);
  if (s < 172800) return strprintf("%.1f h", s / 3600);
  return strprintf("%.1f days", s / 86400);
}

std::string rate(double bytes_per_s) { return strprintf("%.1f GB/s", bytes_per_s / 1e9); }

std::string energy(double joules) {
  const double kwh = joules / 3.6e6;
  if (kwh >= 1000) return strprintf("%.1f MWh", kwh / 1000);
  return strprintf("%.2f kWh", kwh);
}

std::string window_name(Window w) {
  switch (w) {
    case Window::Serial: return "exposed";
    case Window::Forward: return "behind forward";
    case Window::Backward: return "behind backward";
    case Window::LastBackward: return "behind last backward";
    case Window::FirstForward: return "behind next forward";
    case Window::NextStep: return "behind next step";
  }
  return "?";
}

// The device's also carries cast_copies (autocast's held weight copies); the host has none.
json state_json(const StateBytes& s, bool device) {
  json out = {{"params", s.params}, {"grads", s.grads}, {"optimizer", s.optimizer}};
  if (device) out["cast_copies"] = s.cast_copies;
  out["total"] = s.total();
  return out;
}

// The model's flags for `kiln train --model NAME` with `base` the preset NAME: every field where
// the model is not the preset, as kiln train applies them over it (launch/cli.cpp: --n-head sets
// the kv heads too unless --n-kv-head is given; an absent --ffn-hidden keeps the preset's width,
// or its rule's for the model's d).
std::vector<std::string> model_flags(const GPTConfig& m, const GPTConfig& base) {
  std::vector<std::string> f;
  auto integer = [&](const char* flag, int64_t v) { f.push_back(strprintf("--%s %lld", flag, static_cast<long long>(v))); };
  auto real = [&](const char* flag, double v) { f.push_back(strprintf("--%s %.17g", flag, v)); };  // the value itself
  if (m.n_layer != base.n_layer) integer("n-layer", m.n_layer);
  if (m.n_head != base.n_head) integer("n-head", m.n_head);
  if (m.n_kv_head != (m.n_head != base.n_head ? m.n_head : base.n_kv_head)) integer("n-kv-head", m.n_kv_head);
  if (m.d_model != base.d_model) integer("d-model", m.d_model);
  if (m.seq_len != base.seq_len) integer("seq-len", m.seq_len);
  if (m.vocab_size != base.vocab_size) integer("vocab-size", m.vocab_size);
  if (m.dropout != base.dropout) f.push_back(strprintf("--dropout %g", m.dropout));
  // the architecture (models/gpt_config.h)
  if (m.position != base.position) f.push_back("--position " + m.position);
  if (m.rope() && m.rope_theta != base.rope_theta) real("rope-theta", m.rope_theta);
  if (m.rope() && (m.rope_factor != base.rope_factor || m.rope_low_freq_factor != base.rope_low_freq_factor ||
                   m.rope_high_freq_factor != base.rope_high_freq_factor || m.rope_original_context != base.rope_original_context)) {
    real("rope-factor", m.rope_factor);
    real("rope-low-freq-factor", m.rope_low_freq_factor);
    real("rope-high-freq-factor", m.rope_high_freq_factor);
    integer("rope-original-context", m.rope_original_context);
  }
  if (m.norm != base.norm) f.push_back("--norm " + m.norm);
  if (m.layer_norm_eps != base.layer_norm_eps) real("norm-eps", m.layer_norm_eps);
  if (m.mlp != base.mlp) f.push_back("--mlp " + m.mlp);
  GPTConfig derived = base;  // the width kiln train would give the model without --ffn-hidden
  derived.d_model = m.d_model;
  derived.mlp = m.mlp;
  if (m.mlp_hidden() != derived.mlp_hidden()) integer("ffn-hidden", m.mlp_hidden());
  if (m.bias != base.bias) f.push_back("--bias " + m.bias);
  if (m.tie_embeddings != base.tie_embeddings) f.push_back(m.tie_embeddings ? "--tie-embeddings" : "--tie-embeddings=false");
  if (m.n_experts != base.n_experts) integer("n-experts", m.n_experts);
  if (m.is_moe()) {
    if (m.top_k != base.top_k) integer("top-k", m.top_k);
    if (m.moe_every != base.moe_every) integer("moe-every", m.moe_every);
    if (m.moe_capacity_factor != base.moe_capacity_factor) real("moe-capacity-factor", m.moe_capacity_factor);
    if (m.moe_aux_loss_coef != base.moe_aux_loss_coef) real("moe-aux-loss-coef", m.moe_aux_loss_coef);
    if (m.moe_z_loss_coef != base.moe_z_loss_coef) real("moe-z-loss-coef", m.moe_z_loss_coef);
  }
  return f;
}

// The command that runs the planned layout as pasted: `--model NAME` -- the preset the model is,
// or the one it differs from in the fewest flags (the first in kiln's list on a tie), with only
// those flags -- and every setting that differs from `kiln train`'s defaults (dp follows from the
// world: dp = ranks / (cp x tp x pp)). 16-bit compute is written --precision bf16 (the plan does
// not tell bf16 from fp16; both cost 2 bytes); kiln train's --param-dtype auto is the compute
// precision.
std::string train_command(const GPTConfig& m, const Layout& l) {
  std::string out = strprintf("mpirun -np %lld kiln train", static_cast<long long>(l.devices()));
  std::string preset;
  std::vector<std::string> flags;
  for (const auto& name : GPTConfig::preset_names()) {
    std::vector<std::string> f = model_flags(m, GPTConfig::preset(name));
    if (preset.empty() || f.size() < flags.size()) preset = name, flags = std::move(f);
  }
  out += " --model " + preset;
  for (const auto& f : flags) out += " " + f;
  if (l.compute_bytes == 2) out += l.float8 ? " --precision fp8" : " --precision bf16";
  if (l.float8 == 2) out += " --fp8-recipe rowwise";
  if (l.float8 && l.fp8_filter_all) out += " --fp8-filter all";
  if (l.param_bytes != l.compute_bytes) out += l.param_bytes == 4 ? " --param-dtype fp32" : " --param-dtype bf16";
  if (l.reduce_bytes == 2) out += " --reduce-dtype bf16";
  if (l.main_grads_always && l.param_bytes == 2) out += " --main-grads always";
  if (l.tp != 1) out += strprintf(" --tp %lld", static_cast<long long>(l.tp));
  if (l.sp) out += " --sp";
  if (l.cp != 1) out += strprintf(" --cp %lld", static_cast<long long>(l.cp));
  if (l.ep != 1) out += strprintf(" --ep %lld", static_cast<long long>(l.ep));
  if (l.pp != 1) out += strprintf(" --pp %lld", static_cast<long long>(l.pp));
  if (l.pp_virtual != 1) out += strprintf(" --pp-virtual %lld", static_cast<long long>(l.pp_virtual));
  if (l.zero_bubble) out += " --pp-schedule zb-h1";
  if (!l.pp_split.empty()) out += " --pp-split " + l.pp_split;
  if (l.zero != 0) out += strprintf(" --zero %d", l.zero);
  if (l.offload != Offload::None) out += " --offload " + to_string(l.offload);
  if (l.delayed_update) out += " --offload-delayed-update";
  if (l.zero >= 2 && l.grad_accum > 1 && l.zero_accum != ZeroAccum::Reduce) out += " --zero-accum " + to_string(l.zero_accum);
  if (l.recompute != Recompute::None) out += " --activation-checkpointing " + to_string(l.recompute);
  if (l.micro_batch != 8) out += strprintf(" --micro-batch %lld", static_cast<long long>(l.micro_batch));
  if (l.grad_accum != 1) out += strprintf(" --grad-accum %lld", static_cast<long long>(l.grad_accum));
  // checkpoints (section 6): a directory to name, the interval, and the synchronous writes if planned
  if (l.save_every > 0) out += strprintf(" --save-dir checkpoints --save-every %lld", static_cast<long long>(l.save_every));
  if ((l.save_every > 0 || l.saves) && !l.async_save) out += " --async-save=false";
  return out;
}

}  // namespace

// ---- JSON -----------------------------------------------------------------------------------

json cluster_json(const ClusterSpec& c) {
  return {{"name", c.name},
          {"device", c.device},
          {"nodes", c.nodes},
          {"devices_per_node", c.devices_per_node},
          {"devices", c.devices()},
          {"device_memory_bytes", c.device_memory},
          {"peak_flops", c.peak_flops},
          {"fp8_peak_flops", c.fp8_peak_flops},
          {"achieved", c.achieved},
          {"sustained_flops", c.sustained_flops()},
          {"watts", c.watts},
          {"intra_node_busbw", c.intra_node_busbw},
          {"inter_node_busbw", c.inter_node_busbw},
          {"host_link", c.host_link},
          {"host_memory_bytes", c.host_memory},
          {"host_adam_params_per_s", c.host_adam_rate},
          {"disk_write", c.disk_write}};
}

json totals_json(const TrainingTotals& t) {
  return {{"params", t.params},          {"tokens", t.tokens},   {"compute_optimal", t.compute_optimal},
          {"flops", t.flops},            {"cluster_flops", t.cluster_flops}, {"seconds", t.seconds},
          {"energy_j", t.energy_j},      {"energy_kwh", t.energy_j / 3.6e6},
          {"flops_per_watt", t.flops_per_watt}};
}

json plan_json(const Plan& p, const TrainingTotals& totals, const LayoutTotals& run) {
  const Layout& l = p.layout;
  const GPTConfig& m = p.model;
  json stages = json::array();
  for (const auto& st : p.stages) {
    json comm = json::array();
    for (const auto& it : st.comm) {
      comm.push_back({{"group", it.group},           {"what", it.what},         {"group_size", it.group_size},
                      {"comm_bytes", it.comm_bytes}, {"wire_bytes", it.wire_bytes}, {"busbw", it.busbw},
                      {"link", it.link},             {"seconds", it.seconds},   {"window", window_name(it.window)},
                      {"occurrences", it.occurrences}, {"estimate", it.estimate}});
    }
    stages.push_back({{"stage", st.stage},
                      {"blocks", st.blocks},
                      {"forward_s", st.forward_s},
                      {"backward_s", st.backward_s},
                      {"weight_s", st.weight_s},
                      {"bubble_s", st.bubble_s},
                      {"units", st.units},
                      {"psi", st.psi},
                      {"psi_padded", st.psi_padded},
                      {"model_state", {{"device", state_json(st.state.device, true)}, {"host", state_json(st.state.host, false)}}},
                      {"activation_bytes", st.activation_bytes},
                      {"transient_bytes", st.transient_bytes},
                      {"peak_device_bytes", st.peak_device_bytes},
                      {"save_pool_bytes", st.save_pool_bytes},  // --async-save's snapshot pool (host; in host_bytes)
                      {"host_bytes", st.host_bytes},
                      {"comm_bytes", static_cast<int64_t>(std::llround(st.comm_bytes))},
                      {"ep_comm_bytes", static_cast<int64_t>(std::llround(st.ep_comm_bytes))},
                      {"ep_exact_bytes", static_cast<int64_t>(std::llround(st.ep_exact_bytes))},
                      {"psi_experts", st.psi_experts},
                      {"expert_units", st.expert_units},  // ZeRO under --ep: the experts' own units (sharded over dp / ep)
                      {"psi_experts_padded", st.psi_experts_padded},
                      {"exposed_comm_s", st.exposed_comm_s},
                      {"step_s", st.step_s},
                      {"comm", comm}});
  }
  json bw = json::array();
  for (const auto& b : p.bandwidth) {
    bw.push_back({{"group", b.group}, {"wire_bytes", b.wire_bytes}, {"required", b.required},
                  {"available", b.available}, {"enough", b.enough}});
  }
  const ActivationBytes act = layer_activation_bytes(m, l, l.recompute);
  json act_json = {{"replicated", act.replicated}, {"split", act.split}, {"unsplit", act.unsplit}, {"per_rank", act.per_token(l.tp, l.sp)},
                   {"kv_whole_per_sequence_token", act.kv_whole}, {"per_layer_constant", act.per_layer}};
  if (m.is_moe()) {  // an MoE block's own figures (an estimate; plan/cost_model.h section 3, MoE)
    const ActivationBytes moe = layer_activation_bytes(m, l, l.recompute, /*moe=*/true);
    act_json["moe"] = {{"replicated", moe.replicated}, {"split", moe.split}, {"per_rank", moe.per_token(l.tp, l.sp)},
                       {"per_layer_constant", moe.per_layer}};
  }
  json model_json = {{"n_layer", m.n_layer}, {"n_head", m.n_head}, {"n_kv_head", m.n_kv_head}, {"d_model", m.d_model},
        {"seq_len", m.seq_len}, {"vocab_size", m.vocab_size}, {"padded_vocab_size", m.padded_vocab_size()},
        {"params", m.num_params()}, {"params_non_embedding_pos", m.num_params_non_embedding_pos()},
        {"params_active", m.num_active_params()}, {"params_active_non_embedding_pos", m.num_active_params_non_embedding_pos()},
        {"n_experts", m.n_experts}, {"top_k", m.is_moe() ? json(m.top_k) : json(nullptr)},
        {"moe_every", m.is_moe() ? json(m.moe_every) : json(nullptr)}, {"n_moe_layers", m.n_moe_layers()}};
  m.put_architecture(model_json);  // the Llama family's fields, by kiln train's record names (none for GPT-2)
  return {
      {"type", "plan"},
      {"model", model_json},
      {"cluster", cluster_json(p.cluster)},
      {"layout",
       {{"dp", l.dp}, {"tp", l.tp}, {"pp", l.pp}, {"cp", l.cp}, {"sp", l.sp}, {"ep", l.ep}, {"zero", l.zero}, {"offload", to_string(l.offload)}, {"offload_delayed_update", l.delayed_update},
        {"zero_accum", to_string(l.zero_accum)}, {"activation_checkpointing", to_string(l.recompute)},
        {"pp_split", l.pp_split}, {"pp_virtual", l.pp_virtual}, {"zero_bubble", l.zero_bubble}, {"micro_batch", l.micro_batch}, {"grad_accum", l.grad_accum}, {"compute_bytes", l.compute_bytes},
        {"float8", l.float8 == 0 ? "none" : l.float8 == 1 ? "tensorwise" : "rowwise"}, {"fp8_filter", l.fp8_filter_all ? "all" : "auto"},
        {"attention", to_string(l.attention)}, {"dropout", l.dropout}, {"command", train_command(p.model, l)}}},
      {"compute",
       {{"tokens_per_step", p.tokens_per_step}, {"flops_per_token", p.flops_per_token},
        {"recompute_flops_per_token", p.recompute_flops_per_token}, {"float8_flops_per_token", p.float8_flops_per_token}, {"forward_s", p.forward_s},
        {"backward_s", p.backward_s}, {"compute_s", p.compute_s}}},
      {"activation_bytes_per_token_per_layer", act_json},
      {"time",
       {{"compute_s", p.compute_s}, {"exposed_comm_s", p.exposed_comm_s}, {"bubble_s", p.bubble_s},
        {"step_s", p.step_s}, {"tokens_per_s", p.tokens_per_s}, {"mfu", p.mfu}, {"hfu", p.hfu},
        {"slowest_stage", p.slowest_stage}}},
      {"checkpoint",
       {{"bytes", p.checkpoint_bytes}, {"write_s", p.save_write_s}, {"save_every", p.layout.save_every},
        {"async", p.layout.async_save}, {"stall_s", p.save_stall_s}, {"stall_per_step_s", p.save_s},
        {"pool_bytes", p.stages[p.critical_stage].save_pool_bytes}}},
      {"memory",
       {{"critical_stage", p.critical_stage}, {"peak_device_bytes", p.peak_device_bytes()},
        {"device_memory_bytes", p.cluster.device_memory}, {"host_bytes_per_node", p.host_bytes_per_node()},
        {"host_memory_bytes", p.cluster.host_memory}, {"fits_device", p.fits_device}, {"fits_host", p.fits_host},
        {"fits", p.fits()}}},
      {"stages", stages},
      {"bandwidth", bw},
      {"training", totals_json(totals)},
      {"run", {{"steps", run.steps}, {"seconds", run.seconds}, {"energy_j", run.energy_j},
               {"energy_kwh", run.energy_j / 3.6e6}, {"device_hours", run.device_hours}}}};
}

json search_json(const SearchResult& r, const TrainingTotals& totals, double tokens) {
  json best = json::array();
  int rank = 1;
  for (const auto& b : r.best) {
    json j = plan_json(b.plan, totals, layout_totals(b.plan, tokens));
    j["rank"] = rank++;
    j["reason"] = b.reason;
    best.push_back(j);
  }
  return {{"type", "search"},
          {"candidates", r.candidates},
          {"invalid", r.invalid},
          {"over_device_memory", r.over_device},
          {"over_host_memory", r.over_host},
          {"fitting", r.fitting},
          {"best", best}};
}

json compare_json(const CompareResult& r) {
  json rows = json::array();
  auto opt = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
  for (const auto& row : r.rows) {
    json pred = opt(row.predicted), meas = opt(row.measured);
    if (row.unit == "bytes" || row.unit == "count") {  // exact integers where they are integers
      if (row.predicted && std::floor(*row.predicted) == *row.predicted) pred = static_cast<int64_t>(*row.predicted);
      if (row.measured && std::floor(*row.measured) == *row.measured) meas = static_cast<int64_t>(*row.measured);
    }
    json j = {{"name", row.name}, {"unit", row.unit}, {"predicted", pred}, {"measured", meas},
              {"rel_error", opt(row.rel_error())}, {"exact", row.exact}, {"equal", row.exact ? json(!row.mismatch()) : json(nullptr)},
              {"note", row.note}};
    if (row.estimate) j["estimate"] = true;
    if (row.lower_bound) {  // measured >= predicted (--ep's counts and norm within ep_comm_bytes)
      j["lower_bound"] = true;
      j["holds"] = row.predicted && row.measured ? json(!row.mismatch()) : json(nullptr);
    }
    rows.push_back(j);
  }
  return {{"type", "compare"},
          {"log", r.log_path},
          {"steps", r.steps},
          {"timing", r.timing},
          {"calibrated_achieved", opt(r.calibrated_achieved)},
          {"exact_ok", r.exact_ok()},
          {"rows", rows},
          {"plan", plan_json(r.plan, training_totals(static_cast<double>(r.plan.model.num_active_params_non_embedding_pos()), 0, 0, r.plan.cluster),
                             layout_totals(r.plan, 0))}};
}

// ---- text -----------------------------------------------------------------------------------

std::string totals_text(const TrainingTotals& t, const ClusterSpec& c) {
  std::string o;
  o += strprintf("training  P = %.4g parameters, D = %.4g tokens%s\n", t.params, t.tokens,
              t.compute_optimal ? " (compute-optimal: D = 20 P)" : "");
  o += strprintf("  compute   T = 6 P D%s = %.3e FLOP\n", t.flops > 6.0 * t.params * t.tokens * 1.0000001 ? " + attention" : "", t.flops);
  o += strprintf("  cluster   R = %lld devices x %.0f TFLOP/s x %.2f achieved = %.3g PFLOP/s\n",
              static_cast<long long>(c.devices()), c.peak_flops / 1e12, c.achieved, t.cluster_flops / 1e15);
  o += strprintf("  runtime   t = T / R%s = %s\n", t.compute_optimal ? " = 120 P^2 / R" : "", duration(t.seconds).c_str());
  o += strprintf("  energy    E = t x %lld x %.0f W = %s (%.3g TFLOP/s per kW achieved)\n", static_cast<long long>(c.devices()),
              c.watts, energy(t.energy_j).c_str(), t.flops_per_watt / 1e12 * 1e3);
  return o;
}

std::string plan_text(const Plan& p, const TrainingTotals& totals, const LayoutTotals& run) {
  const Layout& l = p.layout;
  const GPTConfig& m = p.model;
  const ClusterSpec& c = p.cluster;
  std::string o;
  o += strprintf("model     L %lld, d %lld, heads %lld (kv %lld), T %lld, V %lld (padded %lld): %lld parameters\n",
              static_cast<long long>(m.n_layer), static_cast<long long>(m.d_model), static_cast<long long>(m.n_head),
              static_cast<long long>(m.n_kv_head), static_cast<long long>(m.seq_len), static_cast<long long>(m.vocab_size),
              static_cast<long long>(m.padded_vocab_size()), static_cast<long long>(m.num_params()));
  if (!m.gpt2_architecture()) {
    o += strprintf("          %s positions%s, %s, %s feed-forward (F %lld), biases %s, output layer %s\n", m.position.c_str(),
                   m.rope() ? strprintf(" (theta %g%s)", m.rope_theta, m.rope_factor != 0.0 ? ", Llama-3.1 scaling" : "").c_str() : "",
                   m.norm.c_str(), m.mlp.c_str(), static_cast<long long>(m.mlp_hidden()), m.bias.c_str(),
                   m.tie_embeddings ? "tied to wte" : "untied (lm_head)");
  }
  if (m.is_moe()) {
    o += strprintf("          MoE in %lld of %lld blocks: %lld experts, top-%lld, %lld parameters active per token (the P of 6 P D)\n",
                   static_cast<long long>(m.n_moe_layers()), static_cast<long long>(m.n_layer), static_cast<long long>(m.n_experts),
                   static_cast<long long>(m.top_k), static_cast<long long>(m.num_active_params()));
  }
  o += strprintf("cluster   %lld x %lld %s: %s, %.0f TFLOP/s peak x %.2f achieved, %.0f W\n",
              static_cast<long long>(c.nodes), static_cast<long long>(c.devices_per_node), c.device.c_str(),
              bytes(c.device_memory).c_str(), c.peak_flops / 1e12, c.achieved, c.watts);
  o += strprintf("          links: in a node %s, between nodes %s per device, host %s\n", rate(c.intra_node_busbw).c_str(),
              rate(c.inter_node_busbw).c_str(), rate(c.host_link).c_str());
  o += "layout    " + describe(l) + strprintf("; %s, %s attention, dropout %s\n", l.compute_bytes == 4 ? "fp32" : "bf16/fp16 autocast",
                                             to_string(l.attention).c_str(), l.dropout ? "on" : "off");
  o += strprintf("          %lld tokens per step: %s\n\n", static_cast<long long>(p.tokens_per_step), train_command(p.model, l).c_str());

  const StagePlan& st = p.stages[p.critical_stage];
  o += strprintf("memory per device (pipeline stage %lld of %lld%s: %lld blocks; Psi %lld, padded %lld)\n",
              static_cast<long long>(st.stage), static_cast<long long>(l.pp), l.pp > 1 ? ", the highest peak" : "",
              static_cast<long long>(st.blocks),
              static_cast<long long>(st.psi), static_cast<long long>(st.psi_padded));
  o += strprintf("  %-22s %14s %14s\n", "", "device", "host");
  o += strprintf("  %-22s %14s %14s\n", "parameters", bytes(static_cast<double>(st.state.device.params)).c_str(), bytes(static_cast<double>(st.state.host.params)).c_str());
  o += strprintf("  %-22s %14s %14s\n", "gradients", bytes(static_cast<double>(st.state.device.grads)).c_str(), bytes(static_cast<double>(st.state.host.grads)).c_str());
  o += strprintf("  %-22s %14s %14s\n", "optimizer state", bytes(static_cast<double>(st.state.device.optimizer)).c_str(), bytes(static_cast<double>(st.state.host.optimizer)).c_str());
  if (st.state.device.cast_copies > 0) {
    const bool f8 = l.float8 && l.zero != 3;  // fp8's kept 8-bit weight forms ride here (block_float8_kept)
    o += strprintf("  %-22s %14s %14s  (%s)\n", f8 ? "weight copies" : "autocast copies",
                   bytes(static_cast<double>(st.state.device.cast_copies)).c_str(), "-",
                   f8 ? (l.param_bytes == 4 ? "fp8's 8-bit weight forms kept a step, 2 B an element, and fp32 weights' 16-bit autocast copies"
                                            : "fp8's 8-bit weight forms kept a step, 2 B a float8 weight element")
                      : "fp32 weights' 16-bit autocast copies, forward to backward");
  }
  const ActivationBytes act = layer_activation_bytes(m, l, l.recompute);
  std::string per_token = strprintf("%.0f B per token per layer", act.per_token(l.tp, l.sp));
  if (m.is_moe()) {
    const ActivationBytes moe = layer_activation_bytes(m, l, l.recompute, /*moe=*/true);
    const std::string dense = m.n_moe_layers() < m.n_layer ? strprintf("%.0f B per token per dense layer, ", act.per_token(l.tp, l.sp)) : "";
    per_token = dense + strprintf("%.0f B per token per MoE layer (estimate) + %s per MoE layer and micro-batch",
                                  moe.per_token(l.tp, l.sp), bytes(moe.per_layer).c_str());
  }
  if (l.sp) per_token += strprintf(" (sp: replicated part / %lld)", static_cast<long long>(l.tp));
  if (l.cp > 1) {
    const double T = static_cast<double>(m.seq_len);
    per_token += strprintf(" on T/%lld positions + %.0f B per sequence token (K, V gathered); the causal mask %s once",
                           static_cast<long long>(l.cp), act.kv_whole,
                           bytes(static_cast<double>(l.compute_bytes) * T / static_cast<double>(l.cp) * T).c_str());
  }
  const std::string in_flight =
      l.pp_virtual > 1
          ? strprintf("at most %d chunk forwards of %lld in flight", interleaved_live_chunks(static_cast<int>(l.pp), static_cast<int>(st.stage),
                                                                                            static_cast<int>(l.pp_virtual), static_cast<int>(l.grad_accum)),
                      static_cast<long long>(l.pp_virtual))
          : strprintf("%lld micro-batch(es) in flight", static_cast<long long>(std::min<int64_t>(l.pp - st.stage, l.grad_accum)));
  o += strprintf("  %-22s %14s                (%s, %s)\n", "activations", bytes(st.activation_bytes).c_str(), per_token.c_str(),
                 in_flight.c_str());
  o += strprintf("  %-22s %14s                (logits, recompute working set, gathered ZeRO-3 units%s)\n", "transients",
              bytes(st.transient_bytes).c_str(), m.is_moe() ? ", MoE expert-gradient buffers" : "");
  if (l.base_bytes > 0) o += strprintf("  %-22s %14s\n", "process base", bytes(l.base_bytes).c_str());
  if (st.save_pool_bytes > 0) {
    o += strprintf("  %-22s %14s %14s  (--async-save's snapshot of the rank's state, held from set-up%s%s)\n", "snapshot pool", "-",
                   bytes(st.save_pool_bytes).c_str(), l.zero > 0 ? "" : "; the dp-0 ranks', 4 B on the others",
                   l.cpu ? "; on the CPU in the peak too" : "");
  }
  o += strprintf("  %-22s %14s of %s: %s\n", "peak", bytes(st.peak_device_bytes).c_str(), bytes(c.device_memory).c_str(),
              p.fits_device ? "fits" : "DOES NOT FIT");
  if (l.offload != Offload::None || st.save_pool_bytes > 0) {
    o += strprintf("  host per node          %14s of %s: %s\n", bytes(p.host_bytes_per_node()).c_str(), bytes(c.host_memory).c_str(),
                p.fits_host ? "fits" : "DOES NOT FIT");
  }

  if (l.pp > 1) {
    // Every stage at a glance: the figures above are one stage's; a run's log is rank 0's (stage 0).
    o += "\npipeline stages (per rank; a run's log reports rank 0, stage 0)\n";
    o += strprintf("  %-5s %6s %12s %14s %14s %14s %14s %12s %10s\n", "stage", "blocks", "Psi", "model state", "activations",
                "peak", "comm_bytes", "micro-batch", "step");
    for (const auto& s : p.stages) {
      o += strprintf("  %-5lld %6lld %12lld %14s %14s %14s %14.0f %12s %10s%s\n", static_cast<long long>(s.stage),
                  static_cast<long long>(s.blocks), static_cast<long long>(s.psi), bytes(static_cast<double>(s.state.device.total())).c_str(),
                  bytes(s.activation_bytes).c_str(), bytes(s.peak_device_bytes).c_str(), s.comm_bytes,
                  duration(s.forward_s + s.backward_s).c_str(), duration(s.step_s).c_str(),
                  s.stage == p.slowest_stage ? "  slowest" : "");
    }
  }

  const StagePlan& slow = p.stages[p.slowest_stage];
  o += strprintf("\ncommunication per step (a rank of pipeline stage %lld of %lld%s)\n", static_cast<long long>(slow.stage),
              static_cast<long long>(l.pp), l.pp > 1 ? ", the slowest" : "");
  if (slow.comm.empty()) o += "  none\n";
  for (const auto& it : slow.comm) {
    if (it.link == "host-cpu") {
      o += strprintf("  %-5s %-52s %36s %9s  %s\n", it.group.c_str(), it.what.c_str(), "", duration(it.seconds).c_str(),
                  window_name(it.window).c_str());
      continue;
    }
    o += strprintf("  %-5s %-52s %12s wire %11s %-10s %9s  %s\n", it.group.c_str(), it.what.c_str(), bytes(it.comm_bytes).c_str(),
                bytes(it.wire_bytes).c_str(), it.link.c_str(), duration(it.seconds).c_str(), window_name(it.window).c_str());
  }
  if (slow.ep_comm_bytes > 0) {
    o += strprintf("  comm_bytes (kiln's count) %.0f, of which ep_comm_bytes %.0f: %.0f exact (counts, norm), %.0f rows (estimate: "
                   "balanced, no dropping); the rest %.0f exact\n",
                   slow.comm_bytes, slow.ep_comm_bytes, slow.ep_exact_bytes, slow.ep_comm_bytes - slow.ep_exact_bytes,
                   slow.comm_bytes - slow.ep_comm_bytes);
  } else {
    o += strprintf("  comm_bytes (kiln's count) %.0f\n", slow.comm_bytes);
  }
  for (const auto& b : p.bandwidth) {
    if (!p.fits()) break;  // against a compute time it would not run
    o += strprintf("  %-4s needs %s to hide behind compute (b = C / t), has %s: %s\n", b.group.c_str(), rate(b.required).c_str(),
                rate(b.available).c_str(), b.enough ? "enough" : "NOT enough");
  }

  if (!p.fits()) {  // no step time: the layout would not run (run_plan points at --search)
    o += "\nstep time\n  none: " + does_not_fit(p) + "\n\n";
    // The budget is the model's and the cluster's, whatever the layout: said as such, not as this
    // layout's time.
    o += "(the cluster's budget at its achieved rate, for a layout that fits; this one does not)\n";
    o += totals_text(totals, c);
    return o;
  }
  o += "\nstep time\n";
  o += strprintf("  compute        %10s  (per micro-batch: forward %s, backward %s%s)\n", duration(p.compute_s).c_str(),
              duration(p.forward_s).c_str(), duration(p.backward_s).c_str(),
              p.recompute_flops_per_token > 0 ? " incl. recomputation" : "");
  if (p.layout.float8) {
    o += strprintf("  (fp8: %.1f%% of the model FLOPs in float8 products, at %.0f TFLOPS peak against bf16's %.0f; %s)\n",
                   100.0 * p.float8_flops_per_token / p.flops_per_token, c.fp8_peak_flops > 0 ? c.fp8_peak_flops / 1e12 : c.peak_flops / 1e12,
                   c.peak_flops / 1e12,
                   c.fp8_peak_flops <= 0 ? "no float8 peak in this device's preset: kiln train refuses fp8 on a GPU without float8 tensor cores"
                   : p.layout.zero == 3  ? "memory: the float8 weights' 8-bit shards and gathers, q_x in 1 byte under tensorwise"
                                         : "memory: the weights' kept 8-bit forms in cast_copies, q_x in 1 byte under tensorwise");
  }
  o += strprintf("  exposed comm   %10s\n", duration(p.exposed_comm_s).c_str());
  o += strprintf("  bubble         %10s  (%s = %.1f%% of the step)\n", duration(p.bubble_s).c_str(),
              p.layout.zero_bubble      ? "ZB-H1: (pp - 1)(t_f + t_i - t_w), W the weight GEMMs"
              : p.layout.pp_virtual > 1 ? "interleaved: (pp - 1) / (V m + pp - 1)"
                                        : "(pp - 1) / (m + pp - 1)",
              100.0 * p.bubble_s / p.step_s);
  if (p.layout.save_every > 0) {
    o += strprintf("  checkpoints    %10s  (%s a save every %lld steps: %s; rank 0 writes %.3g GB in %s)\n", duration(p.save_s).c_str(),
                   duration(p.save_stall_s).c_str(), static_cast<long long>(p.layout.save_every),
                   p.layout.async_save ? "the snapshot into host memory, --async-save" : "the whole write, synchronous",
                   p.checkpoint_bytes / 1e9, duration(p.save_write_s).c_str());
  }
  o += strprintf("  step           %10s  %.4g tokens/s, MFU %.1f%%, HFU %.1f%%\n\n", duration(p.step_s).c_str(), p.tokens_per_s,
              100 * p.mfu, 100 * p.hfu);

  o += totals_text(totals, c);
  o += strprintf("  this layout: %lld steps x %s = %s, %s, %.4g device-hours\n", static_cast<long long>(run.steps),
              duration(p.step_s).c_str(), duration(run.seconds).c_str(), energy(run.energy_j).c_str(), run.device_hours);
  return o;
}

std::string does_not_fit(const Plan& p) {
  std::string why;
  if (!p.fits_device) {
    why = strprintf("the peak per device, %s (pipeline stage %lld), is over the device's %s", bytes(p.peak_device_bytes()).c_str(),
                    static_cast<long long>(p.critical_stage), bytes(p.cluster.device_memory).c_str());
  }
  if (!p.fits_host) {
    why += std::string(why.empty() ? "" : "; ") +
           strprintf("the host memory per node, %s, is over the node's %s", bytes(p.host_bytes_per_node()).c_str(),
                     bytes(p.cluster.host_memory).c_str());
  }
  return "the layout does not fit: " + why;
}

std::string search_text(const SearchResult& r, const ClusterSpec& c, int64_t global_batch) {
  std::string o;
  o += strprintf("search: %lld devices (%lld x %lld %s), global batch %lld sequences\n", static_cast<long long>(c.devices()),
              static_cast<long long>(c.nodes), static_cast<long long>(c.devices_per_node), c.device.c_str(),
              static_cast<long long>(global_batch));
  o += strprintf("  %lld layouts tried: %lld not valid, %lld over device memory, %lld over host memory, %lld fit\n\n",
              static_cast<long long>(r.candidates), static_cast<long long>(r.invalid), static_cast<long long>(r.over_device),
              static_cast<long long>(r.over_host), static_cast<long long>(r.fitting));
  int rank = 1;
  for (const auto& b : r.best) {
    const Plan& p = b.plan;
    o += strprintf("#%d  %s\n", rank++, describe(p.layout).c_str());
    o += strprintf("    step %s, %.4g tokens/s, MFU %.1f%%, peak %s of %s\n", duration(p.step_s).c_str(), p.tokens_per_s,
                100 * p.mfu, bytes(p.peak_device_bytes()).c_str(), bytes(c.device_memory).c_str());
    o += "    why: " + b.reason + "\n";
    o += "    " + train_command(p.model, p.layout) + "\n";
  }
  return o;
}

std::string compare_text(const CompareResult& r) {
  std::string o;
  o += strprintf("compare: %s (%lld steps) against the cost model\n", r.log_path.c_str(), static_cast<long long>(r.steps));
  o += "  layout: " + describe(r.plan.layout) + "\n";
  if (r.plan.layout.pp > 1) {
    o += strprintf("  predicted for rank 0, the rank that wrote the log: pipeline stage 0 of %lld, holding %lld of the %lld blocks\n",
                static_cast<long long>(r.plan.layout.pp), static_cast<long long>(r.plan.stages[0].blocks),
                static_cast<long long>(r.plan.model.n_layer));
  }
  o += strprintf("  %-30s %18s %18s %10s\n", "", "predicted", "measured", "rel. error");
  for (const auto& row : r.rows) {
    auto show = [&](const std::optional<double>& v) -> std::string {
      if (!v) return "-";
      if (row.unit == "s") return duration(*v);
      if (row.unit == "fraction") return strprintf("%.2f%%", 100 * *v);
      return strprintf("%.0f", *v);
    };
    const auto err = row.rel_error();
    std::string e = err ? strprintf("%+.2f%%", 100 * *err) : "-";
    if (row.exact && row.predicted && row.measured) e = row.mismatch() ? "MISMATCH" : "equal";
    if (row.lower_bound && row.predicted && row.measured) e = row.mismatch() ? "BELOW" : "holds";
    o += strprintf("  %-30s %18s %18s %10s", row.name.c_str(), show(row.predicted).c_str(), show(row.measured).c_str(), e.c_str());
    if (!row.note.empty()) o += "  (" + row.note + ")";
    o += "\n";
  }
  if (r.calibrated_achieved) {
    o += strprintf("  this run sustained %.3g of peak: pass --achieved %.3g to calibrate predictions\n", *r.calibrated_achieved,
                *r.calibrated_achieved);
  }
  bool bounds = false;
  for (const auto& row : r.rows) bounds = bounds || row.lower_bound;
  const char* what = bounds ? "  accounting (exact rows, lower bounds)" : "  accounting (exact rows)";
  o += std::string(what) + (r.exact_ok() ? ": equal\n" : ": MISMATCH\n");
  return o;
}

}  // namespace kiln::plan
