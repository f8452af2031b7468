// optim/grad_clip.cpp -- global gradient norm with LibTorch's multi-tensor kernels.
#include "optim/grad_clip.h"

#include <ATen/ATen.h>

namespace kiln {

namespace {
std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  return grads;
}
}  // namespace

at::Tensor grad_norm(const std::vector<at::Tensor>& params) {
  auto grads = grads_of(params);
  if (grads.empty()) return at::zeros({}, at::kFloat);
  // On the CPU in double: LibTorch's CPU fp32 norm of a long tensor is off by up to 1e-6
  // relative. CUDA's multi-tensor kernel reduces in a tree, accurately in fp32.
  // 16-bit gradients (AdamW::read_working_grads) are normed in fp32 there too.
  const bool cpu = grads.front().is_cpu(), fp32 = grads.front().scalar_type() == at::kFloat;
  auto norms = at::_foreach_norm(grads, 2, cpu ? std::optional<at::ScalarType>(at::kDouble)
                                           : fp32 ? std::nullopt : std::optional<at::ScalarType>(at::kFloat));
  return at::stack(norms).norm(2).to(at::kFloat);
}

at::Tensor weighted_sq_norm(const std::vector<std::pair<at::Tensor, double>>& pieces) {
  std::vector<double> weights;  // distinct, in first-seen order
  std::vector<std::vector<at::Tensor>> lists;
  for (const auto& [t, w] : pieces) {
    if (w == 0.0) continue;
    size_t k = 0;
    while (k < weights.size() && weights[k] != w) ++k;
    if (k == weights.size()) {
      weights.push_back(w);
      lists.emplace_back();
    }
    lists[k].push_back(t);
  }
  at::Tensor total;
  for (size_t k = 0; k < weights.size(); ++k) {
    const bool cpu = lists[k].front().is_cpu();
    const auto norms = at::_foreach_norm(lists[k], 2, cpu ? at::kDouble : at::kFloat);
    at::Tensor sq = at::stack(norms).to(at::kDouble).square().sum();
    if (weights[k] != 1.0) sq = sq * weights[k];
    total = total.defined() ? total + sq : sq;
  }
  return total;
}

at::Tensor clip_factor(const at::Tensor& norm, double max_norm, double grad_scale) {
  if (max_norm > 0.0) {
    auto coef = (max_norm / (norm + 1e-6)).clamp_max(1.0);
    return grad_scale != 1.0 ? coef / grad_scale : coef;
  }
  if (grad_scale != 1.0) return at::full({}, 1.0 / grad_scale, norm.options().dtype(at::kFloat));
  return at::Tensor();
}

}  // namespace kiln
