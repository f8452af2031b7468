// kernels/adamw_math.cuh -- one AdamW element on the host and the device (kernels/hd.cuh), the
// math of LibTorch's fused kernel (ATen/native/cuda/fused_adam_utils.cuh, ADAMW mode) written
// out in fp32 with its own fused multiply-adds, so the fused step and the reference agree to the
// last bit or so:
//   g  = grad c                          (c: the clip factor / loss scale; 1 when absent)
//   p -= lr wd p                         (decoupled weight decay; wd 0 for the no-decay group)
//   m  = b1 m + (1 - b1) g               as fma(b1, m, fma(-b1, g, g))
//   v  = b2 v + (1 - b2) g^2             as fma(b2, v, fma(-b2, g^2, g^2))
//   p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// t: the step count, already advanced by the caller (as _fused_adamw_ expects).
#pragma once

#include <cmath>

#include "kernels/hd.cuh"

namespace kiln::kernels {

struct AdamWScalars {
  float lr, beta1, beta2, weight_decay, eps;
  float bias_correction1, bias_correction2_sqrt;  // 1 - b1^t, sqrt(1 - b2^t)
};

KILN_HD AdamWScalars adamw_scalars(float lr, float beta1, float beta2, float weight_decay, float eps, float step) {
  AdamWScalars s{lr, beta1, beta2, weight_decay, eps, 0.0f, 0.0f};
  s.bias_correction1 = 1.0f - powf(beta1, step);
  s.bias_correction2_sqrt = sqrtf(1.0f - powf(beta2, step));
  return s;
}

KILN_HD void adamw_element(float& param, float grad, float& exp_avg, float& exp_avg_sq, const AdamWScalars& s) {
  if (s.weight_decay != 0.0f) param -= s.lr * s.weight_decay * param;
  exp_avg = fmaf(s.beta1, exp_avg, fmaf(-s.beta1, grad, grad));
  exp_avg_sq = fmaf(s.beta2, exp_avg_sq, fmaf(-s.beta2, grad * grad, grad * grad));
  const float step_size = s.lr / s.bias_correction1;
  const float denom = sqrtf(exp_avg_sq) / s.bias_correction2_sqrt + s.eps;
  param -= step_size * exp_avg / denom;
}

}  // namespace kiln::kernels
