// parallel/main_grads.h -- fp32 gradient accumulation for 16-bit working weights.
//
// With bf16 / fp16 parameters (optim/adamw.h: --param-dtype) autograd writes each micro-step's
// gradient in the parameter's dtype. Accumulating K micro-steps there would round every partial
// sum to 8 (bf16) or 11 (fp16) bits; Megatron and FSDP accumulate in fp32 instead ("main grad"):
//   G = sum_{k=1..K} float(g_k)          (G: the fp32 master's .grad, optim/adamw.h's grad_target)
// A hook on each parameter's AccumulateGrad node (parallel/grad_ready.h) adds g_k into G as soon
// as backward produces it and frees g_k, so a 16-bit gradient lives only from its production to
// its hook, never a whole model's worth. DDP (parallel/ddp.h) runs the same step in its own hook,
// before it counts its bucket down; MainGrads serves the runs without DDP.
#pragma once

#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "parallel/grad_ready.h"

namespace kiln {

// Where a parameter's (reduced, accumulated) gradient is read: the fp32 main grad for 16-bit
// working weights (optim/adamw.h's grad_target(p).grad()). Empty: p.grad() itself.
using GradOf = std::function<at::Tensor(const at::Tensor& param)>;
inline at::Tensor grad_of(const GradOf& f, const at::Tensor& param) { return f ? f(param) : param.grad(); }

// G += float(param.grad); param.grad = undefined. param.grad must be defined.
void move_grad_to_main(const at::Tensor& param, const at::Tensor& target);

class MainGrads {
 public:
  // params: the model's 16-bit parameters; targets: their fp32 grad targets, in the same order.
  MainGrads(std::vector<at::Tensor> params, std::vector<at::Tensor> targets);
  // Before a step's first backward: every target's .grad zero (allocated once, then reused).
  void zero_grad();

 private:
  std::vector<at::Tensor> params_, targets_;
  GradReadyHooks hooks_;
};

}  // namespace kiln
