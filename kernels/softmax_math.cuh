// kernels/softmax_math.cuh -- the online log-sum-exp (Milakov & Gimelshein, 2018) on the host and
// the device (kernels/hd.cuh): one pass over a row keeps its running maximum m and the sum s of
// exp(x - m); two partial (m, s) merge exactly. log-sum-exp = m + log s.
//   add x:      m' = max(m, x),  s' = s exp(m - m') + exp(x - m')
//   merge:      M = max(m1, m2), s = s1 exp(m1 - M) + s2 exp(m2 - M)
// -inf entries add nothing (exp(-inf) = 0, with no inf - inf); a NaN makes s NaN, and the loss.
#pragma once

#include <cmath>

#include "kernels/hd.cuh"

namespace kiln::kernels {

KILN_HD void online_lse_add(float& m, float& s, float x) {
  if (x == -INFINITY) return;
  if (x > m) {
    s = s * expf(m - x) + 1.0f;
    m = x;
  } else {
    s += expf(x - m);
  }
}

KILN_HD void online_lse_merge(float& m, float& s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) {
    m = m2;
    s = s2;
    return;
  }
  const float M = m > m2 ? m : m2;
  s = s * expf(m - M) + s2 * expf(m2 - M);
  m = M;
}

KILN_HD float online_lse_value(float m, float s) { return m + logf(s); }

}  // namespace kiln::kernels
