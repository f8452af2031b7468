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

#include <ATen/core/Tensor.h>

#include "kernels/kernel_choice.h"

namespace kiln {

at::Tensor norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps, bool rms,
                Kernels kernels);

}  // namespace kiln
