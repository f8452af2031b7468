// optim/cpu_adamw_avx2.cpp -- kiln::cpu_adamw's loop compiled for AVX2 + FMA (+ F16C).
//
// The only file built with -mavx2 -mfma -mf16c (CMakeLists.txt, x86-64 only; c10's fp16
// rounding takes F16C's instruction under AVX2), with CPU_CAPABILITY=AVX2 so that
// at::vec::Vectorized<float> is LibTorch's __m256 version, in its own inline namespace as in
// LibTorch's kernels. optim/cpu_adamw.cpp calls it only on a CPU that has all three.
#include "optim/cpu_adamw_kernel.h"

namespace kiln::cpu_adamw_detail {

void adamw_range_avx2(float* p, const float* g, float* m, float* v, int64_t n, const Coeffs& c, void* out16) {
  adamw_range(p, g, m, v, n, c, out16);
}

}  // namespace kiln::cpu_adamw_detail
