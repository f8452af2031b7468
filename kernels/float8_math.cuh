// kernels/float8_math.cuh -- the float8 quantisation's element math on the host and the device
// (kernels/hd.cuh; the kernels: kernels/float8.cu, the composite reference: kernels/float8.cpp).
//   amax = max |x|                  NaN-propagating, as torch.max: a non-finite input shows
//   s    = max(amax, 1e-12) / fmax  (computed by LibTorch's ops on both paths)
//   q    = cast_f8(clamp(x / s, -fmax, fmax))   round to nearest even; NaN stays NaN
// The amax is reduced on the bits of |x|: for non-negative floats the IEEE bit patterns order as
// unsigned integers do, and every NaN's (sign cleared) lies above +inf's, so an integer max over
// abs_bits is a max of |x| that returns NaN when one is present -- atomicMax on 32-bit words
// combines the blocks' results.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/hd.cuh"

namespace kiln::kernels {

KILN_HD uint32_t abs_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u & 0x7fffffffu;
}

KILN_HD float from_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

// x / s clamped to the format's range, NaN kept (at::clamp's semantics), before the cast.
KILN_HD float float8_prescaled(float x, float s, float fmax) {
  const float v = x / s;
  return v != v ? v : fminf(fmaxf(v, -fmax), fmax);
}

}  // namespace kiln::kernels
