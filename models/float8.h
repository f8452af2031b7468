// models/float8.h -- 8-bit floating-point products with dynamic tensorwise scaling (issue 52, the
// recipe's numerics; not yet wired into the model: see docs/precision.md).
//
// A tensor x in float8 (e4m3: 4 exponent bits, 3 mantissa bits, largest 448; e5m2: 5 and 2,
// largest 57344) is kept as (q, s) with x ~ q * s:
//   s = max(amax(|x|), 1e-12) / fmax          (fp32 scalar, the dequantisation scale)
//   q = cast_f8(clamp(x / s, -fmax, fmax))    (round to nearest even)
// so the largest element lands on the format's largest value (torchao's tensorwise recipe).
// A linear layer y = x W^T (x [M, K], W [N, K]) in float8, as torchao's Float8Linear:
//   forward   y  = (q_x q_W^T) s_x s_W                          x, W in e4m3
//   backward  dX = (q_g q_W) s_g s_W,  dW = (q_g^T q_x) s_g s_x  g = dL/dy in e5m2 (its range: the
//             gradients' magnitudes spread further than the activations'; torchtitan takes e4m3
//             for them too -- the choice to measure, issue 52)
// each product one at::_scaled_mm accumulating in fp32 and writing the output dtype (x's); the
// operands are quantised once in the forward and kept for the backward (q_x, q_W: one byte an
// element, against two for bf16). _scaled_mm takes its second operand column-major: the kept
// tensors are handed over transposed as views where the product wants it (on the CPU LibTorch
// 2.11 takes any layout and tensorwise scales only; rowwise scaling is CUDA's).
// Bytes: the quantisation reads x once for amax and once for the cast (kiln's fused amax-and-cast
// kernel is issue 52's; here the composite ops).
#pragma once

#include <ATen/core/Tensor.h>

namespace kiln {

struct Float8Tensor {
  at::Tensor data;   // float8 (e4m3 or e5m2), x's shape
  at::Tensor scale;  // fp32 scalar: x ~ data * scale
  at::Tensor dequantized() const;  // data * scale in fp32
};

// x quantised to `dtype` (at::kFloat8_e4m3fn or at::kFloat8_e5m2) with its tensorwise scale.
Float8Tensor to_float8(const at::Tensor& x, at::ScalarType dtype);

// y = x W^T through float8 products (above), with autograd: x [..., K] (fp32 or 16-bit), W [N, K]
// -> [..., N] in x's dtype.
at::Tensor float8_linear(const at::Tensor& x, const at::Tensor& weight);

}  // namespace kiln
