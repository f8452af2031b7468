// kernels/rope_cuda.h -- launcher of the fused rotary embedding (kernels/rope.cu); kernels/rope.h
// is the entry. x [B, H, T, h] of type t with strides (sb, sh, st, 1) in elements (a view of the
// attention's qkv product); y [B, H, T, h] contiguous; cos, sin [rows, h] of type t, contiguous
// (row p: position p's angles, twice over); positions [T] int64 or null (0 .. T-1). backward:
// turn by -angle (the gradient's rule).
#pragma once

#include <cstdint>

#include "kernels/cuda_launch.h"

namespace kiln::kernels {

cudaError_t rope_cuda(DType t, const void* x, int64_t B, int64_t H, int64_t T, int64_t h, int64_t sb, int64_t sh,
                      int64_t st, const void* cos, const void* sin, const int64_t* positions, void* y, bool backward,
                      cudaStream_t stream);

}  // namespace kiln::kernels
