// kernels/classifier.h -- softmax cross-entropy over rows of fp32 logits with its gradient, fused
// or composite (kernels/kernel_choice.h). models/linear_cross_entropy.h calls it per chunk of
// rows.
//
// z [c, Vp] fp32 logits (contiguous rows; columns V..Vp the padded vocabulary), targets [c, 1]
// int64 in [0, V). Returns sum_i -log softmax_{v < V}(z_i)[t_i] (fp32, 0-dim). With grad defined
// ([c, Vp] rows of stride Vp, 16-bit or fp32) writes softmax_{v < V}(z_i) - onehot(t_i) into it
// (rounded once from fp32; p_t - 1 as expm1 of log p_t) and 0 in the padding columns.
// Fused (x on CUDA): kiln's kernel, kernels/classifier.cu (two reads of z, one write of grad).
// Reference: the padding filled with -inf in z itself (z is the caller's scratch), log-softmax,
// gather, exp into grad, scatter of expm1 at the targets.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "kernels/kernel_choice.h"

namespace kiln {

at::Tensor softmax_cross_entropy_rows(at::Tensor z, const at::Tensor& targets, int64_t vocab, at::Tensor grad,
                                      Kernels kernels);

}  // namespace kiln
