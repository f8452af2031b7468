// kernels/adamw.h -- one AdamW update of a parameter group, fused or composite
// (kernels/kernel_choice.h). The math: kernels/adamw_math.cuh.
//
// params: the fp32 tensors updated (the masters under 16-bit working weights); grads, exp_avg,
// exp_avg_sq: theirs, same sizes; steps: each one's 0-dim fp32 step count on the device, already
// advanced for this update (as _fused_adamw_ takes it); working: empty, or each param's 16-bit
// working copy, which takes the new values rounded to nearest even.
// grad_factor (0-dim fp32, undefined: 1): every gradient is multiplied by it first -- the clip
// factor over the loss scale (optim/grad_clip.h). Gradients may be fp32 or 16-bit (read as
// fp32, then multiplied: one rounding, in both paths). found_inf (0-dim fp32, undefined: 0): 1 skips
// the update without a host sync. Both on the parameters' device.
//
// Fused (every tensor on one CUDA device, contiguous, fp32 params and moments, the gradients of
// one dtype, the working copies of one 16-bit dtype): kiln's one-pass kernel (kernels/adamw.cu),
// which leaves the gradients as they were. Reference: _foreach_mul_ of the gradients (left
// holding c g; 16-bit ones are copied to fp32 first and left as they were), LibTorch's
// _fused_adamw_, then _foreach_copy_ into the working copies.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

#include "kernels/kernel_choice.h"

namespace kiln {

struct AdamWGroup {
  std::vector<at::Tensor> params, grads, exp_avg, exp_avg_sq, steps, working;
};

struct AdamWHyperParams {
  double lr, beta1, beta2, weight_decay, eps;
};

// lr_tensor (0-dim fp32 on the parameters' device; undefined: h.lr): the rate is read there when
// the update runs, not when it is queued -- a CUDA graph's update, whose rate is filled in before
// each replay (float(h.lr) either way: the fused kernel computes in fp32, and LibTorch's takes a
// tensor rate as its fp32 value).
void adamw_update(const AdamWGroup& g, const AdamWHyperParams& h, const at::Tensor& grad_factor, const at::Tensor& found_inf,
                  Kernels kernels, const at::Tensor& lr_tensor = at::Tensor());

// Whether adamw_update runs the fused kernel on `g` (CUDA, the layout above, a build with the kernels).
bool adamw_fused_eligible(const AdamWGroup& g, const at::Tensor& grad_factor, const at::Tensor& found_inf);

}  // namespace kiln
