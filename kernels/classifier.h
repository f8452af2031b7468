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
#include <utility>

#include <ATen/core/Tensor.h>

#include "kernels/kernel_choice.h"

namespace kiln {

at::Tensor softmax_cross_entropy_rows(at::Tensor z, const at::Tensor& targets, int64_t vocab, at::Tensor grad,
                                      Kernels kernels);

// The vocabulary-parallel loss's local passes (parallel/tensor_parallel.h's two-pass way; the
// math: kernels/classifier.cu). z [N, c'] this rank's logit columns in their own dtype, the first
// `cols` of them real vocabulary. Fused (z on CUDA, contiguous, fp32 / bf16 / fp16): kiln's
// kernels; reference: the same math in ATen ops, in fp32.
// Row stats: (m, s) [N] fp32, m = max_j z_j and s = sum_j exp(z_j - m) over the real columns
// ((-inf, 0) for a rank holding none).
std::pair<at::Tensor, at::Tensor> softmax_row_stats(const at::Tensor& z, int64_t cols, Kernels kernels);
// Gradient [N, c'] in z's dtype: scale (exp(z - lse) - onehot(local_targets)) over the real
// columns (the target's term as expm1 from fp32), 0 in the others. lse [N] fp32; local_targets
// [N] int64, outside [0, cols) where the rank does not hold the target; scale 0-dim fp32, all on
// z's device.
// out (optional): [N, c'] of z's dtype with unit column stride (rows of any stride): written in
// place and returned, in place of a new tensor (the 16-bit-logits loss writes G's rows so).
at::Tensor softmax_xent_grad(const at::Tensor& z, int64_t cols, const at::Tensor& lse, const at::Tensor& local_targets,
                             const at::Tensor& scale, Kernels kernels, at::Tensor out = at::Tensor());

}  // namespace kiln
