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
  if (before->seq_rows) throw ConfigError("--cp with --sp is not built: choose one way of splitting the sequence");
  auto ops = std::make_shared<LayerOps>(*before);
  const int64_t n = cp->size(), r = cp->rank(), tp_rank = shard.rank;
  ops->seq_split = n;
  ops->seq_rows = [n, r](int64_t T, c10::Device device) { return context_positions(T, n, r, device); };
  ops->local_tokens = [n, r](const at::Tensor& ids) {
    return ids.index_select(1, context_positions(ids.size(1), n, r, ids.device()));
  };
  // The causal mask as an additive bias (0 / -inf) in the compute dtype, made once and passed to
  // every layer: SDPA's fused kernels keep their bias for backward, and a boolean mask would be
  // converted -- a new [2C, T] tensor kept per layer (gpt2-1.5b at T 32k, cp 2: 51 GB in all).
  // One tensor for the run: a [2C, T] of the compute dtype.
  // The gathered rows' permutation into position order is the same every call: kept beside it.
  struct MaskCache {
    std::mutex mutex;
    at::Tensor bias, order;
  };
  auto cache = std::make_shared<MaskCache>();
  ops->gather_kv = [cp, n, cache](const at::Tensor& k, const at::Tensor& v) {
    const int64_t local = k.size(2), T = local * n;
    const c10::Device device = k.device();
    // [2, B, KV, 2C, h] gathered along the positions, rank-major: rank i's 2C rows hold its
    // positions context_positions(T, n, i); `order` puts them in position order.
    const at::Tensor all = all_gather_rows(at::stack({k, v}), 3, cp);
    std::lock_guard<std::mutex> lock(cache->mutex);
    at::Tensor &bias = cache->bias, &order = cache->order;
    if (!bias.defined() || bias.size(0) != local || bias.size(1) != T || bias.device() != device ||
        bias.scalar_type() != k.scalar_type()) {
      std::vector<at::Tensor> held;
      for (int64_t i = 0; i < n; ++i) held.push_back(context_positions(T, n, i, device));
      order = at::argsort(at::cat(held));
      const at::Tensor mine = context_positions(T, n, cp->rank(), device);
      const at::Tensor allowed = at::arange(T, at::TensorOptions().dtype(at::kLong).device(device)).unsqueeze(0) <= mine.unsqueeze(1);
      bias = at::zeros({local, T}, k.options().requires_grad(false))
                 .masked_fill_(allowed.logical_not(), -std::numeric_limits<double>::infinity());
    }
    // K and V each in a tensor of its own: a kernel that copies one of them (the CPU's math path
    // transposes K) then frees the gathered original instead of keeping it alive beside V.
    return std::make_tuple(all[0].index_select(2, order), all[1].index_select(2, order), bias);
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
