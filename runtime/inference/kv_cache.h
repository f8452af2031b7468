// runtime/inference/kv_cache.h -- incremental decoding: a key/value cache and the forward that fills it.
//
// Generation asks, token after token, for the logits of the next token given every token so far.
// The plain forward (GPT::hidden) recomputes all T positions each time: O(T) per new token in
// the projections and MLPs, O(T^2) in attention. In causal attention a position's key and value
// never change once computed (position t sees only positions <= t), so the cache keeps them,
// per layer, and each step runs only the new positions (Pope et al., 2022, "Efficiently Scaling
// Transformer Inference", section 2). For the n new tokens at positions [P, P + n), P the
// positions cached so far (B batch, H / KV this rank's query / kv heads, h head width):
//
//   x = wte[idx] + wpe[P .. P + n)                                  [B, n, d]
//   per block:
//     q, k, v = split(c_attn(ln_1(x)))                              q [B, H, n, h], k v [B, KV, n, h]
//     K[:, :, P .. P+n) = k;  V[:, :, P .. P+n) = v                 the cache, [B, KV, capacity, h]
//     a = softmax(q K[.., :P+n]^T / sqrt(h) + M) V[.., :P+n]         M[i, j] = 0 if j <= P + i, else -inf
//     x = x + c_proj(a);  x = x + mlp.c_proj(gelu_tanh(mlp.c_fc(ln_2(x))))
//   out = ln_f(x)                                                   [B, n, d]
//
// P = 0 is the training forward's arithmetic (scaled_dot_product_attention with is_causal); n = 1
// needs no mask (the newest position sees all of them); otherwise M is an explicit boolean mask
// (SDPA's is_causal aligns the triangle to the top-left, which is wrong once P > 0). Positions are
// learned (wpe), so P + n <= seq_len: a generator that outgrows the context starts the cache anew
// on a shorter window (runtime/inference/generate.h). A sliding window W shorter than the context
// (Mistral's, GPTConfig::sliding_window): a query at P + i sees the keys at j > P + i - W, and the
// cache keeps only the last W positions of each layer (memory W, not the context): write() returns
// the kept ones and the new, from key_start(), and keeps their last W. Under tensor parallelism the cache holds this rank's
// heads and the model's LayerOps communicate, as in training. Inference only: no dropout, call it
// under at::NoGradGuard; the training hooks (block_runner, AttentionImpl::core, gelu_proj) are not
// used. Memory: 2 x n_layer x B x KV x capacity (or W) x h elements of the model's dtype.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "models/gpt.h"

namespace kiln {

class KVCache {
 public:
  // A cache for `batch` sequences of at most `capacity` positions (at most the model's seq_len)
  // of `model` (a whole model, or a tensor-parallel shard; not a pipeline stage). Its buffers are
  // allocated at the first forward, with the dtype and device of the keys.
  KVCache(const GPT& model, int64_t batch, int64_t capacity);

  int64_t length() const { return length_; }  // positions cached (P)
  int64_t capacity() const { return capacity_; }
  int64_t batch() const { return batch_; }
  // Forgets every position (the buffers are kept).
  void clear() { length_ = 0; }

  // For forward_cached: writes layer `layer`'s keys and values of the n new positions
  // (k, v [B, KV, n, h]) at [length, length + n) and returns the layer's keys and values of
  // positions [0, length + n). advance(n) moves length on once every layer has written.
  // Under a sliding window: the kept positions and the new ones, from position key_start().
  std::pair<at::Tensor, at::Tensor> write(size_t layer, const at::Tensor& k, const at::Tensor& v);
  void advance(int64_t n);
  int64_t window() const { return window_; }  // 0: the whole context is kept
  // The position of the first key write() returns: 0, or under a window the oldest kept.
  int64_t key_start() const { return window_ > 0 ? length_ - std::min(length_, window_) : 0; }

 private:
  std::vector<at::Tensor> k_, v_;  // per layer [B, KV, capacity, h]; under a window [B, KV, <= W, h]
  int64_t batch_, capacity_, length_ = 0;
  int64_t window_ = 0;
};

// The residual stream after ln_f of the new positions: idx [B, n] int64, the tokens at positions
// [cache.length(), cache.length() + n) -> [B, n, d]; their keys and values join the cache.
// Throws ConfigError when the positions would pass the cache's capacity or the model's context,
// and Error for a pipeline stage or a batch other than the cache's.
at::Tensor forward_cached(GPT& model, const at::Tensor& idx, KVCache& cache);

}  // namespace kiln
