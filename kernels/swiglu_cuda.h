// kernels/swiglu_cuda.h -- launchers of the fused SwiGLU (kernels/swiglu.cu); kernels/swiglu.h
// is the entry. h [rows, 2F] holds each row's gate (first F columns) then up (next F); y, dy
// [rows, F]; dh [rows, 2F]; all of type t, contiguous.
#pragma once

#include <cstdint>

#include "kernels/cuda_launch.h"

namespace kiln::kernels {

cudaError_t swiglu_forward_cuda(DType t, const void* h, void* y, int64_t rows, int64_t F, cudaStream_t stream);
cudaError_t swiglu_backward_cuda(DType t, const void* h, const void* dy, void* dh, int64_t rows, int64_t F,
                                 cudaStream_t stream);

}  // namespace kiln::kernels
