// kernels/float8_cuda.h -- launchers of the float8 quantisation (kernels/float8.cu); the entry is
// kernels/float8.cpp's to_float8 / to_float8_along. x [rows, cols] of type t, contiguous; `along`
// picks the amax's extent: all (one scalar), rows (one a row: [rows]), cols (one a column: [cols]).
#pragma once

#include <cstdint>

#include "kernels/cuda_launch.h"

namespace kiln::kernels {

enum class Along { all, rows, cols };
enum class Float8Format { e4m3, e5m2 };

// amax (fp32, zeroed by the caller: 1, rows or cols of them) = max |x| over its extent, NaN-propagating.
cudaError_t float8_amax_cuda(DType t, const void* x, int64_t rows, int64_t cols, Along along, float* amax, cudaStream_t stream);

// q (one byte an element, x's shape) = cast(clamp(x / s)) with s read from the device (1, rows or
// cols of them, fp32): no host synchronisation, so a CUDA graph can hold it.
cudaError_t float8_cast_cuda(DType t, const void* x, int64_t rows, int64_t cols, Along along, const float* s,
                             Float8Format format, void* q, cudaStream_t stream);

}  // namespace kiln::kernels
