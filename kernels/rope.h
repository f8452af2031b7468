// kernels/rope.h -- rotary position embeddings applied to queries and keys, fused or composite
// (kernels/kernel_choice.h; the rule and the tables: models/rotary.h).
//
// q [B, H, T, h] and k [B, KV, T, h] (their last dimension contiguous: views of the qkv product
// are taken as they are), cos and sin [rows, h] in their dtype on their device (row p: position
// p's angles), positions [T] int64 (undefined: 0 .. T-1), or [B, T] (each row its own: documents
// that restart their positions) -> each x * cos[pos] + rotate_half(x) * sin[pos], contiguous.
// Per-row positions take the reference path on CUDA too (the kernel reads one row of positions).
// Fused (on CUDA): kiln's kernel (kernels/rope.cu), one pass each way per tensor, fp32 inside,
// one rounding. Reference: the composite ops (the tables' rows taken once for both, cat,
// products, sum).
#pragma once

#include <utility>

#include <ATen/core/Tensor.h>

#include "kernels/kernel_choice.h"

namespace kiln {

std::pair<at::Tensor, at::Tensor> rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                       const at::Tensor& sin, const at::Tensor& positions, Kernels kernels);

}  // namespace kiln
