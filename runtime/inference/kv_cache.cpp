// runtime/inference/kv_cache.cpp -- the key/value cache and the cached forward (shapes in the header).
#include "runtime/inference/kv_cache.h"

#include <string>

#include <ATen/ATen.h>

#include "distributed/error.h"

namespace kiln {

KVCache::KVCache(const GPT& model, int64_t batch, int64_t capacity)
    : k_(static_cast<size_t>(model.config().n_layer)), v_(k_.size()), batch_(batch), capacity_(capacity) {
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
  const auto [K, V] = cache.write(layer, k, v);  // [B, KV, P + n, h]
  std::optional<at::Tensor> mask;
  if (P > 0 && n > 1) {  // M[i, j]: key j is visible to query i (position P + i)
    const auto opts = at::TensorOptions().dtype(at::kLong).device(x.device());
    mask = at::arange(P + n, opts).unsqueeze(0) <= (at::arange(n, opts) + P).unsqueeze(1);  // [n, P + n]
  }
  const auto y = grouped_attention(q, K, V, mask, /*dropout_p=*/0.0, /*is_causal=*/P == 0 && n > 1);  // [B, H, n, h]
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
