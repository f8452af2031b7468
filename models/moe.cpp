// models/moe.cpp -- the router, the capacity rule, the experts, the two losses.
#include "models/moe.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "runtime/error.h"

namespace kiln {

void MoEConfig::validate() const {
  if (n_experts < 1) throw ConfigError("--n-experts must be at least 1 (got " + std::to_string(n_experts) + ")");
  if (top_k < 1 || top_k > n_experts) {
    throw ConfigError("--top-k must be in [1, --n-experts " + std::to_string(n_experts) + "] (got " + std::to_string(top_k) + ")");
  }
  if (!(capacity_factor >= 0.0)) throw ConfigError("--moe-capacity-factor must be 0 (dropless) or positive");
}

int64_t moe_capacity(const MoEConfig& cfg, int64_t n_tokens) {
  if (cfg.capacity_factor <= 0.0) return 0;
  return static_cast<int64_t>(std::ceil(cfg.capacity_factor * static_cast<double>(cfg.top_k * n_tokens) /
                                        static_cast<double>(cfg.n_experts)));
}

MoEImpl::MoEImpl(int64_t d, int64_t hidden, const MoEConfig& cfg, const at::TensorOptions& opts) : cfg_(cfg) {
  cfg_.validate();
  const int64_t E = cfg_.n_experts;
  router = register_parameter("router", at::empty({E, d}, opts));
  fc_w = register_parameter("fc_w", at::empty({E, hidden, d}, opts));
  fc_b = register_parameter("fc_b", at::empty({E, hidden}, opts));
  proj_w = register_parameter("proj_w", at::empty({E, d, hidden}, opts));
  proj_b = register_parameter("proj_b", at::empty({E, d}, opts));
}

at::Tensor MoEImpl::forward(const at::Tensor& x_in) {
  const int64_t d = x_in.size(-1), E = cfg_.n_experts, k = cfg_.top_k;
  const at::Tensor x = x_in.reshape({-1, d});
  const int64_t N = x.size(0);
  // Router in fp32 at least (its softmax decides discrete choices; ST-MoE keeps it in fp32 too).
  const auto rdt = at::promote_types(at::kFloat, x.scalar_type());
  const at::Tensor logits = at::linear(x.to(rdt), router.to(rdt));  // [N, E]
  const at::Tensor probs = at::softmax(logits, -1);
  auto [top_p, top_e] = at::topk(probs, k, -1);  // [N, k], descending
  const at::Tensor gates = k > 1 ? top_p / top_p.sum(-1, /*keepdim=*/true) : top_p;

  // Capacity: choice j of every token before choice j + 1 of any; token order within a choice.
  const int64_t C = moe_capacity(cfg_, N);
  const at::Tensor order = top_e.t().reshape({-1});  // [k N]: choice-major
  const at::Tensor onehot = at::one_hot(order, E);   // [k N, E]
  const at::Tensor position = (onehot.cumsum(0) - 1).mul(onehot).sum(-1);  // the slot within its expert
  const at::Tensor admitted = C > 0 ? position.lt(C) : at::ones_like(position, at::kBool);
  const at::Tensor admitted_nk = admitted.view({k, N}).t();  // [N, k]

  // Experts: each one's admitted tokens in one batch.
  at::Tensor y = at::zeros({N, d}, x.options());  // the residual stream's dtype
  std::vector<int64_t> loads(static_cast<size_t>(E), 0);
  const at::Tensor kept_e = top_e.masked_fill(admitted_nk.logical_not(), -1);
  for (int64_t e = 0; e < E; ++e) {
    const at::Tensor hit = kept_e.eq(e);  // [N, k]: at most one true per row (top-k is distinct)
    const at::Tensor rows = hit.any(-1).nonzero().squeeze(-1);
    loads[static_cast<size_t>(e)] = rows.numel();
    if (rows.numel() == 0) continue;
    const at::Tensor g = (gates * hit).sum(-1).index_select(0, rows).unsqueeze(-1);  // [n_e, 1]
    const at::Tensor xe = x.index_select(0, rows);
    const at::Tensor h = at::gelu(at::linear(xe, fc_w[e], fc_b[e]), "tanh");
    const at::Tensor out = at::linear(h, proj_w[e], proj_b[e]);
    y = y.index_add(0, rows, (out * g.to(out.scalar_type())).to(y.scalar_type()));
  }

  // Losses: Switch's load balancing (f from the choices before dropping, P differentiable) and
  // the router z-loss.
  const at::Tensor f = at::one_hot(top_e.reshape({-1}), E).to(at::kFloat).mean(0);  // sums to 1
  const at::Tensor P = probs.mean(0);
  aux_loss = static_cast<double>(E) * (f * P).sum();
  z_loss = at::logsumexp(logits, -1).square().mean();

  const double mean_load = static_cast<double>(N * k) / static_cast<double>(E);
  int64_t kept = 0, most = 0, least = N * k;
  for (int64_t l : loads) {
    kept += l;
    most = std::max(most, l);
    least = std::min(least, l);
  }
  stats.dropped_fraction = N * k > 0 ? 1.0 - static_cast<double>(kept) / static_cast<double>(N * k) : 0.0;
  stats.max_load = mean_load > 0 ? static_cast<double>(most) / mean_load : 0.0;
  stats.min_load = mean_load > 0 ? static_cast<double>(least) / mean_load : 0.0;
  return y.to(x_in.scalar_type()).view(x_in.sizes());
}

}  // namespace kiln
