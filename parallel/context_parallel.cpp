// parallel/context_parallel.cpp -- the rank's positions, the K/V all-gather and the mask.
#include "parallel/context_parallel.h"

#include <ATen/ATen.h>

#include <limits>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "distributed/error.h"
#include "models/gpt.h"
#include "parallel/sequence_parallel.h"
#include "parallel/tensor_parallel.h"

namespace kiln {

void check_context_parallel(const GPTConfig& cfg, int64_t cp) {
  if (cp < 1) throw ConfigError("--cp must be at least 1 (got " + std::to_string(cp) + ")");
  if (cfg.seq_len % (2 * cp) != 0) {
    throw ConfigError("--cp " + std::to_string(cp) + " needs the sequence length (" + std::to_string(cfg.seq_len) +
                      ") to divide into 2 x cp = " + std::to_string(2 * cp) + " chunks (each rank holds two)");
  }
}

at::Tensor context_positions(int64_t T, int64_t n, int64_t r, c10::Device device) {
  const int64_t C = T / (2 * n);
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  return at::cat({at::arange(r * C, (r + 1) * C, opts), at::arange((2 * n - 1 - r) * C, (2 * n - r) * C, opts)});
}

ModelShard make_context_parallel(ModelShard shard, const GPTConfig& cfg, const std::shared_ptr<Communicator>& cp) {
  check_context_parallel(cfg, cp->size());
  const std::shared_ptr<const LayerOps> before = shard.ops ? shard.ops : std::make_shared<LayerOps>();
  auto ops = std::make_shared<LayerOps>(*before);
  const int64_t n = cp->size(), r = cp->rank(), tp_rank = shard.rank;
  // --sp inside (Megatron's layout: cp outside, tp / sp inside): the tp ranks split the rank's
  // 2C positions further, tp rank j holding the j-th of t blocks of them; the column layers'
  // gathers over tp rebuild the cp chunk, which the attention then runs on.
  const int64_t t = before->seq_rows ? before->seq_split : 1;
  if (t > 1 && cfg.seq_len % (2 * n * t) != 0) {
    throw ConfigError("--cp " + std::to_string(n) + " with --sp needs the sequence length (" + std::to_string(cfg.seq_len) +
                      ") to divide into 2 x cp x tp = " + std::to_string(2 * n * t) + " blocks");
  }
  ops->seq_split = n * t;
  ops->seq_rows = [n, r, t, tp_rank](int64_t T, c10::Device device) {
    const at::Tensor chunk = context_positions(T, n, r, device);
    const int64_t rows = chunk.size(0) / t;
    return t > 1 ? chunk.narrow(0, tp_rank * rows, rows) : chunk;
  };
  ops->attention_rows = [n, r](int64_t T, c10::Device device) { return context_positions(T, n, r, device); };
  // MoE routing: the cp chunk (gathered over tp first under --sp), then every cp rank's, put in
  // position order; the auxiliary losses' parts count cp times (the gradients' mean over cp).
  ops->gather_sequence = [inner = before->gather_sequence, cp, n](const at::Tensor& x) {
    const at::Tensor all = gather_rows(inner ? inner(x) : x, 1, *cp);  // rank-major: each rank's two chunks
    std::vector<at::Tensor> held;
    for (int64_t i = 0; i < n; ++i) held.push_back(context_positions(all.size(1), n, i, x.device()));
    return at::empty_like(all).index_copy_(1, at::cat(held), all);
  };
  ops->sequence_loss_factor = static_cast<double>(n);
  ops->local_tokens = [n, r](const at::Tensor& ids) {
    return ids.index_select(1, context_positions(ids.size(1), n, r, ids.device()));
  };
  // The causal mask as an additive bias (0 / -inf) in the compute dtype, made once and passed to
  // every layer: SDPA's fused kernels keep their bias for backward, and a boolean mask would be
  // converted -- a new [2C, T] tensor kept per layer (gpt2-1.5b at T 32k, cp 2: 51 GB in all).
  // One tensor for the run: a [2C, T] of the compute dtype.
  // The keys stay in the order they arrive (rank-major: rank i's 2C rows hold its positions
  // context_positions(T, n, i)); the mask is made in that order, so no permutation copies K and V
  // (and its backward, a scatter-add, accumulates nothing): attention does not care in which order
  // its keys come, as long as the mask says which each query may see.
  struct MaskCache {
    std::mutex mutex;
    at::Tensor bias;
  };
  auto cache = std::make_shared<MaskCache>();
  ops->gather_kv = [cp, n, cache](const at::Tensor& k, const at::Tensor& v) {
    const int64_t local = k.size(2), T = local * n;
    const c10::Device device = k.device();
    // [B, KV, T, h] each, gathered along the positions in arrival order. K and V in collectives
    // of their own, each gathered into a tensor of its own: a kernel that copies one of them (the
    // CPU's math path transposes K) then frees it instead of keeping a stacked [2, ...] alive.
    const at::Tensor K = all_gather_rows(k, 2, cp), V = all_gather_rows(v, 2, cp);
    std::lock_guard<std::mutex> lock(cache->mutex);
    at::Tensor& bias = cache->bias;
    if (!bias.defined() || bias.size(0) != local || bias.size(1) != T || bias.device() != device ||
        bias.scalar_type() != k.scalar_type()) {
      std::vector<at::Tensor> held;  // the position of each gathered key
      for (int64_t i = 0; i < n; ++i) held.push_back(context_positions(T, n, i, device));
      const at::Tensor key_pos = at::cat(held);
      const at::Tensor mine = context_positions(T, n, cp->rank(), device);
      const at::Tensor allowed = key_pos.unsqueeze(0) <= mine.unsqueeze(1);  // [2C, T]: key j visible to query i
      bias = at::zeros({local, T}, k.options().requires_grad(false))
                 .masked_fill_(allowed.logical_not(), -std::numeric_limits<double>::infinity());
    }
    return std::make_tuple(K, V, bias);
  };
  ops->gathered_key_rows = [n](int64_t T, c10::Device device) {  // rank-major, as gather_kv gives them
    std::vector<at::Tensor> held;
    for (int64_t i = 0; i < n; ++i) held.push_back(context_positions(T, n, i, device));
    return at::cat(held);
  };
  // Attention dropout: a stream per (tp, cp) rank.
  ops->in_tp_region = [tp_rank, n, r](c10::Device device, const std::function<at::Tensor()>& fn) {
    return with_rank_rng(device, tp_rank * n + r, fn);
  };
  ops->unsplit = before->unsplit ? before->unsplit : before;
  shard.ops = std::move(ops);
  return shard;
}

}  // namespace kiln
