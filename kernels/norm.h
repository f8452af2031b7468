// kernels/norm.h -- LayerNorm and RMSNorm over the last dimension, fused or composite
// (kernels/kernel_choice.h).
//
// Fused (Kernels::fused, x on CUDA, kernels built): kiln's kernels (kernels/norm.cu): y in x's
// dtype, statistics in fp32 (math: kernels/norm_math.cuh), backward dx, dw, db in one pass over
// the rows and one deterministic column reduction. Autocast does not enter: a bf16 x stays bf16
// (CUDA's autocast would run the composite norm in fp32 and return fp32).
// Reference (everything else): at::layer_norm / at::rms_norm, autocast's rules applying.
// x [..., d], weight [d], bias [d] or undefined (RMSNorm: always undefined).
#pragma once

#include <utility>

#include <ATen/core/Tensor.h>

#include "kernels/kernel_choice.h"

namespace kiln {

at::Tensor norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps, bool rms,
                Kernels kernels);

// The residual add before a norm and the norm: s = x + r, then (s, norm(s)). Fused (x and r of
// one supported dtype and shape, on CUDA): one kernel each way -- forward reads x and r and writes
// s and the normed rows; backward writes ds_norm + ds_residual once, the same gradient going to
// x and r (kernels/norm.cu's bytes). Reference: x + r, then norm() with `kernels` (so a mixed
// pair, an fp32 stream plus a 16-bit r under autocast, still takes the fused norm).
std::pair<at::Tensor, at::Tensor> add_norm(const at::Tensor& x, const at::Tensor& r, const at::Tensor& weight,
                                           const at::Tensor& bias, double eps, bool rms, Kernels kernels);
// Whether add_norm runs its one fused kernel on this pair.
bool add_norm_fused(const at::Tensor& x, const at::Tensor& r, Kernels kernels);

}  // namespace kiln
