// optim/cpu_adamw_avx2.cpp -- kiln::cpu_adamw's loop compiled for AVX2 + FMA.
//
// The only file built with -mavx2 -mfma (CMakeLists.txt, x86-64 only), with CPU_CAPABILITY=AVX2
// so that at::vec::Vectorized<float> is LibTorch's __m256 version, in its own inline namespace
// as in LibTorch's kernels. optim/cpu_adamw.cpp calls it only on a CPU that has both.
#include "optim/cpu_adamw_kernel.h"

namespace kiln::cpu_adamw_detail {

void adamw_range_avx2(float* p, const float* g, float* m, float* v, int64_t n, const Coeffs& c) {
  adamw_range(p, g, m, v, n, c);
}

}  // namespace kiln::cpu_adamw_detail
