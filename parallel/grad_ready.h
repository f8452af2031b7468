// parallel/grad_ready.h -- callbacks that run when a parameter's gradient has been accumulated.
//
// A post-hook on the parameter's AccumulateGrad node: when it runs, .grad() holds this
// backward's contribution. DDP counts its buckets down with it; ZeRO its units. (PyTorch's
// Tensor.register_post_accumulate_grad_hook is the same mechanism.)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torch::autograd {
struct Node;
}

namespace kiln {

class GradReadyHooks {
 public:
  GradReadyHooks() = default;
  GradReadyHooks(const GradReadyHooks&) = delete;
  GradReadyHooks& operator=(const GradReadyHooks&) = delete;
  ~GradReadyHooks();  // removes every hook it added

  // fn runs after each accumulation into param.grad(). Throws Error when param does not
  // require grad (what: the caller's name for messages).
  void add(const at::Tensor& param, std::function<void()> fn, const std::string& what);

 private:
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // kept alive for the hooks
  std::vector<uintptr_t> keys_;
};

}  // namespace kiln
