// runtime/inference/kv_cache.cpp -- the key/value cache and the cached forward (shapes in the header).
#include "runtime/inference/kv_cache.h"

#include <string>

#include <ATen/ATen.h>

#include "distributed/error.h"

namespace kiln {

KVCache::KVCache(const GPT& model, int64_t batch, int64_t capacity)
    : k_(static_cast<size_t>(model.config().n_layer)), v_(k_.size()), batch_(batch), capacity_(capacity),
      window_(model.config().sliding_window > 0 && model.config().sliding_window < capacity ? model.config().sliding_window : 0) {
  if (!model.shard().whole_model()) throw Error("KVCache: a pipeline stage cannot decode on its own (pp 1 only)");
  if (batch < 1 || capacity < 1 || capacity > model.config().seq_len) {
    throw Error("KVCache: batch " + std::to_string(batch) + " and capacity " + std::to_string(capacity) +
                " must be positive, the capacity at most the model's context (" + std::to_string(model.config().seq_len) + ")");
  }
}

std::pair<at::Tensor, at::Tensor> KVCache::write(size_t layer, const at::Tensor& k, const at::Tensor& v) {
  const int64_t n = k.size(2);
  at::Tensor& K = k_.at(layer);
  at::Tensor& V = v_.at(layer);
  if (window_ > 0) {  // the kept positions (the last W at most) and the new ones; then keep their last W
    const bool kept = K.defined() && length_ > 0;
    const at::Tensor all_k = kept ? at::cat({K, k}, 2) : k, all_v = kept ? at::cat({V, v}, 2) : v;
    const int64_t keep = std::min(window_, all_k.size(2));
    K = all_k.narrow(2, all_k.size(2) - keep, keep).clone();
    V = all_v.narrow(2, all_v.size(2) - keep, keep).clone();
    return {all_k, all_v};
  }
  if (!K.defined()) {
    K = at::empty({batch_, k.size(1), capacity_, k.size(3)}, k.options());
    V = at::empty({batch_, v.size(1), capacity_, v.size(3)}, v.options());
  }
  K.narrow(2, length_, n).copy_(k);
  V.narrow(2, length_, n).copy_(v);
  return {K.narrow(2, 0, length_ + n), V.narrow(2, 0, length_ + n)};
}

void KVCache::advance(int64_t n) { length_ += n; }

namespace {

// One block on the new positions (the header's per-block lines); x [B, n, d].
at::Tensor cached_block(BlockImpl& block, const LayerOps& ops, const at::Tensor& x, size_t layer, KVCache& cache) {
  const int64_t n = x.size(1), P = cache.length();
  AttentionImpl& attn = *block.attn;
  const auto a_in = block.ln_1->forward(x);
  // q [B, H, n, h], k and v [B, KV, n, h]: under rope turned to positions P .. P + n - 1. The
  // attention's layer ops are the model's; ops (the unsplit ones) match them for decoding.
  const auto positions = at::arange(P, P + n, at::TensorOptions().dtype(at::kLong).device(x.device()));
  const auto [q, k, v] = attn.heads(a_in, positions, &ops);
  const int64_t S = cache.key_start();           // the first returned key's position (0 without a window)
  const auto [K, V] = cache.write(layer, k, v);  // [B, KV, P + n - S, h]
  std::optional<at::Tensor> mask;
  const int64_t W = cache.window();
  if ((P > 0 && n > 1) || (W > 0 && P + n > W)) {  // M[i, j]: key j (position S + j) is visible to query i (position P + i)
    const auto opts = at::TensorOptions().dtype(at::kLong).device(x.device());
    const at::Tensor key = at::arange(S, P + n, opts).unsqueeze(0), query = (at::arange(n, opts) + P).unsqueeze(1);
    at::Tensor m = key <= query;                     // [n, P + n - S]
    if (W > 0) m = m.logical_and(key > query - W);  // the window
    mask = m;
  }
  const bool causal = !mask && P == 0 && n > 1;
  const auto y = grouped_attention(q, K, V, mask, /*dropout_p=*/0.0, /*is_causal=*/causal);  // [B, H, n, h]
  const auto x1 = x + attn.project(y, &ops);
  const auto m_in = block.ln_2->forward(x1);
  // An MoE block routes the call's tokens of each sequence as one group (models/moe.h): with
  // capacity dropping, what a long prompt drops can differ from the whole-sequence forward's.
  if (block.moe) return x1 + block.moe->forward(m_in);
  return x1 + block.mlp->forward_with(m_in, ops);  // the GELU or SwiGLU feed-forward
}

}  // namespace

at::Tensor forward_cached(GPT& model, const at::Tensor& idx, KVCache& cache) {
  if (!model.shard().whole_model()) throw Error("forward_cached: a pipeline stage cannot decode on its own");
  const int64_t n = idx.size(1), P = cache.length();
  if (idx.size(0) != cache.batch()) {
    throw Error("forward_cached: a batch of " + std::to_string(idx.size(0)) + " with a cache of " + std::to_string(cache.batch()));
  }
  if (P + n > cache.capacity()) {
    throw ConfigError("positions [" + std::to_string(P) + ", " + std::to_string(P + n) + ") pass the cache's " +
                      std::to_string(cache.capacity()) + " (the model's context is " + std::to_string(model.config().seq_len) + ")");
  }
  const LayerOps& ops = model.shard().ops->unsplit ? *model.shard().ops->unsplit : *model.shard().ops;
  at::Tensor x = ops.embed ? ops.embed(idx, model.wte) : at::embedding(model.wte, idx);
  if (model.wpe.defined()) x = x + model.wpe.narrow(0, P, n);  // learned positions (rope: in the attention)
  size_t layer = 0;
  for (const auto& block : model.blocks()) x = cached_block(*block, ops, x, layer++, cache);
  cache.advance(n);
  return model.ln_f->forward(x);
}

}  // namespace kiln
