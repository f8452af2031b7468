// parallel/main_grads.cpp -- fp32 gradient accumulation for 16-bit working weights (see the header).
#include "parallel/main_grads.h"

#include <stdexcept>

#include <ATen/ATen.h>

namespace kiln {

void move_grad_to_main(const at::Tensor& param, const at::Tensor& target) {
  at::NoGradGuard no_grad;
  at::Tensor& g = const_cast<at::Tensor&>(param).mutable_grad();
  target.mutable_grad().add_(g);  // fp32 += 16-bit: the sum is formed in fp32
  g = at::Tensor();
}

MainGrads::MainGrads(std::vector<at::Tensor> params, std::vector<at::Tensor> targets)
    : params_(std::move(params)), targets_(std::move(targets)) {
  if (params_.size() != targets_.size()) throw std::invalid_argument("MainGrads: one target per parameter");
  for (size_t k = 0; k < params_.size(); ++k) {
    hooks_.add(params_[k], [this, k] { move_grad_to_main(params_[k], targets_[k]); }, "main grads");
  }
}

void MainGrads::zero_grad() {
  for (auto& t : targets_) {
    if (t.grad().defined()) t.mutable_grad().zero_();
    else t.mutable_grad() = at::zeros_like(t, at::MemoryFormat::Contiguous);
  }
}

}  // namespace kiln
