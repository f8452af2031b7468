// optim/grad_clip.h -- global gradient-norm clipping.
//
//   n = sqrt(sum_p ||g_p||^2)          c = min(1, max_norm / (n + 1e-6))          g_p *= c
// Everything stays on the device (no host synchronisation): the norm is returned as a 0-dim
// fp32 tensor, read by the caller once per step together with the loss; the multiply by c is
// the optimizer's, as it reads the gradients (optim/adamw.h, kernels/adamw.h).
#pragma once

#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace kiln {

// Global L2 norm of the gradients of `params` (parameters without a gradient are left out).
at::Tensor grad_norm(const std::vector<at::Tensor>& params);

// sum_i w_i ||t_i||^2 over `pieces` (t_i, w_i), a 0-dim fp64 tensor on their device (undefined
// when there are none): one multi-tensor norm (_foreach_norm) per distinct weight, where the
// per-tensor way took five launches a tensor (norm, square, cast, multiply, add: ~740 on
// gpt2-124m's 148 parameters). Norms in fp32 on CUDA (the multi-tensor kernel reduces in a tree),
// fp64 on the CPU (as grad_norm); squared and summed in fp64. Weights of 0 are left out.
at::Tensor weighted_sq_norm(const std::vector<std::pair<at::Tensor, double>>& pieces);

// The clipping multiply's factor, c = min(1, max_norm / (norm + 1e-6)) / grad_scale, a 0-dim
// fp32 tensor on the norm's device computed there in fp32; `norm`: the 0-dim fp32 norm of the
// unscaled gradients. No clipping if max_norm <= 0 (c = 1 / grad_scale); undefined when c is 1
// for certain (no clipping, grad_scale 1). The optimizer applies it as it reads the gradients
// (AdamW::step's grad_factor): the trainer's update does not pass over the gradients for it.
at::Tensor clip_factor(const at::Tensor& norm, double max_norm, double grad_scale);

}  // namespace kiln
