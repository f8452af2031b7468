// plan/memory.cpp -- plan/cost_model.h's sections 2 and 3: the blocks' sizes, the model-state
// bytes of a layout (ZeRO's padded shards, autocast's cast copies) and the activation bytes.
#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>

#include "distributed/error.h"
#include "kernels/float8_filter.h"
#include "models/flops.h"
#include "parallel/pipeline_layout.h"

namespace kiln::plan {

namespace {

constexpr int64_t kAlign = 64;  // ZeRO shard alignment, elements
// RNG states a checkpoint saves for its replay (docs/activation_checkpointing.md): the default
// CPU generator's, and a CUDA device generator's.
constexpr double kCpuGeneratorState = 5056, kCudaGeneratorState = 16;

// The attention half of a block at tp = t, with both norms (section 2): c_attn's bias where the
// bias pattern gives it one (all, qkv), attn c_proj's only under all.
int64_t attention_numel(const GPTConfig& m, int64_t t) {
  const int64_t d = m.d_model, hd = m.head_dim(), q = m.attn_width() / t;
  const int64_t kv_heads = m.n_kv_head >= t ? m.n_kv_head / t : 1;  // replicated when t exceeds them
  const int64_t qkv = q + 2 * kv_heads * hd;
  return norm_numel(m)                                       // ln_1
         + d * qkv + (m.qkv_bias() ? qkv : 0)                // c_attn (column-parallel: weight and bias split)
         + q * d + (m.linear_bias() ? d : 0)                 // attn c_proj (row-parallel: bias whole)
         + (m.qk_norm ? 2 * hd : 0)                          // Qwen3's q / k norms (replicated)
         + norm_numel(m);                                    // ln_2
}

}  // namespace

int64_t norm_numel(const GPTConfig& m) { return m.rmsnorm() ? m.d_model : 2 * m.d_model; }

// One expert, or the dense MLP at tp = t: c_fc [F, d] + b (column-parallel; SwiGLU [2F, d] + b,
// gate and up), c_proj [d, F] + b (row-parallel: bias whole); the biases only under bias = all.
int64_t mlp_numel(const GPTConfig& m, int64_t t) {
  const int64_t d = m.d_model, f = m.mlp_hidden() / t, fc = m.swiglu() ? 2 * f : f;
  const bool b = m.linear_bias();
  return d * fc + (b ? fc : 0) + f * d + (b ? d : 0);
}

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

Float8Layers block_float8_layers(const GPTConfig& m, const Layout& l, int64_t index) { return float8_layers_of(m, l, m.is_moe_layer(index)); }

Float8Layers float8_layers_of(const GPTConfig& m, const Layout& l, bool moe) {
  Float8Layers out;
  if (l.float8 == 0) return out;
  const bool auto_filter = !l.fp8_filter_all;
  const int64_t t = l.tp, d = m.d_model, hd = m.head_dim(), q = m.attn_width();
  // a layer of whole shape [n, k] whose tp part is [part_n, part_k]
  auto take = [&](int64_t n, int64_t k, int64_t part_n, int64_t part_k) {
    return float8_layer_eligible(n, k, auto_filter) && part_n % 16 == 0 && part_k % 16 == 0;
  };
  const int64_t kv_heads = m.n_kv_head >= t ? m.n_kv_head / t : 1;
  out.c_attn = take(q + 2 * m.n_kv_head * hd, d, q / t + 2 * kv_heads * hd, d);  // column-parallel
  out.attn_proj = take(d, q, d, q / t);                                         // row-parallel
  const int64_t f = m.mlp_hidden(), fc = m.swiglu() ? 2 * f : f;
  if (!moe) {
    out.c_fc = take(fc, d, fc / t, d);
    out.mlp_proj = take(d, f, d, f / t);
  } else {  // the experts: whole on their rank; both of an expert's layers, or neither (models/gpt.cpp)
    out.experts = l.float8 == 2 && float8_layer_eligible(fc, d, auto_filter) && float8_layer_eligible(d, f, auto_filter);
  }
  return out;
}

int64_t block_float8_numel(const GPTConfig& m, const Layout& l, int64_t index) {
  const Float8Layers f8 = block_float8_layers(m, l, index);
  const int64_t d = m.d_model, hd = m.head_dim(), q = m.attn_width(), f = m.mlp_hidden(), fc = m.swiglu() ? 2 * f : f;
  return (f8.c_attn ? (q + 2 * m.n_kv_head * hd) * d : 0) + (f8.attn_proj ? d * q : 0) + (f8.c_fc ? fc * d : 0) +
         (f8.mlp_proj ? d * f : 0) + (f8.experts ? m.top_k * (fc * d + d * f) : 0);
}

bool float8_gathered(const Layout& l) { return l.zero == 3 && l.float8 == 1 && l.offload != Offload::All; }

int64_t float8_parts_numel(const GPTConfig& m, const Layout& l, const Float8Layers& f8) {
  const int64_t t = l.tp, d = m.d_model, hd = m.head_dim(), q = m.attn_width(), f = m.mlp_hidden(), fc = m.swiglu() ? 2 * f : f;
  const int64_t kv_heads = m.n_kv_head >= t ? m.n_kv_head / t : 1;
  return (f8.c_attn ? (q / t + 2 * kv_heads * hd) * d : 0) + (f8.attn_proj ? d * (q / t) : 0) + (f8.c_fc ? (fc / t) * d : 0) +
         (f8.mlp_proj ? d * (f / t) : 0);
}

std::pair<int64_t, int64_t> block_float8_gathered(const GPTConfig& m, const Layout& l, int64_t index) {
  if (!float8_gathered(l)) return {0, 0};
  Float8Layers f8 = block_float8_layers(m, l, index);
  f8.c_attn = f8.c_attn && m.n_kv_head >= l.tp;  // not where tp replicates the kv heads
  f8.experts = false;
  const int64_t weights = (f8.c_attn ? 1 : 0) + (f8.attn_proj ? 1 : 0) + (f8.c_fc ? 1 : 0) + (f8.mlp_proj ? 1 : 0);
  return {float8_parts_numel(m, l, f8), weights};
}

int64_t block_float8_kept(const GPTConfig& m, const Layout& l, int64_t index) {
  if (l.float8 == 0 || l.zero == 3) return 0;
  return float8_parts_numel(m, l, block_float8_layers(m, l, index));
}

// ---- 2. model-state bytes -------------------------------------------------------------------

std::vector<int64_t> stage_blocks(const GPTConfig& m, const Layout& l) {
  return pipeline_block_counts(m.n_layer, l.pp, l.pp_split, l.pp_virtual);
}

namespace {
std::vector<std::vector<int64_t>> chunks_of(const std::vector<int64_t>& counts, int64_t pp, int64_t stage) {
  const auto starts = pipeline_block_starts(counts);
  std::vector<std::vector<int64_t>> out;
  for (size_t v = static_cast<size_t>(stage); v < counts.size(); v += static_cast<size_t>(pp)) {
    out.emplace_back();
    for (int64_t i = starts[v]; i < starts[v + 1]; ++i) out.back().push_back(i);
  }
  return out;
}
}  // namespace

std::vector<std::vector<int64_t>> stage_chunks(const GPTConfig& m, const Layout& l, int64_t stage) {
  return chunks_of(stage_blocks(m, l), l.pp, stage);
}

// kiln's units (parallel/zero.cpp units_of). The whole model (pp 1): [wte, wpe, ln_f, lm_head]
// (those it has: wpe with learned positions, lm_head when the output layer is untied), then the
// blocks. A pipeline stage: [wte] where it holds it (the first stage's, or the last stage's tied
// copy: laid out alike, so the tied-embedding sync adds shard to shard), then [wpe, ln_f,
// lm_head] as far as it holds them, then its blocks.
std::vector<int64_t> rank_units(const GPTConfig& m, int64_t tp, int64_t pp, int64_t stage, const std::string& pp_split,
                                int64_t ep, int64_t pp_virtual) {
  const int64_t d = m.d_model;
  const int64_t wte = m.padded_vocab_size() * d / tp, wpe = m.position_params(), ln_f = norm_numel(m);
  const int64_t lm_head = m.tie_embeddings ? 0 : wte;  // vocabulary-parallel rows, as wte's
  const auto blocks = pipeline_block_counts(m.n_layer, pp, pp_split, pp_virtual);
  if (stage < 0 || stage >= pp) throw ConfigError("pipeline stage " + std::to_string(stage) + " of " + std::to_string(pp));
  const bool first = stage == 0, last = stage == pp - 1;
  std::vector<int64_t> units;
  if (pp == 1) {
    units.push_back(wte + wpe + ln_f + lm_head);
  } else {
    if (first || (last && m.tie_embeddings)) units.push_back(wte);
    const int64_t outer = (first ? wpe : 0) + (last ? ln_f + lm_head : 0);
    if (outer > 0) units.push_back(outer);
  }
  for (const auto& chunk : chunks_of(blocks, pp, stage))
    for (int64_t i : chunk) units.push_back(block_numel(m, tp, i, ep));
  return units;
}

// models/gpt.cpp's parameters, as rank_units lays out the stage: [wte] where the embedding is or
// a tied head, [wpe] with learned positions on the first stage, [ln_f, lm_head] on the last; a
// block's ln_1, c_attn (+ bias), attn c_proj (+ bias), ln_2 and c_fc, c_proj (+ biases), or an MoE
// layer's router, fc_w (+ fc_b), proj_w (+ proj_b) (models/moe.cpp). tp and ep split tensors, never
// remove one.
int64_t rank_param_tensors(const GPTConfig& m, const Layout& l, int64_t stage) {
  const int64_t norm = m.rmsnorm() ? 1 : 2, lb = m.linear_bias() ? 1 : 0;
  const bool first = stage == 0, last = stage == l.pp - 1;
  int64_t n = 0;
  if (first || (last && m.tie_embeddings)) n += 1;  // wte
  if (first && !m.rope()) n += 1;                    // wpe
  if (last) n += norm + (m.tie_embeddings ? 0 : 1);  // ln_f, lm_head
  for (const auto& chunk : stage_chunks(m, l, stage)) {
    for (int64_t i : chunk) {
      n += 2 * norm + (1 + (m.qkv_bias() ? 1 : 0)) + (1 + lb);  // ln_1, ln_2, c_attn, attn c_proj
      n += m.is_moe_layer(i) ? 1 + 2 * (1 + lb) : 2 * (1 + lb);   // router + experts, or c_fc, c_proj
    }
  }
  return n;
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
    // 16-bit working weights: 2-byte parameters, fp32 main grads (or the 2-byte gradients where
    // nothing accumulates), fp32 master + m + v (optim/adamw.h).
    out.device = {l.param_bytes * psi, (l.reads_16bit_grads() ? 2 : 4) * psi, (l.param_bytes == 2 ? 12 : 8) * psi};
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
    case Offload::Optimizer:  // the host master is fp32 under either policy; 16-bit weights: the
                              // host update's 2-byte copy, page-locked, that goes up (parallel/zero.h)
      out.device = {params, grads, 0};
      out.host = {pb == 2 ? 2 * shard : 0, 4 * shard, 12 * shard};
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
// product adds them; each bias only where the bias pattern has it), as block_numel splits them. An MoE block: the attention's only (the
// experts' slices are not leaves, which autocast does not cache; optim/precision.cpp).
int64_t cast_copy_bytes(const GPTConfig& m, const Layout& l, int64_t blocks, int64_t first_block) {
  if (l.param_bytes == 2 || l.compute_bytes == 4) return 0;
  // recomputation runs without the cast cache (parallel/activation_checkpoint.h): under full no
  // block's cast outlives its forward; under selective a GELU feed-forward's c_proj is cast
  // afresh inside gelu_linear (optim/precision.h autocast_cached_numel, the trainer's count)
  if (l.recompute == Recompute::Full) return 0;
  const bool gelu_linear = l.recompute == Recompute::Selective && !m.swiglu();
  const int64_t t = l.tp, d = m.d_model, f = m.mlp_hidden() / t, hd = m.head_dim(), q = m.attn_width() / t;
  const int64_t kv_heads = m.n_kv_head >= t ? m.n_kv_head / t : 1;
  const int64_t qkv = q + 2 * kv_heads * hd, fc = m.swiglu() ? 2 * f : f;
  const bool b = m.linear_bias(), row_bias = b && t == 1;
  const int64_t attention = (d * qkv + (m.qkv_bias() ? qkv : 0)) + q * d + (row_bias ? d : 0);
  const int64_t mlp = (d * fc + (b ? fc : 0)) + (gelu_linear ? 0 : f * d + (row_bias ? d : 0));
  int64_t total = 0;
  for (int64_t i = first_block; i < first_block + blocks; ++i) total += attention + (m.is_moe_layer(i) ? 0 : mlp);
  return 2 * total;
}

// ---- 3. activations -------------------------------------------------------------------------

double norm_output_bytes(const GPTConfig& m, const Layout& l) {
  // CUDA autocast runs layer_norm on its fp32 list (LibTorch 2.11's AT_FORALL_FP32; rms_norm is
  // not on it); the CPU's runs both in their input's dtype, the residual stream's, and so do
  // kiln's fused norms (kernels/norm.h)
  if (l.cpu || m.rmsnorm() || l.fused_kernels) return static_cast<double>(l.param_bytes);
  return 4.0;
}

double norm_kept_bytes(const GPTConfig& m, const Layout& l, double r) {
  // kiln's fused norm (kernels/norm.h), LayerNorm or RMSNorm: its input as it is, fp32 mean and rstd
  if (l.fused_kernels && !l.cpu) return r * static_cast<double>(m.d_model) + 8.0;
  // LayerNorm: its input (on a GPU the fp32 copy autocast's fp32 policy makes of a 16-bit one),
  // fp32 mean and rstd
  if (!m.rmsnorm()) return (l.cpu ? r : std::max(r, 4.0)) * static_cast<double>(m.d_model) + 8.0;
  // RMSNorm. On a GPU at::rms_norm is LibTorch's fused kernel: it keeps its input and the fp32
  // rstd. On the CPU it is the composite (no CPU kernel in 2.11): the input upcast to fp32 (the
  // input itself when it is fp32, else a copy, and then the 16-bit input is not kept), the fp32
  // rstd, and x * rstd in fp32 (kept by the weight's product). Measured:
  // tests/test_activation_checkpoint.cpp, LlamaFamilyMemoryKeptIsThePlans.
  const double d = static_cast<double>(m.d_model);
  return l.cpu ? 8.0 * d + 4.0 : r * d + 4.0;
}

ActivationBytes layer_activation_bytes(const GPTConfig& m, const Layout& l, Recompute mode, bool moe) {
  // r: the residual stream's bytes, the parameters' dtype (fp32, or 16-bit working weights).
  const double a = l.compute_bytes, r = l.param_bytes, mk = l.cpu ? 4.0 : 1.0;
  const double d = static_cast<double>(m.d_model), H = static_cast<double>(m.n_head);
  const double T = static_cast<double>(m.seq_len), F = static_cast<double>(m.mlp_hidden());
  const double kv = static_cast<double>(m.n_kv_head * m.head_dim());
  ActivationBytes out;
  if (mode != Recompute::None) out.per_layer = kCpuGeneratorState + (l.cpu ? 0.0 : kCudaGeneratorState);
  if (mode == Recompute::Full) {
    out.replicated = r * d;  // the block's input (its rank's rows under sp or cp)
    return out;
  }
  // the two norms (each: its input -- x, then y = x + attention --, and its statistics; RMSNorm
  // on the CPU more, norm_kept_bytes), their outputs in the compute dtype (c_attn's and c_fc's
  // inputs), the residual-dropout masks (under sp the rank's T/t rows of each: c_attn and c_fc
  // keep their input's rows and gather them again in backward)
  // (the two masks in the dtype of the branch outputs they scale: the compute dtype; a GPU's are bool)
  out.replicated = 2.0 * norm_kept_bytes(m, l, r) + 2.0 * a * d + (l.dropout ? 2.0 * (l.cpu ? a : 1.0) * d : 0.0);
  if (moe) {
    // An MoE layer (models/moe.cpp's ops; section 3 MoE), replicated over tp: ln_2's output in
    // fp32 (the router's input) in place of c_fc's a d copy; the router's logits and
    // probabilities, the logsumexp; the top-k indices, probabilities and their sum; per
    // assignment the expert's input, its hidden layer (GELU: h, gelu(h); SwiGLU: [gate | up],
    // silu(gate), the product), its output, the gated output in ln_2's dtype (index_add keeps
    // its source), the gate and two int64 indices. ln_2's dtype: norm_output_bytes (as tp's
    // ln, section 4).
    const double E = static_cast<double>(m.n_experts), k = static_cast<double>(m.top_k);
    const double ln = norm_output_bytes(m, l);
    const double topk = m.top_k > 1 ? 12.0 * k + 4.0 : 8.0;  // k = 1: the gate is the probability, only the index is kept
    // --ep: the arrived rows' (l, j) order, an int64 per row this rank's experts run (kept by
    // index_select and index_copy, one tensor), k per token at a balanced load
    const double ep_order = l.ep > 1 ? 8.0 : 0.0;
    // (SwiGLU fused, kernels/swiglu.h: [gate | up] and the product, no silu(gate))
    const double hidden = (m.swiglu() ? (l.fused_kernels && !l.cpu ? 3.0 : 4.0) : 2.0) * a * F;
    out.replicated += (4.0 - a) * d + 8.0 * E + 4.0 + topk + k * (2.0 * a * d + hidden + ln * d + a + 16.0 + ep_order);
    // Per layer and micro-batch: the 16-bit casts of the experts' fp32 weights, saved by their
    // linears (not autocast's cache: the slices fc_w[e] are not leaves), every expert (the rank's
    // E/ep under --ep) assumed to receive tokens; with 16-bit weights the router's fp32 copy.
    const double matrices = (m.swiglu() ? 3.0 : 2.0) * F * d;  // c_fc (SwiGLU: gate and up) and c_proj
    const double local_experts = static_cast<double>(m.n_experts / std::max<int64_t>(1, l.ep));
    if (a == 2 && r == 4) out.per_layer += a * matrices * local_experts;
    if (r == 2) out.per_layer += 4.0 * E * d;
  }
  // q: the query heads' width, d but for Qwen3's shapes (GPTConfig::head_width; its q / k norms'
  // own kept tensors are not counted here)
  const double q = static_cast<double>(m.attn_width());
  const double qkv_views = a * (q + 2.0 * kv);
  // rotary positions: the rotated q and k are new tensors, kept beside c_attn's output (v still
  // views it); the math path copies q, k, v anyway (measured: the same 3 a d with or without)
  const double rotated = m.rope() ? a * (q + kv) : 0.0;
  double core = 0.0;
  if (mode == Recompute::Selective) {
    core = qkv_views + rotated;  // the attention checkpoint's inputs only
  } else if (l.attention == Attention::Flash) {
    core = qkv_views + rotated + 4.0 * H;  // q, k, v (+ rotated q, k) + fp32 logsumexp
  } else {
    core = 3.0 * a * q + a * H * T + (l.dropout ? (mk + a) * H * T : 0.0);
  }
  // the feed-forward: GELU keeps h and gelu(h) (selective recomputes gelu(h)); SwiGLU keeps
  // h = [gate | up], silu(gate) and the product (all of them under selective too: not recomputed);
  // kiln's fused SwiGLU (kernels/swiglu.h) keeps h and the product, no silu(gate)
  const double swiglu_kept = (l.fused_kernels && !l.cpu ? 3.0 : 4.0) * a * F;
  const double mlp_kept = m.swiglu() ? swiglu_kept : a * F + (mode == Recompute::Selective ? 0.0 : a * F);
  // an MoE block has no split MLP (its experts are in `replicated`, kept under selective too)
  out.split = core + a * q /* attention out */ + (moe ? 0.0 : mlp_kept);
  if (l.float8 == 1) {
    // --precision fp8, tensorwise (kernels/float8.h): a float8 layer keeps its input as q_x, 1 byte
    // an element, in place of its 16-bit copy (the norm outputs, the attention output, the
    // feed-forward's product or gelu(h), which nothing else keeps; rowwise keeps the 16-bit input
    // as bf16 does). Under sp a column layer keeps the gathered q_x of the whole sequence, not its
    // rank's rows (no gather in backward). Selective recomputation's gelu(h) hook steps aside for a
    // float8 feed-forward (models/gpt.cpp), so c_proj keeps it. q_W: the step's kept forms
    // (cast_copies), ZeRO-3's gathered bytes -- or, ZeRO-3 gathering in 16 bits (--offload all), a
    // fresh q_W [N, K] per layer and micro-batch (per_layer). The 16-row padding of q_x is left out.
    const Float8Layers f8 = float8_layers_of(m, l, moe);
    const double dd = d;
    for (const bool column : {f8.c_attn, f8.c_fc}) {
      if (!column) continue;
      if (l.sp) {
        out.replicated -= a * dd;
        out.unsplit += dd;
      } else {
        out.replicated -= (a - 1.0) * dd;
      }
    }
    if (f8.attn_proj) out.split -= (a - 1.0) * q;
    if (f8.mlp_proj) out.split += mode == Recompute::Selective && !m.swiglu() ? F : -(a - 1.0) * F;
    if (l.zero == 3 && !float8_gathered(l)) out.per_layer += static_cast<double>(float8_parts_numel(m, l, f8));
  }
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

}  // namespace kiln::plan
