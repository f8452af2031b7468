// plan/cost_model.cpp -- plan/cost_model.h's enums, validation, training totals (section 1) and one
// layout's plan (sections 4 and 5: time and energy); the sizes and bytes are plan/memory.cpp's,
// the collectives plan/communication.cpp's.
#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>

#include "distributed/error.h"
#include "models/flops.h"
#include "parallel/pipeline_interleaved.h"
#include "parallel/pipeline_zero_bubble.h"
#include "parallel/pipeline_layout.h"
#include "plan/communication.h"

namespace kiln::plan {

namespace {

std::string s(int64_t v) { return std::to_string(v); }

}  // namespace

// ---- enums ----------------------------------------------------------------------------------

Recompute parse_recompute(const std::string& v) {
  if (v == "none") return Recompute::None;
  if (v == "selective") return Recompute::Selective;
  if (v == "full") return Recompute::Full;
  throw ConfigError("--activation-checkpointing must be none, selective or full (got '" + v + "')");
}
Attention parse_attention(const std::string& v) {
  if (v == "flash") return Attention::Flash;
  if (v == "math") return Attention::Math;
  throw ConfigError("--attention must be auto, flash or math (got '" + v + "')");
}
std::string to_string(Recompute r) { return r == Recompute::None ? "none" : r == Recompute::Selective ? "selective" : "full"; }
std::string to_string(Attention a) { return a == Attention::Flash ? "flash" : "math"; }

// ---- validation -----------------------------------------------------------------------------

void Layout::validate(const GPTConfig& m, const ClusterSpec& c) const {
  if (dp < 1 || tp < 1 || pp < 1 || cp < 1) {
    throw ConfigError("--dp, --cp, --tp and --pp must be at least 1 (got dp " + s(dp) + ", cp " + s(cp) + ", tp " + s(tp) +
                      ", pp " + s(pp) + ")");
  }
  if (devices() != c.devices()) {
    throw ConfigError("layout dp " + s(dp) + (cp > 1 ? " x cp " + s(cp) : std::string()) + " x tp " + s(tp) + " x pp " + s(pp) +
                      " = " + s(devices()) + " devices does not match the cluster's " + s(c.devices()) + " (" + s(c.nodes) +
                      " node(s) x " + s(c.devices_per_node) + ")");
  }
  // kiln's refusals (runtime/trainer/train_config.cpp), one line each
  if (sp && tp < 2) throw ConfigError("--sp splits the sequence over the tensor-parallel group: it needs --tp 2 or more");
  if (sp && m.seq_len % tp != 0) {
    throw ConfigError("--sp needs --tp " + s(tp) + " to divide the sequence length (" + s(m.seq_len) + ")");
  }
  if (cp > 1 && m.seq_len % (2 * cp) != 0) {
    throw ConfigError("--cp " + s(cp) + " needs the sequence length (" + s(m.seq_len) + ") to divide into 2 x cp = " +
                      s(2 * cp) + " chunks (each rank holds two)");
  }
  if (cp > 1 && sp && m.seq_len % (2 * cp * tp) != 0) {  // kiln's refusal (runtime/trainer/train_config.cpp), word for word
    throw ConfigError("--cp " + s(cp) + " with --sp needs the sequence length (" + s(m.seq_len) +
                      ") to divide into 2 x cp x tp = " + s(2 * cp * tp) + " blocks");
  }
  // expert parallelism: kiln's refusals (runtime/trainer/train_config.cpp, runtime/trainer/trainer.cpp), word for word
  if (ep < 1) throw ConfigError("--ep must be at least 1 (got " + s(ep) + ")");
  if (ep > 1) {
    if (!m.is_moe()) throw ConfigError("--ep " + s(ep) + " divides the experts of an MoE model: give --n-experts (or --model tiny-moe)");
    if (m.n_experts % ep != 0) throw ConfigError("--ep " + s(ep) + " does not divide the experts (--n-experts " + s(m.n_experts) + ")");
    if (dp % ep != 0) {
      throw ConfigError("--ep " + s(ep) + " must divide the data-parallel size (dp " + s(dp) + " of " + s(devices()) +
                        " ranks): the expert-parallel groups are carved out of dp");
    }
  }
  if (zero < 0 || zero > 3) throw ConfigError("--zero must be 0, 1, 2 or 3 (got " + std::to_string(zero) + ")");
  if (offload == Offload::Optimizer && zero < 1) throw ConfigError("--offload optimizer needs --zero 1, 2 or 3");
  if (offload == Offload::All && zero != 3) throw ConfigError("--offload all needs --zero 3 (parameters are sharded only there)");
  if (delayed_update && offload != Offload::Optimizer) throw ConfigError("--offload-delayed-update needs --offload optimizer");
  if (micro_batch < 1) throw ConfigError("--micro-batch must be at least 1 (got " + s(micro_batch) + ")");
  if (grad_accum < 1) throw ConfigError("--grad-accum must be at least 1 (got " + s(grad_accum) + ")");
  if (compute_bytes != 2 && compute_bytes != 4) throw ConfigError("compute dtype must be 2 or 4 bytes");
  if (param_bytes != 2 && param_bytes != 4) throw ConfigError("working weights must be 2 or 4 bytes");
  if (reduce_bytes != 2 && reduce_bytes != 4) throw ConfigError("the reduction dtype must be 2 or 4 bytes");
  if (param_bytes == 2 && compute_bytes != 2) throw ConfigError("16-bit working weights compute in 16 bits: give --precision bf16 or fp16");
  if (base_bytes < 0) throw ConfigError("base bytes must be non-negative");
  auto divides = [&](const char* what, int64_t v) {
    if (v % tp != 0) throw ConfigError("--tp " + s(tp) + " does not divide " + what + " " + s(v));
  };
  if (tp > 1) {
    divides("--n-head", m.n_head);
    divides("the MLP width", m.mlp_hidden());
    divides("the padded vocabulary", m.padded_vocab_size());
    if (m.n_kv_head % tp != 0 && tp % m.n_kv_head != 0) {
      throw ConfigError("--tp " + s(tp) + " and --n-kv-head " + s(m.n_kv_head) +
                        ": one must divide the other (kv heads are split, or replicated when tp exceeds them)");
    }
  }
  if (zero_bubble) {  // kiln's refusals (runtime/trainer/train_config.cpp)
    const std::string rule = zb_h1_rule(static_cast<int>(pp), static_cast<int>(pp_virtual), zero, recompute == Recompute::Full);
    if (!rule.empty()) throw ConfigError(rule);
  }
  if (pp_virtual != 1) {  // kiln's refusals (runtime/trainer/train_config.cpp)
    const std::string rule = interleaved_rule(static_cast<int>(pp), static_cast<int>(pp_virtual), static_cast<int>(grad_accum));
    if (!rule.empty()) throw ConfigError(rule);
  }
  pipeline_block_counts(m.n_layer, pp, pp_split, pp_virtual);  // pp x V above the blocks, or a bad --pp-split: kiln's messages
}

// ---- 1. training totals -------------------------------------------------------------------

TrainingTotals training_totals(double params, double tokens, double attention_flops_per_token, const ClusterSpec& c) {
  TrainingTotals t;
  t.params = params;
  t.compute_optimal = !(tokens > 0);
  t.tokens = t.compute_optimal ? 20.0 * params : tokens;
  t.flops = (6.0 * params + std::max(0.0, attention_flops_per_token)) * t.tokens;
  t.cluster_flops = static_cast<double>(c.devices()) * c.sustained_flops();
  t.seconds = t.flops / t.cluster_flops;
  t.energy_j = t.seconds * static_cast<double>(c.devices()) * c.watts;
  t.flops_per_watt = c.sustained_flops() / c.watts;
  return t;
}

// ---- 4 and 5. one layout ----------------------------------------------------------------------

EpRowBytes ep_row_bytes(const Layout& l) { return {l.compute_bytes, l.compute_bytes}; }

Plan make_plan(const GPTConfig& model, const ClusterSpec& cluster, const Layout& layout) {
  model.validate();
  cluster.validate();
  layout.validate(model, cluster);
  Plan p;
  p.model = model;
  p.cluster = cluster;
  p.layout = layout;
  const Layout& l = layout;
  const double d = static_cast<double>(model.d_model);
  const double T = static_cast<double>(model.seq_len);
  const double tok = static_cast<double>(l.micro_batch * model.seq_len);

  // compute
  p.tokens_per_step = l.micro_batch * l.grad_accum * l.dp * model.seq_len;
  p.flops_per_token = flops_per_token(model);  // 6 N_active + 12 L d T
  // Forward FLOPs per token of block i (section 5): 2 n_block (its active parameters: an MoE
  // block's k experts and router) + 4 d T (attention's scores and values); full recomputation
  // repeats it, selective the 4 d T.
  auto block_fwd = [&](int64_t i) { return 2 * static_cast<double>(block_active_numel(model, i)) + 4 * d * T; };
  auto block_re = [&](int64_t i) {
    return l.recompute == Recompute::Full ? block_fwd(i) : l.recompute == Recompute::Selective ? 4 * d * T : 0.0;
  };
  for (int64_t i = 0; i < model.n_layer; ++i) p.recompute_flops_per_token += block_re(i);
  // --precision fp8: the float8 layers' products (2 FLOPs per weight and token forward, 4
  // backward) run at the 8-bit peak, the rest at bf16's: in time, a float8 FLOP costs rho = peak /
  // fp8_peak of a bf16 one (1/2 on an H100; 1 where the device has no float8 tensor cores, as the
  // CPU). time_fwd(block) = (block_fwd - (1 - rho) f8) / R, with f8 = 2 x its float8 weights.
  const double rho = cluster.fp8_peak_flops > 0 ? cluster.peak_flops / cluster.fp8_peak_flops : 1.0;
  auto block_f8 = [&](int64_t i) { return 2 * static_cast<double>(block_float8_numel(model, l, i)); };
  double f8_all = 0;
  for (int64_t i = 0; i < model.n_layer; ++i) f8_all += block_f8(i);
  p.float8_flops_per_token = 3 * f8_all;
  auto block_fwd_time = [&](int64_t i) { return block_fwd(i) - (1 - rho) * block_f8(i); };  // in bf16 FLOPs
  auto block_re_time = [&](int64_t i) { return l.recompute == Recompute::Full ? block_fwd_time(i) : block_re(i); };
  const double Kd = static_cast<double>(l.grad_accum);
  // A stage's idle time a step: 1F1B's p - 1 micro-batch slots, the interleaved schedule's
  // (p - 1) / V (parallel/pipeline_interleaved.h; Narayanan et al. 2021, s2.2); ZB-H1's
  // (p - 1)(t_f + t_i - t_w) + max(0, p - K) t_w, its backward split into the input half t_i and
  // the weight GEMMs t_w (parallel/pipeline_zero_bubble.h)
  auto bubble = [&](const StagePlan& st) {
    if (l.zero_bubble) {
      return zb_h1_idle(static_cast<int>(l.pp), static_cast<int>(l.grad_accum), st.forward_s,
                              st.backward_s - st.weight_s, st.weight_s);
    }
    return static_cast<double>(l.pp - 1) / static_cast<double>(l.pp_virtual) * (st.forward_s + st.backward_s);
  };
  // Each stage's forward FLOPs per token (section 5): its blocks, and on the last stage the
  // output layer and ln_f (2 x their parameters); the whole F/3 without pipelining.
  // a rank's share: the tp slice of its b T / cp positions (cp's mirrored chunks even out attention)
  const double per_device = tok / static_cast<double>(l.tp * l.cp) / cluster.sustained_flops();
  const double head_fwd = 2 * (static_cast<double>(model.padded_vocab_size()) * d + static_cast<double>(norm_numel(model)));
  // W, the weight-gradient GEMMs: 2 FLOPs per (active) parameter and token, the output layer's on
  // the last stage (the embedding's scatter and the norms' elementwise gradients are not GEMMs)
  auto stage_times = [&](StagePlan& st) {
    const bool pipelined = l.pp > 1;
    double f = 0, re = 0, w = 0;
    for (const auto& chunk : st.chunks)
      for (int64_t i : chunk) {
        f += block_fwd_time(i), re += block_re_time(i);
        w += 2 * static_cast<double>(block_active_numel(model, i)) - (1 - rho) * block_f8(i);
      }
    if (!pipelined) {
      f = p.flops_per_token / 3.0 - (1 - rho) * f8_all;
      re = p.recompute_flops_per_token - (l.recompute == Recompute::Full ? (1 - rho) * f8_all : 0.0);
    }
    if (pipelined && st.stage == l.pp - 1) f += head_fwd, w += 2 * static_cast<double>(model.padded_vocab_size()) * d;
    st.forward_s = f * per_device;
    st.backward_s = (2.0 * f + re) * per_device;
    st.weight_s = pipelined ? w * per_device : 0.0;
  };

  // per stage: memory and communication
  const Links links = links_for(l, cluster);
  const ActivationBytes kept = layer_activation_bytes(model, l, l.recompute);
  const ActivationBytes none = layer_activation_bytes(model, l, Recompute::None);
  const ActivationBytes kept_moe = layer_activation_bytes(model, l, l.recompute, /*moe=*/true);
  const ActivationBytes none_moe = layer_activation_bytes(model, l, Recompute::None, /*moe=*/true);
  const double a = l.compute_bytes, r = 4.0;
  const double Vp = static_cast<double>(model.padded_vocab_size()), V = static_cast<double>(model.vocab_size);
  // tp's vocabulary-parallel loss with kiln's kernels on a GPU (the two-pass way,
  // parallel/tensor_parallel.h): the logits kept in the compute dtype and lse (4) per token, in
  // place of the fp32 log-probabilities
  const bool two_pass_loss = l.tp > 1 && l.fused_kernels && !l.cpu;
  const double logp = two_pass_loss ? a * Vp / static_cast<double>(l.tp) + 4.0
                      : l.tp > 1    ? 4.0 * Vp / static_cast<double>(l.tp)
                                    : 4.0 * V;  // fp32 log-probabilities per token
  const int64_t G = l.grad_ranks();  // ZeRO's shards: over dp x cp
  // tokens of a micro-batch on this rank (its b T / cp positions), and, under sp, the residual
  // stream's rows of them (b T / t)
  const double local = tok / static_cast<double>(l.cp);
  const double rows = l.sp ? local / static_cast<double>(l.tp) : local;
  for (int64_t s = 0; s < l.pp; ++s) {
    StagePlan st;
    st.stage = s;
    st.chunks = stage_chunks(model, l, s);
    std::vector<int64_t> ids;  // the stage's blocks in order, all chunks
    for (const auto& chunk : st.chunks) ids.insert(ids.end(), chunk.begin(), chunk.end());
    st.blocks = static_cast<int64_t>(ids.size());
    for (int64_t i : ids) st.moe_blocks += model.is_moe_layer(i) ? 1 : 0;
    st.units = rank_units(model, l.tp, l.pp, s, l.pp_split, l.ep, l.pp_virtual);
    stage_times(st);
    for (int64_t i : ids) st.psi_experts += block_expert_numel(model, i, l.ep);
    const int64_t M = l.expert_copies();  // the expert-data-parallel group
    if (l.zero > 0 && l.ep > 1) {  // the experts' units split off their blocks' (parallel/zero.h)
      const size_t outer = st.units.size() - static_cast<size_t>(st.blocks);
      for (int64_t i = 0; i < st.blocks; ++i) {
        const int64_t e = block_expert_numel(model, ids[static_cast<size_t>(i)], l.ep);
        if (e == 0) continue;
        st.units[outer + static_cast<size_t>(i)] -= e;
        st.expert_units.push_back(e);
      }
    }
    if (float8_gathered(l)) {  // the float8 weights' units split off their blocks' (parallel/zero.h, "Float8 weights")
      const size_t outer = st.units.size() - static_cast<size_t>(st.blocks);
      for (int64_t i = 0; i < st.blocks; ++i) {
        const auto [numel, weights] = block_float8_gathered(model, l, ids[static_cast<size_t>(i)]);
        if (numel == 0) continue;
        st.units[outer + static_cast<size_t>(i)] -= numel;
        st.float8_units.push_back(numel);
        st.float8_weights += weights;
      }
    }
    st.psi = sum_units(st.units) + sum_units(st.expert_units) + sum_units(st.float8_units);
    st.psi_experts_padded = sum_padded(st.expert_units, M);
    st.psi_padded = sum_padded(st.units, G) + sum_padded(st.float8_units, G) + st.psi_experts_padded;
    st.state = model_state(st.units, l);
    if (!st.expert_units.empty()) st.state += model_state(st.expert_units, l, M);
    if (!st.float8_units.empty()) {  // and each rank's 8-bit shard of them beside the working one
      st.state += model_state(st.float8_units, l);
      st.state.device.params += sum_padded(st.float8_units, G) / G;
    }
    for (const auto& chunk : st.chunks)
      st.state.device.cast_copies += cast_copy_bytes(model, l, static_cast<int64_t>(chunk.size()), chunk.front());
    for (int64_t i : ids) st.state.device.cast_copies += 2 * block_float8_kept(model, l, i);  // fp8's kept weight forms
    // --async-save's snapshot pool (section 6): ZeRO's shards on every rank; without ZeRO the
    // whole local state on the ranks whose copy the checkpoint gathers, one element elsewhere
    if (l.holds_save_pool()) {
      if (l.zero > 0) {
        st.save_pool_bytes = 12.0 * static_cast<double>((sum_padded(st.units, G) + sum_padded(st.float8_units, G)) / G + st.psi_experts_padded / M);
        st.save_pool_other_bytes = st.save_pool_bytes;
      } else {
        st.save_pool_bytes = 4.0 * static_cast<double>(3 * st.psi + rank_param_tensors(model, l, s));
        st.save_pool_other_bytes = 4.0;
      }
    }

    const bool first = s == 0, last = s == l.pp - 1;
    // a chunk's blocks, kept for one micro-batch
    auto chunk_bytes = [&](const std::vector<int64_t>& chunk) {
      double bytes = 0;
      for (int64_t i : chunk)
        bytes += (model.is_moe_layer(i) ? kept_moe : kept).layer_bytes(tok, l.tp, l.sp, l.cp);
      return bytes;
    };
    double per_micro_batch = 0;
    for (const auto& chunk : st.chunks) per_micro_batch += chunk_bytes(chunk);
    // outside the blocks: token ids (every position under sp, which embeds the whole sequence
    // before its reduce-scatter); the embedding's dropout mask and ln_f's input, stats and output
    // (the head keeps its rows under sp) on the residual stream's rows; log-probs and targets of
    // every position the rank's loss covers
    const double embedding_kept = 8.0 * local + (l.dropout ? (l.cpu ? 4.0 : 1.0) * d * rows : 0.0);
    if (first) per_micro_batch += embedding_kept;
    // the loss (section 3): the plain way (tp's vocabulary-parallel logits, fp16, --loss-chunk-rows
    // -1) keeps the fp32 log-probabilities and the targets; the chunked one (models/
    // linear_cross_entropy.h) computes its gradients in the forward and keeps dloss/dx and dloss/dW, fp32
    const bool chunked = l.tp == 1 && !l.plain_loss;
    const double loss_kept = chunked ? 4.0 * d * local + 4.0 * Vp * d : (logp + 8.0) * local;
    const double head_kept = (norm_kept_bytes(model, l, r) + a * d) * rows + loss_kept;
    if (last) per_micro_batch += head_kept;
    if (l.zero_bubble) {  // ZB-H1: a micro-batch's graph held from its forward to its weight pass
      double now = 0;
      for (const PipeAction& act : zb_h1(static_cast<int>(l.pp), static_cast<int>(s), static_cast<int>(l.grad_accum))) {
        if (act.type == PipeAction::Type::Forward) now += per_micro_batch;
        if (act.type == PipeAction::Type::Backward || act.type == PipeAction::Type::BackwardWeight) now -= per_micro_batch;
        st.activation_bytes = std::max(st.activation_bytes, now);
      }
    } else if (l.pp_virtual == 1) {  // 1F1B: min(p - s, K) micro-batches in flight
      st.activation_bytes = per_micro_batch * static_cast<double>(std::min<int64_t>(l.pp - s, l.grad_accum));
    } else {
      // interleaved: the most the schedule holds at once, walked action by action (chunks differ:
      // the embedding's on chunk 0 of stage 0, the head's on the last chunk of the last stage)
      std::vector<double> held(st.chunks.size());
      for (size_t c = 0; c < held.size(); ++c) held[c] = chunk_bytes(st.chunks[c]);
      if (first) held.front() += embedding_kept;
      if (last) held.back() += head_kept;
      double now = 0;
      for (const PipeAction& act : interleaved_one_f_one_b(static_cast<int>(l.pp), static_cast<int>(s),
                                                           static_cast<int>(l.pp_virtual), static_cast<int>(l.grad_accum))) {
        if (act.type == PipeAction::Type::Forward) now += held[static_cast<size_t>(act.chunk)];
        if (act.type == PipeAction::Type::Backward) now -= held[static_cast<size_t>(act.chunk)];
        st.activation_bytes = std::max(st.activation_bytes, now);
      }
    }
    // context parallelism's causal mask: one additive [2C, T] bias in the compute dtype for the
    // run, shared by every layer and micro-batch (parallel/context_parallel.h)
    if (l.cp > 1) st.activation_bytes += a * (static_cast<double>(model.seq_len) / static_cast<double>(l.cp)) * static_cast<double>(model.seq_len);

    double transient = 0;
    // plain: the logits and the log-probabilities' gradient; chunked: G = dloss/dz in the compute
    // dtype, one chunk's fp32 logits (at most 256 MiB), on the CPU under 16-bit autocast W's fp32 copy
    // (two-pass: the logits are kept, so the gradient dz alone)
  if (last && !chunked) transient += local * (a * Vp / static_cast<double>(l.tp) + (two_pass_loss ? 0.0 : logp));
    if (last && chunked) {
      transient += a * local * Vp + std::min(256.0 * 1024 * 1024, 4.0 * local * Vp) + (l.cpu && a == 2 ? 4.0 * Vp * d : 0.0);
    }
    // MoE backward (models/moe.cpp runs expert e on the slices fc_w[e], ...): each slice's
    // gradient is a full-size [E, ...] tensor (select_backward), summed into one buffer per
    // stacked weight: while a layer's backward runs, the four buffers (E x the expert's numel) and
    // one more full fc_w-sized gradient, in the weights' dtype
    if (st.moe_blocks > 0) {
      const double E = static_cast<double>(model.n_experts / l.ep), F = static_cast<double>(model.mlp_hidden());
      const double fc_w = (model.swiglu() ? 2.0 : 1.0) * F * d;  // one expert's c_fc weight (SwiGLU: gate and up)
      transient += static_cast<double>(l.param_bytes) * E * (static_cast<double>(mlp_numel(model, 1)) + fc_w);
    }
    if (l.recompute == Recompute::Full) {  // one layer recomputed: the larger kind the stage holds
      transient += std::max(st.blocks > st.moe_blocks ? none.layer_bytes(tok, l.tp, l.sp, l.cp) : 0.0,
                            st.moe_blocks > 0 ? none_moe.layer_bytes(tok, l.tp, l.sp, l.cp) : 0.0);
    }
    int64_t outer_units = 0, max_block = 0;  // the units before the blocks; the largest block's
    for (size_t i = 0; i < st.units.size(); ++i) {
      if (i + static_cast<size_t>(st.blocks) < st.units.size()) outer_units += padded_numel(st.units[i], G);
      else max_block = std::max(max_block, padded_numel(st.units[i], G));
    }
    // ZeRO-2/3 without a full local buffer: up to two units' full gradients in flight to their
    // reduce-scatter (parallel/zero.h: max_in_flight 2). ZeRO-3 also holds the outer unit
    // gathered through the micro-step and one block gathered plus the next one prefetched.
    int64_t biggest = 0;
    for (int64_t n : st.units) biggest = std::max(biggest, padded_numel(n, G));
    for (int64_t n : st.expert_units) biggest = std::max(biggest, padded_numel(n, M));
    for (int64_t n : st.float8_units) biggest = std::max(biggest, padded_numel(n, G));
    const bool full_buffer = l.zero == 1 || (l.zero_accum == ZeroAccum::Local && l.grad_accum > 1);
    if (l.zero >= 2 && !full_buffer) transient += 2 * 4 * static_cast<double>(biggest);
    if (l.zero == 3) {  // gathered in the working weights' dtype; under --ep a block is its dense and expert units
      const double pb = l.param_bytes;
      int64_t max_experts = 0, max_float8 = 0;  // the float8 units gathered in one byte
      for (int64_t n : st.expert_units) max_experts = std::max(max_experts, padded_numel(n, M));
      for (int64_t n : st.float8_units) max_float8 = std::max(max_float8, padded_numel(n, G));
      // a pipeline stage's last block stays gathered from its forward through later micro-batches'
      // forwards (parallel/zero.h), beside the block running and the one prefetched
      const double held = l.pp > 1 ? static_cast<double>(std::min<int64_t>(3, st.blocks)) : 2.0;
      transient += pb * static_cast<double>(outer_units) + held * (pb * static_cast<double>(max_block + max_experts) + static_cast<double>(max_float8));
    }
    st.transient_bytes = transient;
    // on the CPU the snapshot pool is the process's memory too
    st.peak_device_bytes = static_cast<double>(st.state.device.total()) + st.activation_bytes + transient + l.base_bytes +
                           (l.cpu ? st.save_pool_bytes : 0.0);
    st.host_bytes = static_cast<double>(st.state.host.total()) + st.save_pool_bytes;

    st.comm = stage_comm(p, st, links);
    for (const auto& it : st.comm) {
      if (it.group == "host") continue;
      st.comm_bytes += it.comm_bytes;
      if (it.group == "ep") {
        st.ep_comm_bytes += it.comm_bytes;
        if (!it.estimate) st.ep_exact_bytes += it.comm_bytes;
        if (it.what.rfind("gradient-norm", 0) == 0) st.ep_norm_bytes += it.comm_bytes;
      }
    }
    st.exposed_comm_s = exposed_seconds(st.comm, st.forward_s, st.backward_s, l.grad_accum);
    // its step: K micro-batches, its bubble, its exposed communication
    st.bubble_s = bubble(st);
    st.step_s = Kd * (st.forward_s + st.backward_s) + st.bubble_s + st.exposed_comm_s;
    p.stages.push_back(std::move(st));
  }
  for (size_t i = 0; i < p.stages.size(); ++i) {
    if (p.stages[i].peak_device_bytes > p.stages[p.critical_stage].peak_device_bytes) p.critical_stage = static_cast<int64_t>(i);
    if (p.stages[i].step_s > p.stages[p.slowest_stage].step_s) p.slowest_stage = static_cast<int64_t>(i);
  }
  const StagePlan& slow = p.stages[p.slowest_stage];
  p.forward_s = slow.forward_s;
  p.backward_s = slow.backward_s;
  p.compute_s = Kd * (p.forward_s + p.backward_s);
  p.bubble_s = slow.bubble_s;
  p.exposed_comm_s = slow.exposed_comm_s;
  p.step_s = p.compute_s + p.exposed_comm_s + p.bubble_s;
  // checkpoints (section 6)
  p.checkpoint_bytes = 12.0 * static_cast<double>(model.num_params());
  p.save_write_s = p.checkpoint_bytes / cluster.disk_write;
  if (l.save_every > 0) {
    double snapshot = 0;  // the largest rank's pool (each save copies the whole of it)
    for (const auto& st : p.stages) snapshot = std::max(snapshot, st.save_pool_bytes);
    const double interval = static_cast<double>(l.save_every) * p.step_s;
    p.save_stall_s = l.async_save ? snapshot / cluster.host_link + std::max(0.0, p.save_write_s - interval) : p.save_write_s;
    p.save_s = p.save_stall_s / static_cast<double>(l.save_every);
    p.step_s += p.save_s;
  }
  p.tokens_per_s = static_cast<double>(p.tokens_per_step) / p.step_s;
  const double denom = static_cast<double>(l.devices()) * p.step_s * cluster.peak_flops;
  p.mfu = p.flops_per_token * static_cast<double>(p.tokens_per_step) / denom;
  p.hfu = (p.flops_per_token + p.recompute_flops_per_token) * static_cast<double>(p.tokens_per_step) / denom;

  // required bandwidth per group, on the slowest stage
  for (const char* g : {"dp", "edp", "ep", "cp", "tp", "pp", "host"}) {
    GroupBandwidth b;
    b.group = g;
    for (const auto& it : p.stages[p.slowest_stage].comm) {
      if (it.group != g || it.link == "host-cpu") continue;
      b.wire_bytes += it.wire_bytes;
      b.available = it.busbw;
    }
    if (b.available <= 0) continue;
    b.required = b.wire_bytes / p.compute_s;
    b.enough = b.required <= b.available;
    p.bandwidth.push_back(b);
  }
  // host memory per node: nodes hold consecutive ranks, tp fastest, then cp, dp, pp (distributed/
  // mesh.cpp); each rank its stage's host model state and its snapshot pool; the fullest node
  const int64_t per_node = std::min(cluster.devices_per_node, l.devices());
  for (int64_t node = 0; node < l.devices(); node += per_node) {
    double bytes = 0;
    for (int64_t rank = node; rank < std::min(node + per_node, l.devices()); ++rank) {
      const int64_t cp = (rank / l.tp) % l.cp, dp = (rank / (l.tp * l.cp)) % l.dp, stage = rank / (l.tp * l.cp * l.dp);
      const StagePlan& st = p.stages[static_cast<size_t>(stage)];
      const bool keeps = l.zero > 0 || (cp == 0 && dp < std::max<int64_t>(1, l.ep));
      bytes += static_cast<double>(st.state.host.total()) + (keeps ? st.save_pool_bytes : st.save_pool_other_bytes);
    }
    p.host_node_bytes = std::max(p.host_node_bytes, bytes);
  }
  p.fits_device = p.peak_device_bytes() <= cluster.device_memory;
  p.fits_host = p.host_bytes_per_node() <= cluster.host_memory;
  return p;
}

LayoutTotals layout_totals(const Plan& p, double tokens) {
  LayoutTotals t;
  const double per_step = static_cast<double>(p.tokens_per_step);
  t.steps = static_cast<int64_t>(std::ceil(tokens / per_step));
  t.seconds = static_cast<double>(t.steps) * p.step_s;
  const double devices = static_cast<double>(p.layout.devices());
  t.energy_j = t.seconds * devices * p.cluster.watts;
  t.device_hours = t.seconds * devices / 3600.0;
  return t;
}

}  // namespace kiln::plan
