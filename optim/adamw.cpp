// optim/adamw.cpp -- AdamW over its two groups, each one multi-tensor update (kernels/adamw.h).
#include "optim/adamw.h"

#include <stdexcept>

#include <ATen/ATen.h>

#include "kernels/adamw.h"

namespace kiln {

AdamW::AdamW(const std::vector<at::Tensor>& params, const AdamWConfig& cfg, at::ScalarType working) : cfg_(cfg), working_(working) {
  if (working != at::kFloat && working != at::kBFloat16 && working != at::kHalf) {
    throw std::invalid_argument("AdamW: working weights must be fp32, bf16 or fp16");
  }
  Group decay, no_decay;
  decay.weight_decay = cfg.weight_decay;
  no_decay.weight_decay = 0.0;
  for (const auto& p : params) {
    if (p.scalar_type() != at::kFloat) throw std::invalid_argument("AdamW: parameters must be fp32 when handed over");
    Group& g = p.dim() >= 2 ? decay : no_decay;
    g.params.push_back(p);
    if (working == at::kFloat) {
      g.masters.push_back(p);
    } else {
      at::NoGradGuard no_grad;
      g.masters.push_back(p.detach().clone(at::MemoryFormat::Contiguous));  // the fp32 values, before the cast
      p.set_data(p.detach().to(working));
    }
    targets_.push_back(g.masters.back());
    params_.push_back(p);
    g.exp_avg.push_back(at::zeros_like(g.masters.back(), at::MemoryFormat::Contiguous));
    g.exp_avg_sq.push_back(at::zeros_like(g.masters.back(), at::MemoryFormat::Contiguous));
    // The fused kernel reads the step count from a float tensor on the parameter's device.
    g.step.push_back(at::zeros({}, p.options().dtype(at::kFloat)));
  }
  groups_.push_back(std::move(decay));
  groups_.push_back(std::move(no_decay));
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    for (size_t i = 0; i < groups_[gi].params.size(); ++i) index_[groups_[gi].params[i].unsafeGetTensorImpl()] = {gi, i};
}

std::pair<size_t, size_t> AdamW::index_of(const at::Tensor& p) const {
  const auto it = index_.find(p.unsafeGetTensorImpl());
  if (it == index_.end()) throw std::invalid_argument("AdamW: not a parameter of this optimizer");
  return it->second;
}

void AdamW::step_group(Group& g, double lr, const at::Tensor& found_inf, const at::Tensor& grad_factor, const at::Tensor& lr_tensor) {
  AdamWGroup u;  // the parameters with a gradient; working[k] takes params[k] (16-bit working weights)
  for (size_t i = 0; i < g.params.size(); ++i) {
    const auto& grad = grad_holder(g, i).grad();
    if (!grad.defined()) continue;
    u.params.push_back(g.masters[i]);
    if (!g.masters[i].is_same(g.params[i])) u.working.push_back(g.params[i]);
    u.grads.push_back(grad);
    u.exp_avg.push_back(g.exp_avg[i]);
    u.exp_avg_sq.push_back(g.exp_avg_sq[i]);
    u.steps.push_back(g.step[i]);
  }
  if (u.params.empty()) return;
  at::NoGradGuard no_grad;
  // The update expects t already advanced: by 1, or by 1 - found_inf (as torch.optim does).
  if (found_inf.defined()) at::_foreach_add_(u.steps, std::vector<at::Tensor>(u.steps.size(), 1.0 - found_inf));
  else at::_foreach_add_(u.steps, 1.0);
  adamw_update(u, {lr, cfg_.beta1, cfg_.beta2, g.weight_decay, cfg_.eps}, grad_factor, found_inf, kernels_, lr_tensor);
}

AdamW::ParamState AdamW::state_of(const at::Tensor& p) const {
  const auto [gi, i] = index_of(p);
  const Group& g = groups_[gi];
  return {g.exp_avg[i], g.exp_avg_sq[i], g.step[i], g.masters[i]};
}

const at::Tensor& AdamW::grad_target(const at::Tensor& p) const {
  const auto [gi, i] = index_of(p);
  return grad_holder(groups_[gi], i);
}

void AdamW::read_working_grads() {
  if (!has_masters()) return;
  working_grads_ = true;
  targets_ = params_;  // the parameters themselves, in the constructor's order
}

void AdamW::step(double lr, const at::Tensor& found_inf, const at::Tensor& grad_factor, const at::Tensor& lr_tensor) {
  for (auto& g : groups_) step_group(g, lr, found_inf, grad_factor, lr_tensor);
  ++steps_;  // calls, applied or not (the checkpoints keep the per-parameter counts)
}

}  // namespace kiln
