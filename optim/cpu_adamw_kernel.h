// optim/cpu_adamw_kernel.h -- the elementwise AdamW loop behind kiln::cpu_adamw, written once
// and compiled once per instruction set.
//
// Included by exactly two files: optim/cpu_adamw.cpp (the build's baseline ISA, where
// at::vec::Vectorized<float> is LibTorch's portable 8-lane array) and optim/cpu_adamw_avx2.cpp
// (compiled with -mavx2 -mfma -DCPU_CAPABILITY=AVX2, where it is one __m256 register). The loop
// has internal linkage, so each object file keeps its own copy and the linker never picks the
// AVX2 one for a baseline caller. Not a public header.
//
// The math is LibTorch's adam_math<float, float, ADAM_MODE::ADAMW> (FusedAdamKernel.cpp),
// vector path, with the same operations in the same order:
//   p = p * decay                                     (only when the step's wd != 0)
//   m = fmadd(coeff, g - m, base)                     lerp(m, g, w), w = 1 - b1:
//        |w| < 0.5: coeff = w,     base = m            m + w (g - m)
//        else:      coeff = w - 1, base = g            g - (1 - w) (g - m)
//   v = fmadd((1 - b2) * g, g, v * b2)
//   p = p + ((-step_size) * m) / (sqrt(v) / sqrt(bias_correction2) + eps)
// LibTorch writes v's line as v * b2 + (1 - b2) * g * g; its compiler (GCC, -ffp-contract=fast)
// fuses the last multiply into the add, so the FMA is written out here and the build pins
// -ffp-contract=off: the rounding is this file's, not the compiler's choice.
// With Coeffs::scale_grad the gradient is first multiplied by grad_scale (g * s, one fp32 product,
// as at::Tensor::mul_ computes it); with `out16` the updated p is also written rounded to bf16 or
// fp16 (LibTorch's at::vec::convert, block by block: the conversion copy_ into a 16-bit tensor runs).
// The last n % 8 elements go through the same vector code with a partial load and store (the
// unused lanes hold zeros and are never written back), so no element takes a scalar path.
#pragma once

#include <algorithm>
#include <cstdint>

#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

namespace kiln::cpu_adamw_detail {

// The update's scalars, each computed in double as LibTorch does and rounded to float once.
struct Coeffs {
  bool apply_decay;             // weight_decay != 0
  float decay;                  // 1 - lr wd
  float lerp_weight;            // 1 - b1
  float beta2;                  // b2
  float one_minus_beta2;        // 1 - b2
  float bias_correction2_sqrt;  // sqrt(1 - b2^t)
  float eps;                    // eps
  float neg_step_size;          // -lr / (1 - b1^t)
  bool scale_grad = false;      // grad_scale != 1
  float grad_scale = 1.0f;      // the gradient's factor, rounded to float once
  int working = 0;              // out16's kind: 0 none, 1 bf16, 2 fp16 (optim/cpu_adamw.h's CpuWorking)
};

namespace {

// Elements [0, n) of the four arrays; n need not be a multiple of the vector width.
inline void adamw_range(float* p, const float* g, float* m, float* v, int64_t n, const Coeffs& c, void* out16) {
  using Vec = at::vec::Vectorized<float>;
  const Vec decay(c.decay), beta2(c.beta2), one_minus_beta2(c.one_minus_beta2);
  const Vec bc2_sqrt(c.bias_correction2_sqrt), eps(c.eps), neg_step_size(c.neg_step_size);
  const Vec weight(c.lerp_weight);
  const Vec small = weight.abs() < Vec(0.5f);  // all lanes true or all false
  const Vec coeff = Vec::blendv(weight - Vec(1.0f), weight, small);
  const bool apply_decay = c.apply_decay, scale_grad = c.scale_grad;
  const Vec grad_scale(c.grad_scale);
  const int working = out16 ? c.working : 0;

  auto update = [&](int64_t i, int64_t count) {
    Vec pv = Vec::loadu(p + i, count);
    Vec gv = Vec::loadu(g + i, count);
    if (scale_grad) gv = gv * grad_scale;
    Vec mv = Vec::loadu(m + i, count);
    Vec vv = Vec::loadu(v + i, count);
    if (apply_decay) pv = pv * decay;
    mv = at::vec::fmadd(coeff, gv - mv, Vec::blendv(gv, mv, small));
    vv = at::vec::fmadd(one_minus_beta2 * gv, gv, vv * beta2);
    const Vec denom = vv.sqrt() / bc2_sqrt + eps;
    pv = pv + neg_step_size * mv / denom;
    mv.store(m + i, count);
    vv.store(v + i, count);
    pv.store(p + i, count);
  };
  // The 16-bit copy of a block of p just written (still in L1), by LibTorch's own conversion
  // (at::vec::convert: what copy_ into a bf16 / fp16 tensor runs), in blocks of kBlock elements.
  auto round16 = [&](int64_t i, int64_t count) {
    if (working == 1) at::vec::convert(p + i, static_cast<c10::BFloat16*>(out16) + i, count);
    else if (working == 2) at::vec::convert(p + i, static_cast<c10::Half*>(out16) + i, count);
  };

  constexpr int64_t W = Vec::size(), kBlock = 64 * W;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t end = std::min(n, b + kBlock);
    int64_t i = b;
    for (; i + W <= end; i += W) update(i, W);
    if (i < end) update(i, end - i);
    if (working != 0) round16(b, end - b);
  }
}

}  // namespace
}  // namespace kiln::cpu_adamw_detail
