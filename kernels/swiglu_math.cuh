// kernels/swiglu_math.cuh -- SwiGLU's element math on the host and the device (kernels/hd.cuh).
//   forward   y = silu(a) b,  silu(a) = a sigmoid(a)
//   backward  da = dy b sigmoid(a) (1 + a (1 - sigmoid(a))),   db = dy silu(a)
// in fp32 from the 16-bit inputs, each output rounded once (the composite path rounds silu(a)
// to the input dtype before the product: one rounding more).
#pragma once

#include <cmath>

#include "kernels/hd.cuh"

namespace kiln::kernels {

KILN_HD float sigmoidf(float a) { return 1.0f / (1.0f + expf(-a)); }

KILN_HD float swiglu_forward(float a, float b) { return a * sigmoidf(a) * b; }

KILN_HD void swiglu_backward(float a, float b, float dy, float& da, float& db) {
  const float s = sigmoidf(a);
  da = dy * b * s * (1.0f + a * (1.0f - s));
  db = dy * a * s;
}

}  // namespace kiln::kernels
