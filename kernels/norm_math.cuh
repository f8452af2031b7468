// kernels/norm_math.cuh -- the per-row math of LayerNorm and RMSNorm, forward and backward, on
// the host and the device (kernels/hd.cuh). The CUDA kernels (kernels/norm.cu) call it with a
// warp's 32 lanes each taking every 32nd column and a warp sum after each partial; the CPU test
// calls it with one lane (lane 0, step 1) and compares with at::layer_norm / at::rms_norm.
//
// For a row x [d] (or, with a residual row r, s = x + r rounded to x's dtype) with weight w [d]
// (and bias b [d] for LayerNorm), statistics in fp32:
//   LayerNorm  mean = (1/d) sum x_j     var = (1/d) sum (x_j - mean)^2   (two passes: no
//                                                                         cancellation)
//   RMSNorm    mean = 0                 var = (1/d) sum x_j^2
//   rstd = 1 / sqrt(var + eps),  xhat_j = (x_j - mean) rstd,  y_j = xhat_j w_j (+ b_j)
// Backward, with g_j = dy_j w_j:
//   dx_j = rstd (g_j - mean_k g_k - xhat_j mean_k(g_k xhat_k))      (RMSNorm: no mean_k g_k term)
//   dw_j = sum over rows of dy_j xhat_j,   db_j = sum over rows of dy_j  (kernels/norm.cu: a
//   column reduction in a fixed order, so the sums are deterministic)
// Everything is accumulated in fp32 and each output rounded once to its dtype.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/hd.cuh"

namespace kiln::kernels {

// The residual stream's sum before a norm, s = x + r, in fp32 rounded once to T (as the
// composite add rounds it); the norm then reads s (kernels/norm.h's add_norm).
template <typename T>
KILN_HD T residual_add(T x, T r) {
  return T(static_cast<float>(x) + static_cast<float>(r));
}

// Column j of the norm's input: x_j, or s_j = x_j + res_j when res is not null (recomputed at
// each pass rather than read back: the same rounding every time).
template <typename T>
KILN_HD T norm_input(const T* x, const T* res, int j) {
  return res ? residual_add(x[j], res[j]) : x[j];
}

// The lane's part of sum_j x_j (x: the norm's input, above), over columns j = lane, lane + step, ...
template <typename T>
KILN_HD float norm_partial_sum(const T* x, const T* res, int d, int lane, int step) {
  float s = 0.0f;
  for (int j = lane; j < d; j += step) s += static_cast<float>(norm_input(x, res, j));
  return s;
}

// The lane's part of sum_j (x_j - mean)^2.
template <typename T>
KILN_HD float norm_partial_sq(const T* x, const T* res, int d, int lane, int step, float mean) {
  float s = 0.0f;
  for (int j = lane; j < d; j += step) {
    const float v = static_cast<float>(norm_input(x, res, j)) - mean;
    s += v * v;
  }
  return s;
}

// rstd from the row's sum of squared deviations.
KILN_HD float norm_rstd(float sum_sq, int d, float eps) { return inv_sqrt(sum_sq / static_cast<float>(d) + eps); }

// y_j; b null for RMSNorm.
template <typename T, typename W>
KILN_HD T norm_forward_element(T x, float mean, float rstd, const W* w, const W* b, int j) {
  float y = (static_cast<float>(x) - mean) * rstd * static_cast<float>(w[j]);
  if (b) y += static_cast<float>(b[j]);
  return T(y);
}

// The lane's parts of sum_j g_j and sum_j g_j xhat_j (g = dy w) of one row.
template <typename T, typename W>
KILN_HD void norm_partial_backward(const T* x, const T* dy, const W* w, int d, int lane, int step, float mean,
                                   float rstd, float& sum_g, float& sum_gx) {
  float sg = 0.0f, sgx = 0.0f;
  for (int j = lane; j < d; j += step) {
    const float g = static_cast<float>(dy[j]) * static_cast<float>(w[j]);
    sg += g;
    sgx += g * (static_cast<float>(x[j]) - mean) * rstd;
  }
  sum_g = sg;
  sum_gx = sgx;
}

// dx_j from the row's sums, in fp32; rms drops the mean term.
template <typename T, typename W>
KILN_HD float norm_backward_value(T x, T dy, const W* w, int j, float mean, float rstd, float mean_g, float mean_gx,
                                  bool rms) {
  const float g = static_cast<float>(dy) * static_cast<float>(w[j]);
  const float xhat = (static_cast<float>(x) - mean) * rstd;
  return rstd * (g - (rms ? 0.0f : mean_g) - xhat * mean_gx);
}

// dx_j rounded to T.
template <typename T, typename W>
KILN_HD T norm_backward_element(T x, T dy, const W* w, int j, float mean, float rstd, float mean_g, float mean_gx,
                                bool rms) {
  return T(norm_backward_value<T, W>(x, dy, w, j, mean, rstd, mean_g, mean_gx, rms));
}

// Backward of s = x + r followed by the norm: ds_j = dx_j (the norm's) + dsum_j (the gradient s
// has from its other use, the residual stream), added in fp32 and rounded once.
template <typename T, typename W>
KILN_HD T add_norm_backward_element(T x, T dy, T dsum, const W* w, int j, float mean, float rstd, float mean_g,
                                    float mean_gx, bool rms) {
  return T(norm_backward_value<T, W>(x, dy, w, j, mean, rstd, mean_g, mean_gx, rms) + static_cast<float>(dsum));
}

}  // namespace kiln::kernels
