// kernels/rope.h -- rotary position embeddings applied to queries or keys, fused or composite
// (kernels/kernel_choice.h; the rule and the tables: models/rotary.h).
//
// x [B, heads, T, h] (its last dimension contiguous: a view of the qkv product is taken as it
// is), cos and sin [rows, h] in x's dtype on x's device (row p: position p's angles), positions
// [T] int64 (undefined: 0 .. T-1) -> x * cos[pos] + rotate_half(x) * sin[pos], contiguous.
// Fused (x on CUDA): kiln's kernel (kernels/rope.cu), one pass each way, fp32 inside, one rounding.
// Reference: the composite ops (index_select or narrow of the tables, cat, products, sum).
#pragma once

#include <ATen/core/Tensor.h>

#include "kernels/kernel_choice.h"

namespace kiln {

at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions,
                Kernels kernels);

}  // namespace kiln
