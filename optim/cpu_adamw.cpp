// optim/cpu_adamw.cpp -- kiln::cpu_adamw: the step's coefficients, the split over threads, and
// the choice between the AVX2 and the portable loop (optim/cpu_adamw_kernel.h).
#include "optim/cpu_adamw.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include <ATen/Parallel.h>
#include <ATen/Version.h>

#include "optim/cpu_adamw_kernel.h"

// at::parallel_for is a header template: with LibTorch's OpenMP backend it only splits the range
// when the file that calls it is compiled with OpenMP, else it silently runs on one thread.
#if AT_PARALLEL_OPENMP && !defined(_OPENMP)
#error "optim/cpu_adamw.cpp must be compiled with OpenMP (-fopenmp) to use LibTorch's thread pool"
#endif

namespace kiln {
namespace cpu_adamw_detail {

#if KILN_CPU_ADAMW_AVX2
void adamw_range_avx2(float* p, const float* g, float* m, float* v, int64_t n, const Coeffs& c, void* out16);
#endif

namespace {

using RangeFn = void (*)(float*, const float*, float*, float*, int64_t, const Coeffs&, void*);

void adamw_range_portable(float* p, const float* g, float* m, float* v, int64_t n, const Coeffs& c,
                          void* out16) {
  adamw_range(p, g, m, v, n, c, out16);
}

// LibTorch's fused kernel runs at the level at::get_cpu_capability() names (the CPU's best,
// lowered by ATEN_CPU_CAPABILITY); following it keeps the two bit-identical. At AVX512 the AVX2
// loop still matches: every operation is a lane-wise IEEE one, so the vector width does not
// change a value.
RangeFn pick_range_fn() {
#if KILN_CPU_ADAMW_AVX2
  const std::string level = at::get_cpu_capability();
  if ((level == "AVX2" || level == "AVX512") && __builtin_cpu_supports("avx2") &&
      __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
    return adamw_range_avx2;
  }
#endif
  return adamw_range_portable;
}

// As in LibTorch: the scalars in double, each rounded to float once. (LibTorch reads t from a
// float tensor, which holds every step below 2^24 exactly.)
Coeffs coeffs_of(const CpuAdamWStep& s) {
  const double t = static_cast<double>(s.step);
  const double bias_correction1 = 1 - std::pow(s.beta1, t);
  const double bias_correction2 = 1 - std::pow(s.beta2, t);
  const double step_size = s.lr / bias_correction1;
  Coeffs c;
  c.apply_decay = s.weight_decay != 0;
  c.decay = static_cast<float>(1 - s.lr * s.weight_decay);
  c.lerp_weight = static_cast<float>(1 - s.beta1);
  c.beta2 = static_cast<float>(s.beta2);
  c.one_minus_beta2 = static_cast<float>(1 - s.beta2);
  c.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  c.eps = static_cast<float>(s.eps);
  c.neg_step_size = static_cast<float>(-step_size);
  c.scale_grad = s.grad_scale != 1.0;
  c.grad_scale = static_cast<float>(s.grad_scale);
  return c;
}

}  // namespace
}  // namespace cpu_adamw_detail

void cpu_adamw(float* p, const float* g, float* m, float* v, int64_t n, const CpuAdamWStep& s) {
  cpu_adamw(p, g, m, v, n, s, nullptr, CpuWorking::none);
}

void cpu_adamw(float* p, const float* g, float* m, float* v, int64_t n, const CpuAdamWStep& s, void* out16,
               CpuWorking working) {
  using namespace cpu_adamw_detail;
  if (n < 0) throw std::invalid_argument("cpu_adamw: n = " + std::to_string(n) + " < 0");
  if (s.step < 1) {
    throw std::invalid_argument("cpu_adamw: step = " + std::to_string(s.step) +
                                "; t counts from 1 and is advanced before the update");
  }
  if (n == 0) return;
  static const RangeFn range_fn = pick_range_fn();
  Coeffs c = coeffs_of(s);
  c.working = working == CpuWorking::bf16 ? 1 : working == CpuWorking::fp16 ? 2 : 0;
  if (c.working != 0 && out16 == nullptr) throw std::invalid_argument("cpu_adamw: a working copy needs out16");
  auto* out = static_cast<char*>(out16);

  // Threads take whole blocks of 16 floats, as LibTorch's kernel does: 64-byte cache lines when
  // the buffers are 64-byte aligned (LibTorch's allocations are), so no two threads write one
  // line. Below kGrain elements (LibTorch's at::internal::GRAIN_SIZE) one thread does it all: a
  // small segment is not worth waking the pool.
  constexpr int64_t kLine = 16, kGrain = 32768;
  const int64_t lines = (n + kLine - 1) / kLine;
  at::parallel_for(0, lines, kGrain / kLine, [&](int64_t begin, int64_t end) {
    const int64_t i = begin * kLine;
    const int64_t count = std::min(end * kLine, n) - i;
    range_fn(p + i, g + i, m + i, v + i, count, c, out ? out + i * 2 : nullptr);
  });
}

}  // namespace kiln
