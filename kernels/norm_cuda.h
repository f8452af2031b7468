// kernels/norm_cuda.h -- launchers of kiln's LayerNorm / RMSNorm kernels (kernels/norm.cu), raw
// pointers and a stream; kernels/norm.h is the entry the model calls. x, y, dy, dx: [rows, d] of
// type xt, contiguous; w, b, dw, db: [d] of type wt (xt, or f32 under fp32 working weights);
// mean, rstd: [rows] fp32. b / db null for RMSNorm (rms), dx / dw / db null when not wanted.
#pragma once

#include <cstdint>

#include "kernels/cuda_launch.h"

namespace kiln::kernels {

// res non-null: the norm is of s = x + res, written to sum ([rows, d] of type xt) on the way.
cudaError_t norm_forward_cuda(DType xt, DType wt, const void* x, const void* res, void* sum, const void* w, const void* b,
                              void* y, float* mean, float* rstd, int64_t rows, int d, float eps, bool rms,
                              cudaStream_t stream);

// fp32 scratch the backward needs for dw / db's column partials.
int64_t norm_backward_scratch_floats(int64_t rows, int d);

// dsum non-null (type xt, [rows, d]): dx takes the norm's gradient plus dsum (the add's
// backward when the norm's input was a residual sum).
cudaError_t norm_backward_cuda(DType xt, DType wt, const void* x, const void* dy, const void* dsum, const void* w,
                               const float* mean, const float* rstd, void* dx, void* dw, void* db, float* scratch,
                               int64_t rows, int d, bool rms, cudaStream_t stream);

}  // namespace kiln::kernels
