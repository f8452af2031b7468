// kernels/hd.cuh -- what kiln's kernel headers share: KILN_HD marks a function compiled for the
// host and the device alike, so a kernel's per-row math is one piece of code that a CPU test
// (tests/test_kernels.cpp) runs against ATen and the GPU runs in the kernel.
//
// The math is written over any element type T with float conversions both ways
// (static_cast<float>(T) and T(float)): float, CUDA's __nv_bfloat16 / __half on the device, and
// c10::BFloat16 / c10::Half on the host -- all round a float to nearest-even.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define KILN_HD __host__ __device__ __forceinline__
#else
#define KILN_HD inline
#endif

namespace kiln::kernels {

// 1 / sqrt(v), correctly rounded on both sides (nvcc's default -prec-div/-prec-sqrt; the
// device's rsqrtf is an approximation the host has no twin of).
KILN_HD float inv_sqrt(float v) { return 1.0f / sqrtf(v); }

}  // namespace kiln::kernels
