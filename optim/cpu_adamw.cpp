// optim/cpu_adamw.cpp -- the update loop (a plain loop the compiler vectorises).
#include "optim/cpu_adamw.h"

#include <cmath>

#include <ATen/Parallel.h>

namespace kiln {

void cpu_adamw(float* p, const float* g, float* m, float* v, int64_t n, const CpuAdamWStep& s) {
  const double bc1 = 1.0 - std::pow(s.beta1, static_cast<double>(s.step));
  const double bc2 = 1.0 - std::pow(s.beta2, static_cast<double>(s.step));
  const float step_size = static_cast<float>(s.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = static_cast<float>(1.0 - s.lr * s.weight_decay);
  const float b1 = static_cast<float>(s.beta1), b2 = static_cast<float>(s.beta2);
  const float one_minus_b1 = static_cast<float>(1.0 - s.beta1), one_minus_b2 = static_cast<float>(1.0 - s.beta2);
  const float eps = static_cast<float>(s.eps);
  at::parallel_for(0, n, 1 << 15, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float gi = g[i];
      float pi = p[i] * decay;
      const float mi = m[i] + one_minus_b1 * (gi - m[i]);
      const float vi = b2 * v[i] + one_minus_b2 * gi * gi;
      pi -= step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
      p[i] = pi;
      m[i] = mi;
      v[i] = vi;
    }
  });
  (void)b1;
}

}  // namespace kiln
