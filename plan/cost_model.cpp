// plan/cost_model.cpp -- the formulas of plan/cost_model.h, in the order of its sections.
#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>

#include "parallel/pipeline_layout.h"
#include "runtime/error.h"
#include "runtime/metrics.h"

namespace kiln::plan {

namespace {

constexpr int64_t kAlign = 64;  // ZeRO shard alignment, elements
// RNG states a checkpoint saves for its replay (docs/activation_checkpointing.md): the default
// CPU generator's, and a CUDA device generator's.
constexpr double kCpuGeneratorState = 5056, kCudaGeneratorState = 16;

std::string s(int64_t v) { return std::to_string(v); }

double ring(int64_t n) { return n <= 1 ? 0.0 : static_cast<double>(n - 1) / static_cast<double>(n); }

// The attention half of a block at tp = t, with both LayerNorms (section 2).
int64_t attention_numel(const GPTConfig& m, int64_t t) {
  const int64_t d = m.d_model, hd = m.head_dim();
  const int64_t kv_heads = m.n_kv_head >= t ? m.n_kv_head / t : 1;  // replicated when t exceeds them
  const int64_t qkv = d / t + 2 * kv_heads * hd;
  return 2 * d + (d * qkv + qkv)       // ln_1, c_attn (column-parallel: weight and bias split)
         + (d / t) * d + d             // attn c_proj (row-parallel: bias whole)
         + 2 * d;                      // ln_2
}

// One expert, or the dense MLP at tp = t: c_fc [F, d] + b (column-parallel), c_proj [d, F] + b
// (row-parallel: bias whole).
int64_t mlp_numel(const GPTConfig& m, int64_t t) {
  const int64_t d = m.d_model, F = m.mlp_hidden();
  return d * (F / t) + F / t + (F / t) * d + d;
}

}  // namespace

int64_t block_numel(const GPTConfig& m, int64_t t, int64_t index, int64_t ep) {
  if (m.is_moe_layer(index)) return attention_numel(m, t) + block_expert_numel(m, index, ep) + m.n_experts * m.d_model;
  return attention_numel(m, t) + mlp_numel(m, t);
}

int64_t block_expert_numel(const GPTConfig& m, int64_t index, int64_t ep) {
  return m.is_moe_layer(index) ? m.n_experts / std::max<int64_t>(1, ep) * mlp_numel(m, 1) : 0;
}

int64_t block_active_numel(const GPTConfig& m, int64_t index) {
  if (m.is_moe_layer(index)) return attention_numel(m, 1) + m.top_k * mlp_numel(m, 1) + m.n_experts * m.d_model;
  return block_numel(m, 1, index);
}

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
  // kiln's refusals (runtime/train_config.cpp), one line each
  if (sp && tp < 2) throw ConfigError("--sp splits the sequence over the tensor-parallel group: it needs --tp 2 or more");
  if (sp && m.seq_len % tp != 0) {
    throw ConfigError("--sp needs --tp " + s(tp) + " to divide the sequence length (" + s(m.seq_len) + ")");
  }
  if (cp > 1 && m.seq_len % (2 * cp) != 0) {
    throw ConfigError("--cp " + s(cp) + " needs the sequence length (" + s(m.seq_len) + ") to divide into 2 x cp = " +
                      s(2 * cp) + " chunks (each rank holds two)");
  }
  if (cp > 1 && pp > 1) {
    throw ConfigError("--cp with --pp is not built (context parallelism runs the whole model on each rank): use --cp with --tp, dp and ZeRO");
  }
  if (cp > 1 && sp) throw ConfigError("--cp with --sp is not built: choose one way of splitting the sequence");
  // expert parallelism: kiln's refusals (runtime/train_config.cpp, runtime/trainer.cpp), word for word
  if (ep < 1) throw ConfigError("--ep must be at least 1 (got " + s(ep) + ")");
  if (ep > 1) {
    if (!m.is_moe()) throw ConfigError("--ep " + s(ep) + " divides the experts of an MoE model: give --n-experts (or --model tiny-moe)");
    if (m.n_experts % ep != 0) throw ConfigError("--ep " + s(ep) + " does not divide the experts (--n-experts " + s(m.n_experts) + ")");
    if (zero == 3) {
      throw ConfigError("--ep with --zero 3 is not built (ZeRO-3 gathers whole blocks over dp; the experts are sharded "
                        "over the ranks holding the same ones): use --zero 1 or 2");
    }
    if (dp % ep != 0) {
      throw ConfigError("--ep " + s(ep) + " must divide the data-parallel size (dp " + s(dp) + " of " + s(devices()) +
                        " ranks): the expert-parallel groups are carved out of dp");
    }
  }
  if (m.is_moe() && (sp || cp > 1)) {  // kiln's refusal (runtime/train_config.cpp), word for word
    throw ConfigError(std::string("--n-experts with ") + (sp ? "--sp" : "--cp") +
                      " is not built (an MoE layer routes each sequence as one group; a split sequence would need its "
                      "ranks to agree on the capacity): use tp, pp, dp and ZeRO");
  }
  if (zero < 0 || zero > 3) throw ConfigError("--zero must be 0, 1, 2 or 3 (got " + std::to_string(zero) + ")");
  if (offload == Offload::Optimizer && zero < 1) throw ConfigError("--offload optimizer needs --zero 1, 2 or 3");
  if (offload == Offload::All && zero != 3) throw ConfigError("--offload all needs --zero 3 (parameters are sharded only there)");
  if (zero == 3 && pp > 1) {  // kiln's refusal (runtime/train_config.cpp), word for word
    throw ConfigError("--zero 3 with --pp " + s(pp) + " is not supported yet (ZeRO-3's per-block gathers "
                      "assume each micro-batch's forward and backward in turn, not 1F1B's interleaving): use --zero 1 or 2");
  }
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
  pipeline_block_counts(m.n_layer, pp, pp_split);  // pp above the blocks, or a bad --pp-split: kiln's messages
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

// ---- 2. model-state bytes -------------------------------------------------------------------

std::vector<int64_t> stage_blocks(const GPTConfig& m, const Layout& l) {
  return pipeline_block_counts(m.n_layer, l.pp, l.pp_split);
}

// kiln's units (parallel/zero.cpp units_of). The whole model (pp 1): [wte, wpe, ln_f], then the
// blocks. A pipeline stage: [wte] where it holds it (the first stage's, or the last stage's tied
// copy: laid out alike, so the tied-embedding sync adds shard to shard), then [wpe, ln_f] as far
// as it holds them, then its blocks.
std::vector<int64_t> rank_units(const GPTConfig& m, int64_t tp, int64_t pp, int64_t stage, const std::string& pp_split,
                                int64_t ep) {
  const int64_t d = m.d_model;
  const int64_t wte = m.padded_vocab_size() * d / tp, wpe = m.seq_len * d, ln_f = 2 * d;
  const auto blocks = pipeline_block_counts(m.n_layer, pp, pp_split);
  if (stage < 0 || stage >= pp) throw ConfigError("pipeline stage " + s(stage) + " of " + s(pp));
  const bool first = stage == 0, last = stage == pp - 1;
  std::vector<int64_t> units;
  if (pp == 1) {
    units.push_back(wte + wpe + ln_f);
  } else {
    if (first || last) units.push_back(wte);
    const int64_t outer = (first ? wpe : 0) + (last ? ln_f : 0);
    if (outer > 0) units.push_back(outer);
  }
  const int64_t begin = pipeline_block_starts(blocks)[static_cast<size_t>(stage)];
  for (int64_t i = 0; i < blocks[static_cast<size_t>(stage)]; ++i) units.push_back(block_numel(m, tp, begin + i, ep));
  return units;
}

int64_t padded_numel(int64_t n, int64_t dp) {
  const int64_t q = kAlign * dp;
  return (n + q - 1) / q * q;
}
int64_t sum_padded(const std::vector<int64_t>& units, int64_t dp) {
  int64_t total = 0;
  for (int64_t n : units) total += padded_numel(n, dp);
  return total;
}
int64_t sum_units(const std::vector<int64_t>& units) {
  int64_t total = 0;
  for (int64_t n : units) total += n;
  return total;
}

ModelState model_state(const std::vector<int64_t>& units, const Layout& l, int64_t ranks) {
  ModelState out;
  const int64_t N = ranks > 0 ? ranks : l.grad_ranks();  // ZeRO shards over dp x cp (experts: dp / ep)
  if (l.zero == 0) {
    const int64_t psi = sum_units(units);
    // 16-bit working weights: 2-byte parameters, fp32 main grads, fp32 master + m + v (optim/adamw.h).
    out.device = {l.param_bytes * psi, 4 * psi, (l.param_bytes == 2 ? 12 : 8) * psi};
    return out;
  }
  const int64_t pp_ = sum_padded(units, N), shard = pp_ / N, pb = l.param_bytes;
  const bool local_full = l.zero_accum == ZeroAccum::Local && l.grad_accum > 1;
  // gradients stay fp32 (main grads) whatever the weights' dtype
  const int64_t grads = l.zero == 1 ? 4 * pp_ : (local_full ? 4 * pp_ : 4 * shard);
  const int64_t params = l.zero == 3 ? pb * shard : pb * pp_;
  // m and v, and with 16-bit weights the fp32 master shard beside them
  const int64_t optimizer = (pb == 2 ? 12 : 8) * shard;
  switch (l.offload) {
    case Offload::None:
      out.device = {params, grads, optimizer};
      break;
    case Offload::Optimizer:  // the host master is fp32 under either policy
      out.device = {params, grads, 0};
      out.host = {0, 4 * shard, 12 * shard};
      break;
    case Offload::All:  // the full local accumulation buffer, if any, stays on the device
      out.device = {0, local_full ? 4 * pp_ : 0, 0};
      // fp32: the host parameter shard is the master; 16-bit: a 2-byte shard to gather, and the
      // fp32 master with the moments
      out.host = {pb * shard, 4 * shard, optimizer};
      break;
  }
  return out;
}

// The matrix products' weights of one block at tp = t (c_attn weight and bias, attn c_proj weight,
// c_fc weight and bias, mlp c_proj weight; the two row-parallel biases only at t = 1, where the
// product adds them), as block_numel splits them. An MoE block: the attention's only (the
// experts' slices are not leaves, which autocast does not cache; runtime/precision.cpp).
int64_t cast_copy_bytes(const GPTConfig& m, const Layout& l, int64_t blocks, int64_t first_block) {
  if (l.param_bytes == 2 || l.compute_bytes == 4) return 0;
  const int64_t t = l.tp, d = m.d_model, F = m.mlp_hidden(), hd = m.head_dim();
  const int64_t kv_heads = m.n_kv_head >= t ? m.n_kv_head / t : 1;
  const int64_t qkv = d / t + 2 * kv_heads * hd;
  const int64_t attention = (d * qkv + qkv) + (d / t) * d + (t == 1 ? d : 0);
  const int64_t mlp = (d * (F / t) + F / t) + (F / t) * d + (t == 1 ? d : 0);
  int64_t total = 0;
  for (int64_t i = first_block; i < first_block + blocks; ++i) total += attention + (m.is_moe_layer(i) ? 0 : mlp);
  return 2 * total;
}

// ---- 3. activations -------------------------------------------------------------------------

ActivationBytes layer_activation_bytes(const GPTConfig& m, const Layout& l, Recompute mode, bool moe) {
  // r: the residual stream's bytes, the parameters' dtype (fp32, or 16-bit working weights).
  const double a = l.compute_bytes, r = l.param_bytes, mk = l.cpu ? 4.0 : 1.0;
  const double d = static_cast<double>(m.d_model), H = static_cast<double>(m.n_head);
  const double T = static_cast<double>(m.seq_len);
  const double kv = static_cast<double>(m.n_kv_head * m.head_dim());
  ActivationBytes out;
  if (mode != Recompute::None) out.per_layer = kCpuGeneratorState + (l.cpu ? 0.0 : kCudaGeneratorState);
  if (mode == Recompute::Full) {
    out.replicated = r * d;  // the block's input (its rank's rows under sp or cp)
    return out;
  }
  // x, ln stats, ln_1 out, y, ln_2 out, residual-dropout masks (under sp the rank's T/t rows of
  // each: c_attn and c_fc keep their input's rows and gather them again in backward)
  out.replicated = r * d + 16.0 + a * d + r * d + a * d + (l.dropout ? 2.0 * mk * d : 0.0);
  if (moe) {
    // An MoE layer (models/moe.cpp's ops; section 3 MoE), replicated over tp: ln_2's output in
    // fp32 (the router's input) in place of c_fc's a d copy; the router's logits and
    // probabilities, the logsumexp; the top-k indices, probabilities and their sum; per
    // assignment the expert's input, h, gelu(h), its output, the gated output in ln_2's dtype
    // (index_add keeps its source), the gate and two int64 indices. ln_2's dtype: fp32 but on
    // the CPU with 16-bit weights (as tp's ln, section 4).
    const double E = static_cast<double>(m.n_experts), k = static_cast<double>(m.top_k);
    const double ln = l.cpu && l.param_bytes == 2 ? 2.0 : 4.0;
    const double topk = m.top_k > 1 ? 12.0 * k + 4.0 : 8.0;  // k = 1: the gate is the probability, only the index is kept
    // --ep: the arrived rows' (l, j) order, an int64 per row this rank's experts run (kept by
    // index_select and index_copy, one tensor), k per token at a balanced load
    const double ep_order = l.ep > 1 ? 8.0 : 0.0;
    out.replicated += (4.0 - a) * d + 8.0 * E + 4.0 + topk + k * (10.0 * a * d + ln * d + a + 16.0 + ep_order);
    // Per layer and micro-batch: the 16-bit casts of the experts' fp32 weights, saved by their
    // linears (not autocast's cache: the slices fc_w[e] are not leaves), every expert (the rank's
    // E/ep under --ep) assumed to receive tokens; with 16-bit weights the router's fp32 copy.
    const double F = static_cast<double>(m.mlp_hidden());
    const double local_experts = static_cast<double>(m.n_experts / std::max<int64_t>(1, l.ep));
    if (a == 2 && r == 4) out.per_layer += a * 2.0 * F * d * local_experts;
    if (r == 2) out.per_layer += 4.0 * E * d;
  }
  const double qkv_views = a * (d + 2.0 * kv);
  double core = 0.0;
  if (mode == Recompute::Selective) {
    core = qkv_views;  // the attention checkpoint's inputs only
  } else if (l.attention == Attention::Flash) {
    core = qkv_views + 4.0 * H;  // q, k, v + fp32 logsumexp
  } else {
    core = 3.0 * a * d + a * H * T + (l.dropout ? (mk + a) * H * T : 0.0);
  }
  const double gelu_out = mode == Recompute::Selective ? 0.0 : 4.0 * a * d;
  // an MoE block has no split MLP (its experts are in `replicated`, kept under selective too)
  out.split = core + a * d /* attention out */ + (moe ? 0.0 : 4.0 * a * d /* h */ + gelu_out);
  if (l.cp > 1) {
    // Context parallelism: attention's K and V gathered whole over cp, [b, KV_t, T, h] each, on
    // top of the rank's own positions' (c_attn's output, which q views, keeps them); the math
    // path's K, V copies are whole, expanded to the heads (2 a d / t). The causal mask is one
    // additive bias [2C, T] for the run, shared by every layer (make_plan adds it once).
    const int64_t t = l.tp;
    const double kv_t = static_cast<double>((m.n_kv_head >= t ? m.n_kv_head / t : 1) * m.head_dim());
    if (mode == Recompute::None && l.attention == Attention::Math) {
      out.split -= 2.0 * a * d;  // the copies: whole, not per local token
      out.kv_whole = 2.0 * a * d / static_cast<double>(t);
    } else {
      out.kv_whole = 2.0 * a * kv_t;
    }
  }
  return out;
}

// ---- 4 and 5. one layout ----------------------------------------------------------------------

EpRowBytes ep_row_bytes(const Layout& l) { return {l.cpu && l.param_bytes == 2 ? 2 : 4, l.compute_bytes}; }

double Plan::host_bytes_per_node() const {
  double worst = 0;
  for (const auto& st : stages) worst = std::max(worst, st.host_bytes);
  return worst * static_cast<double>(std::min(cluster.devices_per_node, layout.devices()));
}

namespace {

struct Links {
  double dp_bw, tp_bw, pp_bw, cp_bw, ep_bw;
  std::string dp, tp, pp, cp, ep;
};

// Rank order is tp fastest, then cp, then dp, then pp (runtime/mesh.h); nodes hold consecutive
// ranks. The dp x cp gradient group spans what the dp group spans.
Links links_for(const Layout& l, const ClusterSpec& c) {
  auto pick = [&](bool crosses, double& bw, std::string& name) {
    bw = crosses ? c.inter_node_busbw : c.intra_node_busbw;
    name = crosses ? "inter-node" : "intra-node";
  };
  Links k;
  pick(l.tp > c.devices_per_node, k.tp_bw, k.tp);
  pick(l.tp * l.cp > c.devices_per_node, k.cp_bw, k.cp);
  pick(l.tp * l.cp * l.dp > c.devices_per_node, k.dp_bw, k.dp);
  // an ep group: ep consecutive dp indices at one tp position (cp is 1 with MoE), tp x ep ranks
  // apart at most; the expert-data-parallel group strides over the whole dp range (dp's link)
  pick(l.tp * l.ep > c.devices_per_node, k.ep_bw, k.ep);
  pick(l.devices() > c.devices_per_node, k.pp_bw, k.pp);
  return k;
}

CommItem collective(std::string group, std::string what, int64_t n, double comm_bytes, double bw, std::string link,
                    Window w, int64_t occurrences, bool ring_factor = true) {
  CommItem it;
  it.group = std::move(group);
  it.what = std::move(what);
  it.group_size = n;
  it.comm_bytes = comm_bytes;
  it.wire_bytes = ring_factor ? comm_bytes * ring(n) : comm_bytes;
  it.busbw = bw;
  it.link = std::move(link);
  it.seconds = it.wire_bytes / bw;
  it.window = w;
  it.occurrences = occurrences;
  return it;
}

std::vector<CommItem> stage_comm(const Plan& p, const StagePlan& st, const Links& k) {
  const Layout& l = p.layout;
  const GPTConfig& m = p.model;
  const ClusterSpec& c = p.cluster;
  const int64_t N = l.grad_ranks(), K = l.grad_accum;  // DDP and ZeRO reduce over dp x cp
  const double Kd = static_cast<double>(K);
  std::vector<CommItem> out;

  const bool first = st.stage == 0, last = st.stage == l.pp - 1;
  const bool pipelined = l.pp > 1;

  // data parallel (exact kiln accounting). DDP runs with dp x cp > 1, or a named backend in a world
  // of one; ZeRO always has its dp communicator (kiln runs it under mpirun only), of one rank or more.
  if (N > 1 || l.comm_in_world_of_one || l.zero > 0) {
    const double psi = static_cast<double>(st.psi), psi_p = static_cast<double>(st.psi_padded);
    const bool reduce_each = l.zero_accum == ZeroAccum::Reduce && K > 1;
    // ZeRO: gradients reduce-scattered in rb bytes, parameters gathered in the weights' pb
    const double rb = l.reduce_bytes, pb = l.param_bytes;
    auto dp = [&](std::string what, double bytes, Window w, int64_t occ) {
      out.push_back(collective("dp", std::move(what), N, bytes, k.dp_bw, k.dp, w, occ));
    };
    switch (l.zero) {
      case 0:
        if (l.ep > 1) {
          // expert parallelism (runtime/trainer.cpp): DDP over dp for the dense parameters, a second
          // DDP over the expert-data-parallel group (dp / ep ranks) for the experts, which skips
          // its all-reduce when the group is one rank
          const double experts = static_cast<double>(st.psi_experts), edp = static_cast<double>(l.dp / l.ep);
          dp("dense gradient all-reduce (DDP, last micro-step)", 2.0 * rb * (psi - experts), Window::LastBackward, 1);
          if (edp > 1) {
            out.push_back(collective("edp", "expert gradient all-reduce, " + s(l.dp / l.ep) + " copies (DDP, last micro-step)",
                                     l.dp / l.ep, 2.0 * rb * experts, k.dp_bw, k.dp, Window::LastBackward, 1));
          }
        } else {
          dp("gradient all-reduce (DDP buckets, last micro-step)", 2.0 * l.reduce_bytes * psi, Window::LastBackward, 1);
        }
        break;
      case 1:
      case 2: {
        // under --ep the expert units go over the expert-data-parallel group (dp / ep ranks), and
        // not at all when it is one rank (parallel/zero.h)
        const double experts_p = static_cast<double>(st.psi_experts_padded), dense_p = psi_p - experts_p;
        const bool each = l.zero == 2 && reduce_each;
        const std::string tail = l.ep > 1 ? " (dense units)" : "";
        if (each) dp("gradient reduce-scatter (every micro-step)" + tail, Kd * rb * dense_p, Window::Backward, K);
        else dp("gradient reduce-scatter (last micro-step)" + tail, rb * dense_p, Window::LastBackward, 1);
        dp("parameter all-gather after the step" + tail, pb * dense_p, Window::Serial, 1);
        const int64_t M = l.ep > 1 ? l.dp / l.ep : 1;
        if (M > 1 && experts_p > 0) {
          const std::string copies = ", " + s(M) + " copies";
          out.push_back(each ? collective("edp", "expert gradient reduce-scatter (every micro-step)" + copies, M, Kd * rb * experts_p,
                                          k.dp_bw, k.dp, Window::Backward, K)
                             : collective("edp", "expert gradient reduce-scatter (last micro-step)" + copies, M, rb * experts_p,
                                          k.dp_bw, k.dp, Window::LastBackward, 1));
          out.push_back(collective("edp", "expert parameter all-gather after the step" + copies, M, pb * experts_p, k.dp_bw, k.dp,
                                   Window::Serial, 1));
        }
        break;
      }
      case 3: {
        // the outer units stay gathered from the forward to the backward of a micro-step, and so
        // does the last block (parallel/zero.h)
        int64_t outer = 0;
        for (size_t i = 0; i + static_cast<size_t>(st.blocks) < st.units.size(); ++i) outer += padded_numel(st.units[i], N);
        const double n0 = static_cast<double>(outer);
        const double n_last = st.blocks > 0 ? static_cast<double>(padded_numel(st.units.back(), N)) : 0.0;
        dp("forward parameter all-gathers", Kd * pb * psi_p, Window::Forward, K);
        dp("backward parameter all-gathers (outer unit and last block kept)", Kd * pb * (psi_p - n0 - n_last), Window::Backward, K);
        if (reduce_each) dp("gradient reduce-scatter (every micro-step)", Kd * rb * psi_p, Window::Backward, K);
        else dp("gradient reduce-scatter (last micro-step)", rb * psi_p, Window::LastBackward, 1);
        break;
      }
    }
  }

  // The step's verdict (runtime/trainer_step.cpp): [loss, non-finite] (8 B) over dp x cp for DDP
  // with more than one such rank (a world of one under mpirun decides its step alone); [loss,
  // non-finite, grad norm^2] (12 B) under ZeRO, over dp x cp, or over the world with tp; under pp
  // always the 12 B over the whole world (every stage's squared norm, the loss from the last stage).
  // MoE: every MoE layer's routing row (E counts, admitted, L_aux, L_z; zeros for another
  // stage's layers) rides in it before the norm, X = n_moe_layers (E + 3) floats more.
  const double moe_floats = static_cast<double>(m.n_moe_layers() * (m.n_experts + 3));
  const std::string moe_rows = m.is_moe() ? ", MoE routing rows" : "";
  if (pipelined) {
    out.push_back(collective("world", "step verdict all-reduce [loss, non-finite" + moe_rows + ", grad norm^2]", l.devices(),
                             2 * 4 * (3 + moe_floats), k.pp_bw, k.pp, Window::Serial, 1));
  } else if (l.zero > 0) {
    out.push_back(collective(l.tp > 1 ? "world" : "dp", "step verdict all-reduce [loss, non-finite" + moe_rows + ", grad norm^2]",
                             N * l.tp, 2 * 4 * (3 + moe_floats), k.dp_bw, k.dp, Window::Serial, 1));  // dp x cp x tp: within a node iff dp is
  } else if (N > 1) {
    out.push_back(collective("dp", "step verdict all-reduce [loss, non-finite" + moe_rows + "]", N, 2 * 4 * (2 + moe_floats), k.dp_bw,
                             k.dp, Window::Serial, 1));
  }

  // tokens per micro-batch on this rank: its b T / cp positions under context parallelism
  const double tok = static_cast<double>(l.micro_batch * m.seq_len / l.cp);
  const double d = static_cast<double>(m.d_model), a = l.compute_bytes;
  // tensor parallel: on the critical path (Megatron's all-reduces block the next GEMM)
  if (l.tp > 1) {
    // kiln (parallel/tensor_parallel.h): forward, the row-parallel outputs in the compute dtype
    // (a bytes; again in full recomputation); backward, the column-parallel inputs' gradients, in
    // the dtype of the LayerNorm outputs they flow into: fp32 under CUDA autocast (layer_norm is on
    // its fp32 list) and with fp32 weights; 16-bit on the CPU with 16-bit weights (CPU autocast
    // runs layer_norm in its input's dtype, the residual stream's).
    const double ln = l.cpu && l.param_bytes == 2 ? 2.0 : 4.0;
    const bool full = l.recompute == Recompute::Full;
    const double blocks = static_cast<double>(st.blocks);
    // an MoE block (replicated over tp) has attention's collectives only: half a dense block's
    const double tp_blocks = blocks - 0.5 * static_cast<double>(st.moe_blocks);
    if (l.sp) {
      // sequence parallelism (parallel/sequence_parallel.h): per layer and forward pass, c_attn's
      // and c_fc's inputs gathered (cast to the compute dtype first) and the two row-parallel
      // outputs reduce-scattered, 4 b T d a; backward, the column inputs gathered again for dW and
      // the row outputs' gradients gathered (4 b T d a), the column inputs' gradients
      // reduce-scattered in the LayerNorm outputs' dtype (2 b T d ln)
      const double forwards = full ? 2.0 : 1.0;
      out.push_back(collective("tp", std::string("block all-gathers + reduce-scatters (forward") + (full ? " x 2, recomputed" : "") +
                                         "; backward with the column inputs gathered again)",
                               l.tp, Kd * blocks * ((forwards + 1) * 4 * tok * d * a + 2 * tok * d * ln), k.tp_bw, k.tp,
                               Window::Serial, K));
    } else {
      const double fwd = full ? 4.0 : 2.0;
      const double per_micro = tp_blocks * (fwd * 2 * tok * d * a + 2.0 * 2 * tok * d * ln);
      out.push_back(collective("tp", "block activation all-reduces (2 forward" + std::string(full ? " + 2 recomputed" : "") +
                                         ", 2 backward per layer and micro-batch" +
                                         (st.moe_blocks > 0 ? "; half that in an MoE block)" : ")"),
                               l.tp, Kd * per_micro, k.tp_bw, k.tp, Window::Serial, K));
    }
    // the gradient norm's split part, summed over tp once per step (one double); under ZeRO or
    // pp the squared norm rides in the verdict all-reduce instead
    if (l.zero == 0 && !pipelined) {
      out.push_back(collective("tp", "gradient-norm all-reduce", l.tp, 2 * 8, k.tp_bw, k.tp, Window::Serial, 1));
    }
    // the embedding: an all-reduce (sp: a reduce-scatter forward and an all-gather backward) of
    // b T d in wte's dtype, the same bytes; the head: its input's gradient all-reduced in ln_f's
    // dtype (sp: ln_f's output gathered in the compute dtype forward and again backward, its
    // gradient reduce-scattered); the cross-entropy's max, sum-exp and target
    double edge = 0;
    if (first) edge += 2 * tok * d * l.param_bytes;
    if (last) edge += (l.sp ? 2 * tok * d * a + tok * d * ln : 2 * tok * d * ln) + 3 * 2 * tok * 4;
    const char* what = first && last ? (l.sp ? "embedding / head gathers and reduce-scatters, cross-entropy all-reduces"
                                             : "embedding / head / cross-entropy all-reduces")
                       : first       ? (l.sp ? "embedding reduce-scatter + all-gather" : "embedding all-reduce (forward)")
                                     : "head input-gradient / cross-entropy all-reduces";
    if (edge > 0) out.push_back(collective("tp", what, l.tp, Kd * edge, k.tp_bw, k.tp, Window::Serial, K));
    if (l.sp) {
      // the gradients of the parameters tp replicates, summed over tp by a hook in every backward
      // (each rank saw only its rows), in the parameters' dtype: the LayerNorms and the two
      // row-parallel biases of each block (6 d), wpe [T, d] on the first stage, ln_f on the last
      const double replicated = blocks * 6 * d + (first ? static_cast<double>(m.seq_len) * d : 0.0) + (last ? 2 * d : 0.0);
      out.push_back(collective("tp", "replicated parameters' gradient all-reduces (every backward)", l.tp,
                               Kd * 2 * l.param_bytes * replicated, k.tp_bw, k.tp, Window::Serial, K));
    }
  }
  // expert parallel (parallel/expert_parallel.h), over the ep group; serial: the experts wait
  // for their rows, and the counts' host read decides the splits
  if (l.ep > 1) {
    const bool full = l.recompute == Recompute::Full;
    const double forwards = full ? 2.0 : 1.0, moe = static_cast<double>(st.moe_blocks);
    const double E = static_cast<double>(m.n_experts), kk = static_cast<double>(m.top_k);
    // exact: every MoE layer's E int64 counts in every forward (the recomputed one too)
    if (st.moe_blocks > 0) {
      out.push_back(collective("ep", std::string("all-to-all counts, 8 E per MoE layer and forward") + (full ? " (x 2)" : ""),
                               l.ep, Kd * moe * forwards * 8.0 * E, k.ep_bw, k.ep, Window::Serial, K));
      // estimate: the rows at a balanced load without dropping, k b T each way; to the experts in
      // ln_2's output dtype (b_in), back in the experts' output dtype (b_out = the compute dtype),
      // the backward's gradients in the same two dtypes the other way
      const EpRowBytes b = ep_row_bytes(l);
      const double b_in = b.in, b_out = b.out;
      CommItem rows = collective("ep", std::string("all-to-all rows, ") + (full ? "2 fwd" : "fwd") + " + bwd (estimate: balanced)",
                                 l.ep, Kd * moe * (forwards + 1.0) * kk * tok * d * (b_in + b_out), k.ep_bw, k.ep, Window::Serial, K);
      rows.estimate = true;
      out.push_back(rows);
    }
    // the norm's expert part (clip_grad_norm_ep, DDP on one stage): one fp64 summed over ep; ZeRO's
    // shards and the pipeline's shares are summed with the verdict instead
    if (l.zero == 0 && !pipelined) {
      out.push_back(collective("ep", "gradient-norm all-reduce (the experts' squares)", l.ep, 2 * 8, k.ep_bw, k.ep, Window::Serial, 1));
    }
  }
  // context parallel (parallel/context_parallel.h): per layer and micro-batch one all-gather of
  // the stacked K and V, output [2, b, KV_t, T, h] in the compute dtype (again in a recomputed
  // forward), and one reduce-scatter of their gradients, the same size; blocking, so serial
  if (l.cp > 1) {
    const int64_t kv_t = (m.n_kv_head >= l.tp ? m.n_kv_head / l.tp : 1) * m.head_dim();
    const double gathered = 2.0 * static_cast<double>(l.micro_batch * m.seq_len * kv_t) * a;
    const double passes = l.recompute == Recompute::Full ? 3.0 : 2.0;
    out.push_back(collective("cp", std::string("K/V all-gather + gradient reduce-scatter (per layer: forward") +
                                       (l.recompute == Recompute::Full ? ", recomputed forward" : "") + ", backward)",
                             l.cp, Kd * static_cast<double>(st.blocks) * passes * gathered, k.cp_bw, k.cp, Window::Serial, K));
  }
  // pipeline (parallel/pipeline.h): the bytes this rank sends. Per micro-batch its output
  // [b, T, d] ([b, T/t, d] under sp) forward (not the last stage) and its input's gradient backward (not the first), in
  // the residual stream's dtype (the parameters'); once per step the tied wte's gradient (fp32,
  // the main grad for 16-bit weights) to the other end (first <-> last stage): the whole V'/t x d
  // slice, or under ZeRO this rank's shard of the wte unit.
  if (pipelined) {
    const double directions = (first ? 0.0 : 1.0) + (last ? 0.0 : 1.0);
    const std::string dt = l.param_bytes == 4 ? " (fp32)" : " (16-bit)";
    const std::string what = first ? "boundary activations sent forward" + dt
                             : last ? "boundary gradients sent backward" + dt
                                    : "boundary activations forward and gradients backward" + dt;
    const double rows = l.sp ? tok / static_cast<double>(l.tp) : tok;  // --sp: the rank's rows of the sequence
    out.push_back(collective("pp", what, 2, Kd * directions * rows * d * l.param_bytes, k.pp_bw, k.pp, Window::Serial, K,
                             /*ring_factor=*/false));
    if (first || last) {
      const int64_t wte = m.padded_vocab_size() * m.d_model / l.tp;
      const double sent = l.zero > 0 ? 4.0 * static_cast<double>(padded_numel(wte, N) / N) : 4.0 * static_cast<double>(wte);
      out.push_back(collective("pp", std::string("tied wte gradient sent to the ") + (first ? "last" : "first") + " stage" +
                                         (l.zero > 0 ? " (its dp shard)" : ""),
                               2, sent, k.pp_bw, k.pp, Window::Serial, 1, /*ring_factor=*/false));
    }
  }
  // offload: host <-> device copies and the host AdamW
  if (l.offload != Offload::None) {
    const double shard = static_cast<double>(st.psi_padded / N);
    auto host = [&](std::string what, double bytes, Window w, int64_t occ) {
      out.push_back(collective("host", std::move(what), 1, bytes, c.host_link, "pcie", w, occ, false));
    };
    const double pb = l.param_bytes;  // the fp32 gradient shard down, the working weights' shard up
    host("gradient shard to host", 4 * shard, Window::Serial, 1);
    if (l.offload == Offload::Optimizer) {
      host("parameter shard to device", pb * shard, Window::Serial, 1);
    } else {
      host("parameter shard to device before each forward", Kd * pb * shard, Window::Forward, K);
      host("parameter shard to device before each backward", Kd * pb * shard, Window::Backward, K);
    }
    CommItem adam;
    adam.group = "host";
    adam.what = "host AdamW over the shard";
    adam.link = "host-cpu";
    adam.busbw = c.host_adam_rate / static_cast<double>(std::min(c.devices_per_node, l.devices()));
    adam.seconds = shard / adam.busbw;  // busbw here: parameters/s this rank's share of the host gives
    out.push_back(adam);
  }
  return out;
}

// Serial communication plus what the compute windows cannot hide (section 5).
double exposed_seconds(const std::vector<CommItem>& items, double t_f, double t_b, int64_t K) {
  double serial = 0, net_f = 0, net_b = 0, net_last = 0, host_f = 0, host_b = 0, host_last = 0;
  for (const auto& it : items) {
    const bool host = it.group == "host";
    const double each = it.seconds / static_cast<double>(std::max<int64_t>(1, it.occurrences));
    switch (it.window) {
      case Window::Serial: serial += it.seconds; break;
      case Window::Forward: (host ? host_f : net_f) += each; break;
      case Window::Backward: (host ? host_b : net_b) += each; break;
      case Window::LastBackward: (host ? host_last : net_last) += it.seconds; break;
    }
  }
  const double Kd = static_cast<double>(K);
  const double fwd = Kd * std::max(0.0, std::max(net_f, host_f) - t_f);
  const double bwd = (Kd - 1) * std::max(0.0, std::max(net_b, host_b) - t_b) +
                     std::max(0.0, std::max(net_b + net_last, host_b + host_last) - t_b);
  return serial + fwd + bwd;
}

}  // namespace

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
  const double Kd = static_cast<double>(l.grad_accum);
  const std::vector<int64_t> blocks = stage_blocks(model, l);
  const std::vector<int64_t> starts = pipeline_block_starts(blocks);
  // Each stage's forward FLOPs per token (section 5): its blocks, and on the last stage the
  // output layer and ln_f (2 x their parameters); the whole F/3 without pipelining.
  // a rank's share: the tp slice of its b T / cp positions (cp's mirrored chunks even out attention)
  const double per_device = tok / static_cast<double>(l.tp * l.cp) / cluster.sustained_flops();
  const double head_fwd = 2 * (static_cast<double>(model.padded_vocab_size()) * d + 2 * d);
  auto stage_times = [&](StagePlan& st) {
    const bool pipelined = l.pp > 1;
    double f = 0, re = 0;
    for (int64_t i = st.first_block; i < st.first_block + st.blocks; ++i) f += block_fwd(i), re += block_re(i);
    if (!pipelined) f = p.flops_per_token / 3.0, re = p.recompute_flops_per_token;
    if (pipelined && st.stage == l.pp - 1) f += head_fwd;
    st.forward_s = f * per_device;
    st.backward_s = (2.0 * f + re) * per_device;
  };

  // per stage: memory and communication
  const Links links = links_for(l, cluster);
  const ActivationBytes kept = layer_activation_bytes(model, l, l.recompute);
  const ActivationBytes none = layer_activation_bytes(model, l, Recompute::None);
  const ActivationBytes kept_moe = layer_activation_bytes(model, l, l.recompute, /*moe=*/true);
  const ActivationBytes none_moe = layer_activation_bytes(model, l, Recompute::None, /*moe=*/true);
  const double a = l.compute_bytes, r = 4.0;
  const double Vp = static_cast<double>(model.padded_vocab_size()), V = static_cast<double>(model.vocab_size);
  const double logp = l.tp > 1 ? 4.0 * Vp / static_cast<double>(l.tp) : 4.0 * V;  // fp32 log-probabilities per token
  const int64_t G = l.grad_ranks();  // ZeRO's shards: over dp x cp
  // tokens of a micro-batch on this rank (its b T / cp positions), and, under sp, the residual
  // stream's rows of them (b T / t)
  const double local = tok / static_cast<double>(l.cp);
  const double rows = l.sp ? local / static_cast<double>(l.tp) : local;
  for (int64_t s = 0; s < l.pp; ++s) {
    StagePlan st;
    st.stage = s;
    st.blocks = blocks[static_cast<size_t>(s)];
    st.first_block = starts[static_cast<size_t>(s)];
    for (int64_t i = st.first_block; i < st.first_block + st.blocks; ++i) st.moe_blocks += model.is_moe_layer(i) ? 1 : 0;
    st.units = rank_units(model, l.tp, l.pp, s, l.pp_split, l.ep);
    stage_times(st);
    for (int64_t i = st.first_block; i < st.first_block + st.blocks; ++i) st.psi_experts += block_expert_numel(model, i, l.ep);
    const int64_t M = l.dp / l.ep;  // the expert-data-parallel group
    if (l.zero > 0 && l.ep > 1) {  // the experts' units split off their blocks' (parallel/zero.h)
      const size_t outer = st.units.size() - static_cast<size_t>(st.blocks);
      for (int64_t i = 0; i < st.blocks; ++i) {
        const int64_t e = block_expert_numel(model, st.first_block + i, l.ep);
        if (e == 0) continue;
        st.units[outer + static_cast<size_t>(i)] -= e;
        st.expert_units.push_back(e);
      }
    }
    st.psi = sum_units(st.units) + sum_units(st.expert_units);
    st.psi_experts_padded = sum_padded(st.expert_units, M);
    st.psi_padded = sum_padded(st.units, G) + st.psi_experts_padded;
    st.state = model_state(st.units, l);
    if (!st.expert_units.empty()) st.state += model_state(st.expert_units, l, M);
    st.state.device.cast_copies = cast_copy_bytes(model, l, st.blocks, st.first_block);

    const bool first = s == 0, last = s == l.pp - 1;
    const double in_flight = static_cast<double>(std::min<int64_t>(l.pp - s, l.grad_accum));
    const double dense_blocks = static_cast<double>(st.blocks - st.moe_blocks), moe_blocks = static_cast<double>(st.moe_blocks);
    double per_micro_batch = dense_blocks * kept.layer_bytes(tok, l.tp, l.sp, l.cp) +
                             moe_blocks * kept_moe.layer_bytes(tok, l.tp, l.sp, l.cp);
    // outside the blocks: token ids (every position under sp, which embeds the whole sequence
    // before its reduce-scatter); the embedding's dropout mask and ln_f's input, stats and output
    // (the head keeps its rows under sp) on the residual stream's rows; log-probs and targets of
    // every position the rank's loss covers
    if (first) per_micro_batch += 8.0 * local + (l.dropout ? (l.cpu ? 4.0 : 1.0) * d * rows : 0.0);
    if (last) per_micro_batch += (r * d + 8.0 + a * d) * rows + (logp + 8.0) * local;
    st.activation_bytes = per_micro_batch * in_flight;
    // context parallelism's causal mask: one additive [2C, T] bias in the compute dtype for the
    // run, shared by every layer and micro-batch (parallel/context_parallel.h)
    if (l.cp > 1) st.activation_bytes += a * (static_cast<double>(model.seq_len) / static_cast<double>(l.cp)) * static_cast<double>(model.seq_len);

    double transient = 0;
    if (last) transient += local * (a * Vp / static_cast<double>(l.tp) + logp);  // logits and the log-probs' gradient
    // MoE backward (models/moe.cpp runs expert e on the slices fc_w[e], ...): each slice's
    // gradient is a full-size [E, ...] tensor (select_backward), summed into one buffer per
    // stacked weight: while a layer's backward runs, the four buffers (E x the expert's numel) and
    // one more full fc_w-sized gradient, in the weights' dtype
    if (st.moe_blocks > 0) {
      const double E = static_cast<double>(model.n_experts / l.ep), F = static_cast<double>(model.mlp_hidden());
      transient += static_cast<double>(l.param_bytes) * E * (static_cast<double>(mlp_numel(model, 1)) + F * d);
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
    const bool full_buffer = l.zero == 1 || (l.zero_accum == ZeroAccum::Local && l.grad_accum > 1);
    if (l.zero >= 2 && !full_buffer) transient += 2 * 4 * static_cast<double>(biggest);
    if (l.zero == 3) {  // gathered in the working weights' dtype
      const double pb = l.param_bytes;
      transient += pb * static_cast<double>(outer_units) + 2 * pb * static_cast<double>(max_block);
    }
    st.transient_bytes = transient;
    st.peak_device_bytes = static_cast<double>(st.state.device.total()) + st.activation_bytes + transient + l.base_bytes;
    st.host_bytes = static_cast<double>(st.state.host.total());

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
    // its step: K micro-batches, the bubble's p - 1 micro-batch slots, its exposed communication
    st.step_s = (Kd + static_cast<double>(l.pp - 1)) * (st.forward_s + st.backward_s) + st.exposed_comm_s;
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
  p.bubble_s = static_cast<double>(l.pp - 1) * (p.forward_s + p.backward_s);
  p.exposed_comm_s = slow.exposed_comm_s;
  p.step_s = p.compute_s + p.exposed_comm_s + p.bubble_s;
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
