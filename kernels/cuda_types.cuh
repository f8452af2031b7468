// kernels/cuda_types.cuh -- device-side helpers every .cu shares: the element type of a DType tag,
// warp reductions, and dispatch over (x, w) type pairs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda_launch.h"

namespace kiln::kernels {

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Calls f(T{}, W{}) with the element types of (xt, wt); W is T or float. Unsupported pairs
// return cudaErrorInvalidValue.
template <typename F>
cudaError_t dispatch_xw(DType xt, DType wt, F&& f) {
  if (xt == DType::f32 && wt == DType::f32) return f(float{}, float{});
  if (xt == DType::bf16 && wt == DType::bf16) return f(__nv_bfloat16{}, __nv_bfloat16{});
  if (xt == DType::bf16 && wt == DType::f32) return f(__nv_bfloat16{}, float{});
  if (xt == DType::f16 && wt == DType::f16) return f(__half{}, __half{});
  if (xt == DType::f16 && wt == DType::f32) return f(__half{}, float{});
  return cudaErrorInvalidValue;
}

template <typename F>
cudaError_t dispatch_x(DType xt, F&& f) {
  if (xt == DType::f32) return f(float{});
  if (xt == DType::bf16) return f(__nv_bfloat16{});
  if (xt == DType::f16) return f(__half{});
  return cudaErrorInvalidValue;
}

}  // namespace kiln::kernels
