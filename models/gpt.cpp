// models/gpt.cpp -- forward pass and initialisation of the GPT-2 model.
#include "models/gpt.h"

#include <cmath>
#include <limits>
#include <tuple>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/SDPBackend.h>
#include <ATen/autocast_mode.h>

#include "distributed/error.h"
#include "kernels/gelu_mlp.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/swiglu.h"
#include "models/linear_cross_entropy.h"

namespace kiln {

LinearImpl::LinearImpl(int64_t in, int64_t out, const at::TensorOptions& opts, bool with_bias) {
  weight = register_parameter("weight", at::empty({out, in}, opts));
  if (with_bias) bias = register_parameter("bias", at::empty({out}, opts));
}

at::Tensor LinearImpl::forward(const at::Tensor& x) const {
  if (float8.on && float8.cache && !is_training()) {  // an evaluation may run between an update and the next step
    Float8Scaling fresh = float8;
    fresh.cache = nullptr;
    return linear_product(x, weight, bias, &fresh);
  }
  return linear_product(x, weight, bias, float8.on ? &float8 : nullptr);
}

LayerNormImpl::LayerNormImpl(int64_t d, double eps_, const at::TensorOptions& opts, bool rms_) : eps(eps_), rms(rms_) {
  weight = register_parameter("weight", at::empty({d}, opts));
  if (!rms) bias = register_parameter("bias", at::empty({d}, opts));
}

at::Tensor LayerNormImpl::forward(const at::Tensor& x) const {
  if (fp32_under_autocast && at::autocast::is_autocast_enabled(x.device().type())) {
    return norm(x.to(at::kFloat), weight.to(at::kFloat), rms ? at::Tensor() : bias.to(at::kFloat), eps, rms,
                Kernels::reference);
  }
  return norm(x, weight, bias, eps, rms, kernels);
}

std::pair<at::Tensor, at::Tensor> LayerNormImpl::forward_add(const at::Tensor& x, const at::Tensor& r) const {
  if (!fp32_under_autocast && add_norm_fused(x, r, kernels)) return add_norm(x, r, weight, bias, eps, rms, kernels);
  at::Tensor s = x + r;
  at::Tensor y = forward(s);
  return {std::move(s), std::move(y)};
}

AttentionImpl::AttentionImpl(const GPTConfig& cfg, const at::TensorOptions& opts, const ModelShard& shard,
                             std::shared_ptr<RotaryEmbedding> rope)
    : n_head_(cfg.n_head / shard.tp),
      n_kv_head_(cfg.n_kv_head >= shard.tp ? cfg.n_kv_head / shard.tp : 1),  // tp > kv heads: one, replicated
      head_dim_(cfg.head_dim()),
      dropout_(cfg.dropout), ops_(shard.ops), rope_(std::move(rope)) {
  const int64_t d = cfg.d_model;
  // Column-split c_attn: this rank's q heads, then its k and v heads. Row-split c_proj.
  c_attn = register_module("c_attn", std::make_shared<LinearImpl>(d, (n_head_ + 2 * n_kv_head_) * head_dim_, opts, cfg.qkv_bias()));
  c_proj = register_module("c_proj", std::make_shared<LinearImpl>(n_head_ * head_dim_, d, opts, cfg.linear_bias()));
  if (cfg.qk_norm) {
    q_norm = register_module("q_norm", std::make_shared<LayerNormImpl>(head_dim_, cfg.layer_norm_eps, opts, /*rms=*/true));
    k_norm = register_module("k_norm", std::make_shared<LayerNormImpl>(head_dim_, cfg.layer_norm_eps, opts, /*rms=*/true));
  }
}

at::Tensor grouped_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal) {
  const int64_t groups = q.size(1) / k.size(1);
  if (groups > 1) {
    const int64_t choice = at::_fused_sdp_choice(q, k, v, mask, dropout_p, is_causal, std::nullopt, /*enable_gqa=*/true);
    if (choice == static_cast<int64_t>(at::SDPBackend::math)) {
      return at::scaled_dot_product_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), mask,
                                              dropout_p, is_causal);
    }
  }
  return at::scaled_dot_product_attention(q, k, v, mask, dropout_p, is_causal, /*scale=*/std::nullopt,
                                          /*enable_gqa=*/groups > 1);
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout_p,
                            const at::Tensor& mask) {
  return grouped_attention(q, k, v, mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt, dropout_p,
                           /*is_causal=*/!mask.defined());
}

at::Tensor document_ids_of(const at::Tensor& idx, int64_t token) { return idx.eq(token).to(at::kLong).cumsum(1); }

at::Tensor document_mask(const at::Tensor& document_ids) {
  const at::Tensor order = at::arange(document_ids.size(1), document_ids.options());
  return document_mask_at(document_ids, order, order);
}

at::Tensor document_mask_at(const at::Tensor& document_ids, const at::Tensor& queries, const at::Tensor& keys, int64_t window) {
  at::Tensor allowed = keys.unsqueeze(0).le(queries.unsqueeze(1));                                    // [Tq, Tk]: causal
  if (window > 0) allowed = allowed.logical_and(keys.unsqueeze(0).gt(queries.unsqueeze(1) - window));  // the last W
  if (!document_ids.defined()) return allowed.unsqueeze(0).unsqueeze(0);
  const at::Tensor q = document_ids.index_select(1, queries), k = document_ids.index_select(1, keys);  // [B, Tq], [B, Tk]
  return q.unsqueeze(2).eq(k.unsqueeze(1)).logical_and(allowed).unsqueeze(1);
}

at::Tensor document_positions_of(const at::Tensor& idx, int64_t token) {
  const int64_t T = idx.size(1);
  const at::Tensor t = at::arange(T, idx.options()).expand(idx.sizes());
  const at::Tensor starts = at::where(idx.eq(token), t, at::zeros_like(t));  // each opening token's position, else 0
  return t - std::get<0>(starts.cummax(1));                                   // minus the last opening at or before it
}

const at::Tensor& AttentionMask::bias_in(at::ScalarType dtype, const at::Tensor& queries, const at::Tensor& keys) {
  if (!bias.defined() || bias.scalar_type() != dtype) {
    const at::Tensor allowed = queries.defined() ? document_mask_at(ids, queries, keys, window) : document_mask_at(ids, order, order, window);
    bias = at::zeros(allowed.sizes(), allowed.options().dtype(dtype))
               .masked_fill_(allowed.logical_not(), -std::numeric_limits<double>::infinity());
  }
  return bias;
}

const at::Tensor& AttentionMask::cu_seqlens() {
  if (!starts.defined()) {
    const int64_t T = order.size(0);
    // a row's first position opens a piece; so does every change of document within a row
    at::Tensor open = at::zeros({batch, T}, order.options().dtype(at::kBool));
    open.select(1, 0).fill_(true);
    if (ids.defined()) open.narrow(1, 1, T - 1).logical_or_(ids.narrow(1, 1, T - 1).ne(ids.narrow(1, 0, T - 1)));
    starts = at::cat({open.reshape({-1}).nonzero().reshape({-1}), at::full({1}, batch * T, order.options())}).to(at::kInt);
  }
  return starts;
}

bool varlen_flash_eligible(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Kernels kernels) {
  const int64_t h = q.size(3);
  return kernels == Kernels::fused && q.is_cuda() && (q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf) &&
         k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type() && h % 8 == 0 && h <= 256 &&
         q.size(1) % k.size(1) == 0;
}

at::Tensor varlen_flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, AttentionMask& mask,
                                  double dropout_p) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), h = q.size(3), KV = k.size(1);
  const at::Tensor& cu = mask.cu_seqlens();
  // [B, heads, T, h] -> [B T, heads, h], the packed layout of the variable-length kernel (made
  // contiguous: v is a view of the qkv product, whose rows are (H + 2 KV) h apart)
  const at::Tensor qp = q.transpose(1, 2).reshape({B * T, H, h}).contiguous();
  const at::Tensor kp = k.transpose(1, 2).reshape({B * T, KV, h}).contiguous();
  const at::Tensor vp = v.transpose(1, 2).reshape({B * T, KV, h}).contiguous();
  std::optional<int64_t> left, right;
  if (mask.window > 0) {  // keys i - W + 1 .. i
    left = mask.window - 1;
    right = 0;
  }
  const auto out = at::_flash_attention_forward(qp, kp, vp, cu, cu, T, T, dropout_p, /*is_causal=*/true,
                                                /*return_debug_mask=*/false, std::nullopt, left, right);
  return std::get<0>(out).view({B, T, H, h}).transpose(1, 2);
}

at::Tensor residual_dropout(const at::Tensor& x, double p, const LayerOps& ops) {
  if (!ops.seq_rows) return at::dropout(x, p, /*train=*/true);
  // The mask the unsplit run draws for the whole [B, T, d] (same shape, same generator state:
  // the same draws), kept at this rank's rows; it is x's dtype, as at::dropout's own noise is.
  const int64_t T = x.size(1) * ops.seq_split;
  const at::Tensor whole = at::dropout(at::ones({x.size(0), T, x.size(2)}, x.options()), p, /*train=*/true);
  return x * whole.index_select(1, ops.seq_rows(T, x.device()));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> AttentionImpl::heads(const at::Tensor& x, const at::Tensor& positions,
                                                                    const LayerOps* ops_in) {
  const LayerOps& ops = ops_in ? *ops_in : *ops_;
  const int64_t q_width = n_head_ * head_dim_, kv_width = n_kv_head_ * head_dim_;
  auto qkv = ops.qkv      ? ops.qkv(x, *c_attn)
             : ops.column ? ops.column(x, *c_attn)
                          : c_attn->forward(x);  // [B, T, (H + 2 KV) h] (sequence parallelism: every row)
  const int64_t B = qkv.size(0), T = qkv.size(1);
  auto parts = qkv.split_with_sizes({q_width, kv_width, kv_width}, -1);
  // [B, T, heads, h] -> [B, heads, T, h], the layout SDPA expects.
  auto q = parts[0].view({B, T, n_head_, head_dim_});
  auto k = parts[1].view({B, T, n_kv_head_, head_dim_});
  if (q_norm) {  // Qwen3: each head normed over its width, before the rotary turn, kept in the product's
                 // dtype (fp32 weights would promote a 16-bit q; the attention casts it back anyway)
    q = q_norm->forward(q).to(q.scalar_type());
    k = k_norm->forward(k).to(k.scalar_type());
  }
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  auto v = parts[2].view({B, T, n_kv_head_, head_dim_}).transpose(1, 2);
  if (rope_) std::tie(q, k) = rope_->apply(q, k, positions);
  return {q, k, v};
}

at::Tensor AttentionImpl::project(const at::Tensor& y_heads, const LayerOps* ops_in) {
  const LayerOps& ops = ops_in ? *ops_in : *ops_;
  const int64_t B = y_heads.size(0), T = y_heads.size(2);
  const auto y = y_heads.transpose(1, 2).reshape({B, T, n_head_ * head_dim_});
  return ops.row ? ops.row(y, *c_proj) : c_proj->forward(y);
}

at::Tensor AttentionImpl::forward(const at::Tensor& x) {
  // Rotary angles at the positions the heads hold: under context parallelism the rank's two
  // chunks of the sequence (with --sp, gathered over tp by c_attn first); otherwise every row
  // (sequence parallelism alone gathers them all for c_attn).
  // --document-positions restart: each row's positions within its documents ([B, T_attention]).
  const int64_t T = x.size(1) * ops_->seq_split;
  const at::Tensor rows = ops_->attention_rows ? ops_->attention_rows(T, x.device()) : at::Tensor();
  at::Tensor positions = rows;
  if (rope_ && mask && mask->positions.defined())
    positions = rows.defined() ? mask->positions.index_select(1, rows) : mask->positions;
  auto [q, k, v] = heads(x, rope_ ? positions : at::Tensor());
  const double p = is_training() ? dropout_ : 0.0;
  at::Tensor bias;
  if (ops_->gather_kv) {
    std::tie(k, v, bias) = ops_->gather_kv(k, v);  // context parallelism: the whole sequence's
    // documents / the window: the rank's queries against the gathered keys (the causal rule
    // included: it replaces gather_kv's mask)
    if (mask) bias = mask->bias_in(q.scalar_type(), rows, ops_->gathered_key_rows(T, x.device()));
  } else if (mask && !core && varlen_flash_eligible(q, k, v, kernels)) {
    // every row's heads are here: flash's variable-length kernel cuts them at the documents
    auto attend = [&] { return varlen_flash_attention(q, k, v, *mask, p); };
    return project(p > 0.0 && ops_->in_tp_region ? ops_->in_tp_region(x.device(), attend) : attend());
  } else if (mask) {
    // every row's heads are here (tp splits the heads; sp's c_attn gathered the rows)
    bias = mask->bias_in(q.scalar_type());
  }
  auto attend = [&] { return core ? core(q, k, v, p, bias) : causal_attention(q, k, v, p, bias); };  // [B, H, T, h]
  auto y = p > 0.0 && ops_->in_tp_region ? ops_->in_tp_region(x.device(), attend) : attend();
  return project(y);
}

MLPImpl::MLPImpl(const GPTConfig& cfg, const at::TensorOptions& opts, const ModelShard& shard)
    : ops_(shard.ops), swiglu_(cfg.swiglu()) {
  const int64_t f = cfg.mlp_hidden() / shard.tp;  // this rank's columns of the hidden layer
  c_fc = register_module("c_fc", std::make_shared<LinearImpl>(cfg.d_model, swiglu_ ? 2 * f : f, opts, cfg.linear_bias()));
  c_proj = register_module("c_proj", std::make_shared<LinearImpl>(f, cfg.d_model, opts, cfg.linear_bias()));
}

at::Tensor MLPImpl::forward_with(const at::Tensor& x, const LayerOps& ops) const {
  const auto h = ops.column ? ops.column(x, *c_fc) : c_fc->forward(x);  // [B, T, 4d / tp] ([B, T, 2F / tp] SwiGLU)
  at::Tensor g;
  if (swiglu_) {
    g = kiln::swiglu(h, kernels);
  } else {
    g = at::gelu(h, "tanh");
  }
  return ops.row ? ops.row(g, *c_proj) : c_proj->forward(g);
}

at::Tensor MLPImpl::forward(const at::Tensor& x) {
  // A float8 feed-forward runs its layers' own products: neither the fused GELU epilogue nor the
  // recomputation hook (which multiplies by c_proj's weight itself) applies to it.
  const bool float8 = c_fc->float8.on || c_proj->float8.on;
  if (!swiglu_ && gelu_epilogue && kernels == Kernels::fused && !float8 && !gelu_proj && !ops_->column && !ops_->row &&
      c_fc->bias.defined() && c_proj->bias.defined()) {
    return gelu_mlp(x.reshape({-1, x.size(-1)}), c_fc->weight, c_fc->bias, c_proj->weight, c_proj->bias, kernels)
        .view(x.sizes());
  }
  if (swiglu_ || !gelu_proj || float8) return forward_with(x, *ops_);
  auto h = ops_->column ? ops_->column(x, *c_fc) : c_fc->forward(x);  // [B, T, 4d / tp]
  if (ops_->row && !c_proj->bias.defined()) return ops_->reduce(gelu_proj(h, c_proj->weight, at::Tensor()));
  if (ops_->row) {  // the partial products summed over tp, the bias added once after
    return ops_->reduce(gelu_proj(h, c_proj->weight, at::zeros_like(c_proj->bias, at::MemoryFormat::Contiguous).detach())) +
           c_proj->bias;
  }
  return gelu_proj(h, c_proj->weight, c_proj->bias);
}

BlockImpl::BlockImpl(const GPTConfig& cfg, const at::TensorOptions& opts, const ModelShard& shard, int64_t index,
                     std::shared_ptr<RotaryEmbedding> rope)
    : dropout_(cfg.dropout), ops_(shard.ops) {
  ln_1 = register_module("ln_1", std::make_shared<LayerNormImpl>(cfg.d_model, cfg.layer_norm_eps, opts, cfg.rmsnorm()));
  attn = register_module("attn", std::make_shared<AttentionImpl>(cfg, opts, shard, std::move(rope)));
  ln_2 = register_module("ln_2", std::make_shared<LayerNormImpl>(cfg.d_model, cfg.layer_norm_eps, opts, cfg.rmsnorm()));
  if (cfg.is_moe_layer(index)) {
    moe = register_module("moe", std::make_shared<MoEImpl>(cfg.d_model, cfg.mlp_hidden(), MoEConfig::of(cfg), opts, shard.ops));
  } else {
    mlp = register_module("mlp", std::make_shared<MLPImpl>(cfg, opts, shard));
  }
}

at::Tensor BlockImpl::forward(const at::Tensor& x) {
  auto [y, m] = forward_deferred(x, at::Tensor());
  return y + m;
}

std::pair<at::Tensor, at::Tensor> BlockImpl::forward_deferred(const at::Tensor& x_in, const at::Tensor& pending) {
  const bool drop = is_training() && dropout_ > 0.0;
  at::Tensor x, n1;
  if (pending.defined()) {
    std::tie(x, n1) = ln_1->forward_add(x_in, pending);  // x = x_in + pending, n1 = ln_1(x)
  } else {
    x = x_in;
    n1 = ln_1->forward(x_in);
  }
  auto a = attn->forward(n1);
  auto [y, h] = ln_2->forward_add(x, drop ? residual_dropout(a, dropout_, *ops_) : a);  // y = x + a, h = ln_2(y)
  auto m = moe ? moe->forward(h) : mlp->forward(h);
  // The MoE layer answers in its input's dtype: on CUDA, autocast's layer_norm makes that fp32,
  // and y + m promoted the 16-bit residual stream to fp32 for every later block (with pp the
  // stages' exchange then refused it). The residual keeps its dtype, as the dense MLP's does.
  if (moe) m = m.to(y.scalar_type());
  return {std::move(y), drop ? residual_dropout(m, dropout_, *ops_) : std::move(m)};
}

GPT::GPT(const GPTConfig& cfg, const at::TensorOptions& opts, ModelShard shard) : cfg_(cfg), shard_(std::move(shard)) {
  cfg_.validate();
  if (!shard_.ops) shard_.ops = std::make_shared<LayerOps>();
  const auto o = opts.dtype(at::kFloat);
  int64_t previous_end = 0;
  for (BlockRange& c : shard_.chunks) {
    if (c.end < 0) c.end = cfg_.n_layer;
    if (c.begin < previous_end || c.begin > c.end || c.end > cfg_.n_layer) {
      throw ConfigError("GPT: blocks [" + std::to_string(c.begin) + ", " + std::to_string(c.end) +
                        ") are not a range of the model's " + std::to_string(cfg_.n_layer) + " after the chunk before");
    }
    previous_end = c.end;
  }
  if (shard_.chunks.empty() ||
      (shard_.whole_model() && (shard_.chunks.size() != 1 || shard_.chunks[0].begin != 0 || shard_.chunks[0].end != cfg_.n_layer))) {
    throw ConfigError("GPT: the whole model is one chunk of all " + std::to_string(cfg_.n_layer) + " blocks");
  }
  // Under tensor parallelism wte holds this rank's rows of the padded vocabulary; registered
  // first, as in the whole model, so the parameter order is the whole model's order restricted.
  // Under rope the output layer, when untied, is lm_head: wte only where the embedding is.
  if (shard_.embedding || (shard_.head && cfg_.tie_embeddings))
    wte = register_parameter("wte", at::empty({cfg_.padded_vocab_size() / shard_.tp, cfg_.d_model}, o));
  if (shard_.embedding && !cfg_.rope()) wpe = register_parameter("wpe", at::empty({cfg_.seq_len, cfg_.d_model}, o));
  if (cfg_.rope()) rope_ = std::make_shared<RotaryEmbedding>(cfg_);
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg_.n_layer; ++i) {
    if (chunk_of_block(i) >= 0) h->push_back(std::make_shared<BlockImpl>(cfg_, o, shard_, i, rope_));
    else h->push_back(std::make_shared<torch::nn::Module>());  // another stage's block: keeps the numbering
  }
  if (shard_.head) {
    ln_f = register_module("ln_f", std::make_shared<LayerNormImpl>(cfg_.d_model, cfg_.layer_norm_eps, o, cfg_.rmsnorm()));
    if (!cfg_.tie_embeddings)
      lm_head = register_parameter("lm_head", at::empty({cfg_.padded_vocab_size() / shard_.tp, cfg_.d_model}, o));
  }
}

std::vector<std::shared_ptr<BlockImpl>> GPT::blocks() const {
  std::vector<std::shared_ptr<BlockImpl>> out;
  for (const BlockRange& c : shard_.chunks)
    for (int64_t i = c.begin; i < c.end; ++i) out.push_back(std::dynamic_pointer_cast<BlockImpl>(h->ptr(static_cast<size_t>(i))));
  return out;
}

int GPT::chunk_of_block(int64_t i) const {
  for (size_t c = 0; c < shard_.chunks.size(); ++c)
    if (i >= shard_.chunks[c].begin && i < shard_.chunks[c].end) return static_cast<int>(c);
  return -1;
}

void GPT::init_weights(uint64_t seed, const TensorSlicer& slice) {
  auto mine = named_parameters(/*recurse=*/true);
  if (mine.is_empty() || mine[0].value().device().is_meta()) return;
  if (shard_.tp > 1 && !slice) {
    throw Error("GPT::init_weights: a tensor-parallel shard needs the slicer of its layout (parallel/tensor_parallel.h: "
                "tp_slicer), so every layout starts from the same weights");
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const double std_resid = 0.02 / std::sqrt(2.0 * static_cast<double>(cfg_.n_layer));
  at::NoGradGuard no_grad;
  // Every parameter of the whole model in registration order, drawn whole on the CPU (one at a
  // time), so the draws are the same on every run, device and layout; this model keeps its part.
  const GPT whole(cfg_, at::TensorOptions().device(at::kMeta));
  for (const auto& item : whole.named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    at::Tensor cpu = at::empty(item.value().sizes(), at::TensorOptions().dtype(at::kFloat));
    auto ends_with = [&](const std::string& s) {
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    const bool is_norm = name.find("ln_") != std::string::npos || ends_with("q_norm.weight") || ends_with("k_norm.weight");
    if (name == "wpe") {
      cpu.normal_(0.0, 0.01, gen);
    } else if (is_norm) {
      cpu.fill_(ends_with("weight") ? 1.0 : 0.0);
    } else if (ends_with("bias") || ends_with("moe.fc_b") || ends_with("moe.proj_b")) {
      cpu.zero_();
    } else if (ends_with("c_proj.weight") || ends_with("moe.proj_w")) {  // MoE: each expert's c_proj
      cpu.normal_(0.0, std_resid, gen);
    } else {
      cpu.normal_(0.0, 0.02, gen);
    }
    if (name == "wte" || name == "lm_head") {
      // Padding rows of the vocabulary never meet a token or a target: kept at zero, their
      // gradient and AdamW state stay zero too, so exporting only the real rows loses nothing.
      const int64_t V = cfg_.vocab_size, pad = cfg_.padded_vocab_size() - V;
      if (pad > 0) cpu.narrow(0, V, pad).zero_();
    }
    if (const at::Tensor* p = mine.find(name)) at::Tensor(*p).copy_(slice ? slice(name, cpu) : cpu);
  }
}

namespace {
void check_context(int64_t T, const GPTConfig& cfg) {
  if (T > cfg.seq_len) {
    throw ConfigError("sequence of " + std::to_string(T) + " tokens is longer than the model's context (" +
                      std::to_string(cfg.seq_len) + ")");
  }
}
}  // namespace

at::Tensor GPT::embed(const at::Tensor& idx) {
  if (!shard_.embedding) throw Error("GPT::embed: this pipeline stage does not hold the embedding");
  const int64_t T = idx.size(1);
  check_context(T, cfg_);
  const LayerOps& ops = *shard_.ops;
  at::Tensor x = ops.embed ? ops.embed(idx, wte) : at::embedding(wte, idx);  // [B, T_local, d]
  if (wpe.defined())
    x = x + (ops.seq_rows ? wpe.index_select(0, ops.seq_rows(x.size(1) * ops.seq_split, x.device())) : wpe.narrow(0, 0, T));
  if (is_training() && cfg_.dropout > 0.0) x = residual_dropout(x, cfg_.dropout, ops);
  return x;
}

at::Tensor GPT::run_blocks(const at::Tensor& x_in, int chunk) {
  auto [y, m] = run_blocks_deferred(x_in, chunk);
  return m.defined() ? y + m : y;
}

std::pair<at::Tensor, at::Tensor> GPT::run_blocks_deferred(const at::Tensor& x_in, int chunk) {
  if (chunk < 0 || chunk >= static_cast<int>(shard_.chunks.size()))
    throw Error("GPT::run_blocks: chunk " + std::to_string(chunk) + " of " + std::to_string(shard_.chunks.size()));
  at::Tensor x = x_in, pending;
  const BlockRange& c = shard_.chunks[static_cast<size_t>(chunk)];
  for (int64_t i = c.begin; i < c.end; ++i) {
    auto& block = *h[static_cast<size_t>(i)]->as<BlockImpl>();
    if (block_runner) {  // recomputation's hook runs whole blocks
      x = block_runner(block, pending.defined() ? x + pending : x);
      pending = at::Tensor();
    } else {
      std::tie(x, pending) = block.forward_deferred(x, pending);
    }
  }
  return {x, pending};
}

void GPT::set_documents(const at::Tensor& idx) {
  std::shared_ptr<AttentionMask> m;
  const bool windowed = cfg_.sliding_window > 0 && cfg_.sliding_window < idx.size(1);
  if (document_token >= 0 || windowed) {
    m = std::make_shared<AttentionMask>();
    m->order = at::arange(idx.size(1), idx.options().dtype(at::kLong));
    m->batch = idx.size(0);
    if (windowed) m->window = cfg_.sliding_window;
    if (document_token >= 0) m->ids = document_ids_of(idx, document_token);
    if (document_token >= 0 && restart_positions) m->positions = document_positions_of(idx, document_token);
  }
  for (const auto& b : blocks()) b->attn->mask = m;
}

at::Tensor GPT::hidden(const at::Tensor& idx) {
  if (!shard_.whole_model()) throw Error("GPT::hidden: a pipeline stage runs embed / run_blocks / head_loss");
  set_documents(idx);
  auto [y, m] = run_blocks_deferred(embed(idx));
  return m.defined() ? ln_f->forward_add(y, m).second : ln_f->forward(y);
}

at::Tensor GPT::logits(const at::Tensor& idx) { return linear_product(hidden(idx), output_weight()); }

at::Tensor GPT::loss(const at::Tensor& idx, const at::Tensor& targets) {
  if (!shard_.whole_model()) throw Error("GPT::loss: a pipeline stage runs embed / run_blocks / head_loss");
  set_documents(idx);  // the whole sequence's (before context parallelism keeps the rank's positions)
  if (shard_.ops->local_tokens) {  // context parallelism: this rank's positions; the loss is their mean
    check_context(idx.size(1), cfg_);  // the whole sequence's length; embed sees the rank's
    auto [y, m] = run_blocks_deferred(embed(shard_.ops->local_tokens(idx)));
    return head_loss(y, shard_.ops->local_tokens(targets), m);
  }
  auto [y, m] = run_blocks_deferred(embed(idx));
  return head_loss(y, targets, m);
}

at::Tensor GPT::head_loss(const at::Tensor& x_in, const at::Tensor& targets, const at::Tensor& pending) {
  if (!shard_.head) throw Error("GPT::head_loss: this pipeline stage does not hold the output layer");
  auto x = pending.defined() ? ln_f->forward_add(x_in, pending).second : ln_f->forward(x_in);
  const at::Tensor& w = output_weight();
  at::Tensor rows, t = targets.reshape({-1});
  double weight = 1.0;
  if (loss_targets_per_term > 0) {  // masked targets (see gpt.h)
    rows = t.ge(0).nonzero().reshape({-1});
    weight = static_cast<double>(rows.size(0)) / loss_targets_per_term;
    if (rows.size(0) == 0) rows = at::zeros({1}, t.options());
    t = t.index_select(0, rows).clamp_min(0);  // the one row of a rank with none: any valid target, weighted 0
  }
  auto weighted = [&](const at::Tensor& loss) { return rows.defined() ? loss * weight : loss; };
  if (shard_.ops->loss) return weighted(shard_.ops->loss(x, w, rows.defined() ? t : targets, kernels_, rows));
  auto x2 = x.reshape({-1, x.size(-1)});
  if (rows.defined()) x2 = x2.index_select(0, rows);
  if (loss_chunk_rows < 0) return weighted(plain_linear_cross_entropy(x2, w, t, cfg_.vocab_size));
  return weighted(linear_cross_entropy(x2, w, t, cfg_.vocab_size, loss_chunk_rows, kernels_, logits16));
}

void GPT::set_kernels(Kernels k, bool gelu_epilogue) {
  kernels_ = k;
  if (rope_) rope_->kernels = k;
  for (const auto& m : modules(/*include_self=*/false)) {
    if (auto* n = dynamic_cast<LayerNormImpl*>(m.get())) {
      n->kernels = k;
    } else if (auto* p = dynamic_cast<MLPImpl*>(m.get())) {
      p->kernels = k;
      p->gelu_epilogue = gelu_epilogue && k == Kernels::fused;
    } else if (auto* a = dynamic_cast<AttentionImpl*>(m.get())) {
      a->kernels = k;
    }
    else if (auto* e = dynamic_cast<MoEImpl*>(m.get())) e->kernels = k;
  }
}

std::pair<int64_t, int64_t> GPT::set_float8(const Float8Scaling& scaling, bool auto_filter) {
  const int64_t d = cfg_.d_model, t = shard_.tp;
  int64_t on = 0, all = 0;
  // The whole layer's [N, K]; c_attn and c_fc are split by rows over tp, the c_projs by columns.
  auto take = [&](LinearImpl& l, int64_t n, int64_t k) {
    ++all;
    const bool eligible = float8_layer_eligible(n, k, auto_filter) && l.weight.size(0) % 16 == 0 && l.weight.size(1) % 16 == 0;
    l.float8 = eligible ? scaling : Float8Scaling{};
    on += eligible ? 1 : 0;
  };
  for (const auto& b : blocks()) {
    take(*b->attn->c_attn, (cfg_.n_head + 2 * cfg_.n_kv_head) * cfg_.head_dim(), d);
    take(*b->attn->c_proj, d, cfg_.attn_width());
    if (b->mlp) {
      take(*b->mlp->c_fc, b->mlp->c_fc->weight.size(0) * t, d);
      take(*b->mlp->c_proj, d, b->mlp->c_proj->weight.size(1) * t);
    }
    if (b->moe) {
      // The experts [F, d] and [d, F'] (SwiGLU: F = 2 F'), whole on whichever rank holds them.
      MoEImpl& m = *b->moe;
      const int64_t experts = 2 * m.config().n_experts;
      const bool eligible = scaling.rowwise && float8_layer_eligible(m.fc_w.size(1), d, auto_filter) &&
                            float8_layer_eligible(d, m.proj_w.size(2), auto_filter);
      m.float8 = eligible ? scaling : Float8Scaling{};
      m.float8.m = m.float8.k = m.float8.n = nullptr;  // no tp or cp split of an expert's products
      all += experts;
      on += eligible ? experts : 0;
    }
  }
  return {on, all};
}

std::vector<LinearImpl*> GPT::float8_linears(bool with_qkv) {
  std::vector<LinearImpl*> out;
  for (const auto& b : blocks()) {
    std::vector<LinearImpl*> layers{with_qkv ? b->attn->c_attn.get() : nullptr, b->attn->c_proj.get()};
    if (b->mlp) layers.insert(layers.end(), {b->mlp->c_fc.get(), b->mlp->c_proj.get()});
    for (LinearImpl* l : layers)
      if (l != nullptr && l->float8.on) out.push_back(l);
  }
  return out;
}

int64_t GPT::keep_float8_weights() {
  int64_t n = 0;
  for (LinearImpl* l : float8_linears()) {
    l->float8.cache = std::make_shared<Float8WeightCache>();
    l->float8.cache->clock = float8_clock_;
    n += l->weight.numel();
  }
  return n;
}

int64_t GPT::num_params() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

std::vector<std::pair<int64_t, std::shared_ptr<MoEImpl>>> GPT::moe_layers() const {
  std::vector<std::pair<int64_t, std::shared_ptr<MoEImpl>>> out;
  for (const BlockRange& c : shard_.chunks)
    for (int64_t i = c.begin; i < c.end; ++i) {
      auto block = std::dynamic_pointer_cast<BlockImpl>(h->ptr(static_cast<size_t>(i)));
      if (block && block->moe) out.emplace_back(i, block->moe);
    }
  return out;
}

void GPT::set_moe_loss_backward_scale(double scale) {
  for (auto& [i, moe] : moe_layers()) moe->loss_backward_scale = scale;
}

at::Tensor GPT::take_moe_stats(c10::Device device) {
  if (!cfg_.is_moe()) return {};
  const int64_t width = moe_stats_width(cfg_.n_experts);
  at::Tensor out = at::zeros({cfg_.n_moe_layers(), width}, at::TensorOptions().dtype(at::kFloat).device(device));
  for (auto& [i, moe] : moe_layers()) {
    if (moe->step_stats.defined()) out[i / cfg_.moe_every].copy_(moe->step_stats);
    moe->step_stats = at::Tensor();
  }
  return out.view({-1});
}

}  // namespace kiln
