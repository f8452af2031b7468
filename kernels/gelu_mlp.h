// kernels/gelu_mlp.h -- GPT-2's feed-forward c_proj(gelu_tanh(c_fc(x))) with the bias and GELU
// inside cuBLASLt's products (llm.c's "GELU fusion"), or composite (kernels/kernel_choice.h).
//
// x [N, d], w_fc [F, d], b_fc [F], w_proj [d, F], b_proj [d] -> [N, d].
// Fused (x on CUDA, x and the weights all in one 16-bit dtype -- autocast's when it is on --, F a
// multiple of 8; kernels/cublaslt.h):
//   forward   h = x w_fc^T + b_fc and g = gelu_tanh(h) in one product (epilogue GELU_AUX_BIAS:
//             g is the product's output, h its auxiliary output, kept for backward), then
//             out = g w_proj^T + b_proj (LibTorch's addmm, whose bias is its own epilogue)
//   backward  dh = (dout w_proj) * gelu_tanh'(h) in one product (epilogue DGELU), then the
//             gradients' products and the biases' column sums through LibTorch
// Saves, against the composite path: the GELU kernel's read of h and write of g forward, and
// backward the write and read of dg = dout w_proj and gelu_backward's pass. Kept for backward:
// x, h, g (as the composite path keeps them).
// Reference: at::linear(at::gelu(at::linear(x, w_fc, b_fc), "tanh"), w_proj, b_proj).
#pragma once

#include <ATen/core/Tensor.h>

#include "kernels/kernel_choice.h"

namespace kiln {

at::Tensor gelu_mlp(const at::Tensor& x, const at::Tensor& w_fc, const at::Tensor& b_fc, const at::Tensor& w_proj,
                    const at::Tensor& b_proj, Kernels kernels);

}  // namespace kiln
