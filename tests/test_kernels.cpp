// tests/test_kernels.cpp -- kiln's kernels on the CPU: each kernel's per-row math (the
// host-and-device functions of kernels/*_math.cuh, the very code the CUDA kernels run) against
// ATen in fp64, and each entry's composite path, which is what the CPU runs whatever --kernels
// says. The fused kernels themselves run in tests/test_kernels_gpu.cpp (gpu.kernels).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

#include "distributed/error.h"
#include "kernels/adamw.h"
#include "kernels/adamw_math.cuh"
#include "kernels/classifier.h"
#include "kernels/gelu_mlp.h"
#include "kernels/kernel_choice.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/norm_math.cuh"
#include "kernels/rope.h"
#include "kernels/rope_math.cuh"
#include "kernels/softmax_math.cuh"
#include "kernels/swiglu.h"
#include "kernels/swiglu_math.cuh"
#include "models/gpt.h"
#include "optim/adamw.h"

namespace kk = kiln::kernels;

namespace {

// One unit in the last place of `dtype` at magnitude |v| (the bound of a single rounding is half
// of it; a value computed twice in fp32 by different orders and rounded once each may land one
// ulp apart).
double ulp(at::ScalarType dtype, double v) {
  const int mantissa = dtype == at::kBFloat16 ? 7 : dtype == at::kHalf ? 10 : 23;
  const double a = std::max(std::fabs(v), 1e-30);
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(a))) - mantissa);
}

// Rows run through the per-row functions with one lane (lane 0, step 1): the CPU's twin of a
// warp's lanes. T the activations' type, W the weight's.
template <typename T, typename W>
void run_norm_rows(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor& dy, float eps,
                   bool rms, at::Tensor& y, at::Tensor& dx, at::Tensor& mean, at::Tensor& rstd) {
  const int64_t rows = x.size(0);
  const int d = static_cast<int>(x.size(1));
  y = at::empty_like(x);
  dx = at::empty_like(x);
  mean = at::empty({rows}, at::kFloat);
  rstd = at::empty({rows}, at::kFloat);
  const T* xp = x.data_ptr<T>();
  const T* dyp = dy.data_ptr<T>();
  const W* wp = w.data_ptr<W>();
  const W* bp = b.defined() ? b.data_ptr<W>() : nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = xp + r * d;
    const T* none = nullptr;  // no residual
    const float m = rms ? 0.0f : kk::norm_partial_sum(xr, none, d, 0, 1) / static_cast<float>(d);
    const float s = kk::norm_rstd(kk::norm_partial_sq(xr, none, d, 0, 1, m), d, eps);
    mean.data_ptr<float>()[r] = m;
    rstd.data_ptr<float>()[r] = s;
    for (int j = 0; j < d; ++j) y.data_ptr<T>()[r * d + j] = kk::norm_forward_element<T, W>(xr[j], m, s, wp, bp, j);
    float sg, sgx;
    kk::norm_partial_backward(xr, dyp + r * d, wp, d, 0, 1, m, s, sg, sgx);
    for (int j = 0; j < d; ++j) {
      dx.data_ptr<T>()[r * d + j] = kk::norm_backward_element<T, W>(xr[j], dyp[r * d + j], wp, j, m, s,
                                                                     sg / static_cast<float>(d), sgx / static_cast<float>(d), rms);
    }
  }
}

// Every element of `got` within k ulps of `want` (fp64) in got's dtype, plus `slack` (a number,
// or a tensor of want's shape: each element's own) for fp32 sums taken in another order.
void expect_close(const at::Tensor& got, const at::Tensor& want, double k_ulps, const at::Tensor& slack,
                  const std::string& what) {
  const at::Tensor g = got.to(at::kDouble).contiguous().view(-1), w = want.to(at::kDouble).contiguous().view(-1);
  const at::Tensor sl = slack.to(at::kDouble).expand_as(want).contiguous().view(-1);
  int bad = 0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double a = g[i].item<double>(), e = w[i].item<double>();
    const double bound = k_ulps * ulp(got.scalar_type(), e) + sl[i].item<double>();
    if (!(std::fabs(a - e) <= bound) && bad++ < 5) ADD_FAILURE() << what << " [" << i << "]: " << a << " vs " << e << " (bound " << bound << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << g.numel() << " elements outside the bound";
}

void expect_close(const at::Tensor& got, const at::Tensor& want, double k_ulps, double slack, const std::string& what) {
  expect_close(got, want, k_ulps, at::scalar_tensor(slack * want.abs().max().item<double>(), at::kDouble), what);
}

// A two-block model of width 16 (GPT-2's shape; the tests change the fields they need).
kiln::GPTConfig tiny_gpt() {
  kiln::GPTConfig cfg;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_kv_head = 2;
  cfg.d_model = 16;
  cfg.seq_len = 8;
  cfg.vocab_size = 50;
  return cfg;
}

// The loss of one fixed batch, then every parameter's gradient.
std::vector<at::Tensor> loss_and_grads(kiln::GPT& m) {
  at::manual_seed(2);
  const at::Tensor idx = at::randint(0, 50, {2, 8}, at::kLong), tgt = at::randint(0, 50, {2, 8}, at::kLong);
  at::Tensor loss = m.loss(idx, tgt);
  loss.backward();
  std::vector<at::Tensor> out{loss.detach()};
  for (const auto& p : m.parameters()) out.push_back(p.grad().clone());
  return out;
}

}  // namespace

TEST(KernelChoice, ParsesAndResolves) {
  EXPECT_EQ(kiln::parse_kernels("fused"), kiln::Kernels::fused);
  EXPECT_EQ(kiln::parse_kernels("reference"), kiln::Kernels::reference);
  try {
    kiln::parse_kernels("fast");
    FAIL() << "no error";
  } catch (const kiln::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--kernels must be fused or reference (got 'fast')"), std::string::npos) << e.what();
  }
  // The CPU always runs the composite ops; CUDA the kernels when they were compiled.
  EXPECT_EQ(kiln::kernels_on(kiln::Kernels::fused, false), kiln::Kernels::reference);
  EXPECT_EQ(kiln::kernels_on(kiln::Kernels::reference, true), kiln::Kernels::reference);
  EXPECT_EQ(kiln::kernels_on(kiln::Kernels::fused, true),
            kiln::fused_kernels_built() ? kiln::Kernels::fused : kiln::Kernels::reference);
#ifdef KILN_WITH_CUDA
  EXPECT_TRUE(kiln::fused_kernels_built()) << "a CUDA build compiles kiln's kernels (CMakeLists.txt, KILN_KERNELS)";
#endif
}

// The norms' row math (kernels/norm_math.cuh) against LayerNorm / RMSNorm in fp64 from the same
// (rounded) inputs. y and dx: one rounding to their dtype (1 ulp; 8 fp32 ulps for fp32 outputs)
// plus the fp32 error of the row's sums, bounded as recursive summation's: (d + 16) u of the
// terms' scale (u = 2^-24; for dx the terms are rstd g_j, the mean of g and xhat_j mean(g xhat):
// with d = 1 RMSNorm's dx is a cancellation 1 - xhat^2 of order eps / x^2, so only the terms'
// scale bounds it). mean: (d + 16) u of mean |x|; rstd: (d + 16) u relative.
TEST(KernelMath, NormRowsMatchATen) {
  at::manual_seed(7);
  const double u = std::ldexp(1.0, -24);
  for (bool rms : {false, true}) {
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      for (int d : {1, 5, 67, 768}) {
        const int64_t rows = 9;
        const float eps = 1e-5f;
        at::Tensor x = (at::randn({rows, d}) * 3 + 1).to(dtype), dy = at::randn({rows, d}).to(dtype);
        at::Tensor w = (at::randn({d}) * 0.5 + 1).to(dtype), b = rms ? at::Tensor() : at::randn({d}).to(dtype);
        at::Tensor y, dx, mean, rstd;
        if (dtype == at::kFloat) run_norm_rows<float, float>(x, w, b, dy, eps, rms, y, dx, mean, rstd);
        else run_norm_rows<at::BFloat16, at::BFloat16>(x, w, b, dy, eps, rms, y, dx, mean, rstd);

        at::Tensor x64 = x.to(at::kDouble).requires_grad_(true);
        at::Tensor y64 = rms ? at::rms_norm(x64, {d}, w.to(at::kDouble), eps)
                             : at::layer_norm(x64, {d}, w.to(at::kDouble), b.to(at::kDouble), eps);
        y64.backward(dy.to(at::kDouble));
        const std::string what = std::string(rms ? "rms" : "layer") + " norm " + c10::toString(dtype) + " d " + std::to_string(d);
        const double k = dtype == at::kFloat ? 8.0 : 1.0;
        const double sum_err = (d + 16) * u;
        const at::Tensor xd = x.to(at::kDouble);
        const at::Tensor m64 = rms ? at::zeros({rows}, at::kDouble) : xd.mean(1);
        const at::Tensor v64 = rms ? xd.pow(2).mean(1) : xd.var(1, /*unbiased=*/false);
        const at::Tensor r64 = (v64 + eps).rsqrt();
        const at::Tensor g64 = dy.to(at::kDouble) * w.to(at::kDouble);
        const at::Tensor xhat = (xd - m64.unsqueeze(1)) * r64.unsqueeze(1);
        const at::Tensor dx_terms =
            r64 * std::get<0>(g64.abs().max(1)) * (1 + std::get<0>(xhat.abs().max(1)).pow(2));  // [rows]
        expect_close(y, y64.detach(), k, sum_err * y64.detach().abs().max().item<double>() *
                                             at::ones({1}, at::kDouble), what + " y");
        expect_close(dx, x64.grad(), k, sum_err * dx_terms.unsqueeze(1), what + " dx");
        expect_close(mean, m64, 8.0, sum_err * xd.abs().mean(1), what + " mean");
        expect_close(rstd, r64, 8.0, sum_err * r64, what + " rstd");
      }
    }
  }
}

// The residual add before a norm (kernels/norm_math.cuh): s = x + r rounded once, bit for bit
// ATen's 16-bit add (what the composite path stores); the statistics the kernel takes over (x, r)
// those of the stored s, bit for bit; the backward's dx + dsum added in fp32 and
// rounded once, against fp64 within the bound NormRowsMatchATen gives dx plus the one rounding.
TEST(KernelMath, AddNormElements) {
  at::manual_seed(8);
  const double u = std::ldexp(1.0, -24);
  for (int d : {5, 67, 768}) {
    const int64_t rows = 7;
    const float eps = 1e-5f;
    const at::Tensor x = (at::randn({rows, d}) * 3).to(at::kBFloat16), r = at::randn({rows, d}).to(at::kBFloat16);
    at::Tensor s = at::empty_like(x);
    for (int64_t i = 0; i < x.numel(); ++i)
      s.data_ptr<at::BFloat16>()[i] = kk::residual_add(x.data_ptr<at::BFloat16>()[i], r.data_ptr<at::BFloat16>()[i]);
    EXPECT_TRUE(at::equal(s, x + r)) << "d " << d;
    const at::Tensor w = (at::randn({d}) * 0.5 + 1).to(at::kBFloat16), dy = at::randn({rows, d}).to(at::kBFloat16);
    const at::Tensor dsum = at::randn({rows, d}).to(at::kBFloat16);
    at::Tensor dx = at::empty_like(x);
    const auto* sp = s.data_ptr<at::BFloat16>();
    const auto* wp = w.data_ptr<at::BFloat16>();
    for (int64_t row = 0; row < rows; ++row) {
      const at::BFloat16* sr = sp + row * d;
      const at::BFloat16 *xr = x.data_ptr<at::BFloat16>() + row * d, *rr = r.data_ptr<at::BFloat16>() + row * d;
      const at::BFloat16* none = nullptr;
      // The kernel's statistics over (x, r), recomputing s at each pass: those of the stored s, bit for bit.
      const float m = kk::norm_partial_sum(xr, rr, d, 0, 1) / static_cast<float>(d);
      const float rs = kk::norm_rstd(kk::norm_partial_sq(xr, rr, d, 0, 1, m), d, eps);
      EXPECT_EQ(m, kk::norm_partial_sum(sr, none, d, 0, 1) / static_cast<float>(d)) << "d " << d;
      EXPECT_EQ(rs, kk::norm_rstd(kk::norm_partial_sq(sr, none, d, 0, 1, m), d, eps)) << "d " << d;
      float sg, sgx;
      kk::norm_partial_backward(sr, dy.data_ptr<at::BFloat16>() + row * d, wp, d, 0, 1, m, rs, sg, sgx);
      for (int j = 0; j < d; ++j) {
        dx.data_ptr<at::BFloat16>()[row * d + j] = kk::add_norm_backward_element<at::BFloat16, at::BFloat16>(
            sr[j], dy.data_ptr<at::BFloat16>()[row * d + j], dsum.data_ptr<at::BFloat16>()[row * d + j], wp, j, m, rs,
            sg / static_cast<float>(d), sgx / static_cast<float>(d), false);
      }
    }
    at::Tensor s64 = s.to(at::kDouble).requires_grad_(true);
    at::layer_norm(s64, {d}, w.to(at::kDouble), {}, eps).backward(dy.to(at::kDouble));
    const at::Tensor want = s64.grad() + dsum.to(at::kDouble);
    const at::Tensor sd = s.to(at::kDouble);
    const at::Tensor r64 = (sd.var(1, false) + eps).rsqrt();
    const at::Tensor xhat = (sd - sd.mean(1, true)) * r64.unsqueeze(1);
    const at::Tensor g64 = dy.to(at::kDouble) * w.to(at::kDouble);
    const at::Tensor dx_terms = r64 * std::get<0>(g64.abs().max(1)) * (1 + std::get<0>(xhat.abs().max(1)).pow(2));
    expect_close(dx, want, 1.0, (d + 16) * u * dx_terms.unsqueeze(1), "add-norm dx + dsum d " + std::to_string(d));
  }
}

// The online log-sum-exp (kernels/softmax_math.cuh): a row added in one pass, and the same row
// in three parts merged, against logsumexp in fp64; -inf entries count for nothing.
TEST(KernelMath, OnlineLogSumExp) {
  at::manual_seed(3);
  for (int n : {1, 2, 31, 50257}) {
    at::Tensor z = at::randn({n}) * 8;
    if (n > 2) z[1] = -std::numeric_limits<float>::infinity();
    const float* p = z.data_ptr<float>();
    float m = -INFINITY, s = 0.0f;
    for (int j = 0; j < n; ++j) kk::online_lse_add(m, s, p[j]);
    const double want = at::logsumexp(z.to(at::kDouble), 0).item<double>();
    EXPECT_NEAR(kk::online_lse_value(m, s), want, 1e-5 * std::max(1.0, std::fabs(want))) << n;
    float m1 = -INFINITY, s1 = 0.0f, m2 = -INFINITY, s2 = 0.0f, m3 = -INFINITY, s3 = 0.0f;
    for (int j = 0; j < n; ++j) {
      if (j % 3 == 0) kk::online_lse_add(m1, s1, p[j]);
      else if (j % 3 == 1) kk::online_lse_add(m2, s2, p[j]);
      else kk::online_lse_add(m3, s3, p[j]);
    }
    kk::online_lse_merge(m1, s1, m2, s2);
    kk::online_lse_merge(m1, s1, m3, s3);
    EXPECT_NEAR(kk::online_lse_value(m1, s1), want, 1e-5 * std::max(1.0, std::fabs(want))) << n << " merged";
  }
  float m = -INFINITY, s = 0.0f;  // a NaN poisons the row (the non-finite guard then names the step)
  kk::online_lse_add(m, s, 1.0f);
  kk::online_lse_add(m, s, std::nanf(""));
  EXPECT_TRUE(std::isnan(kk::online_lse_value(m, s)));
}

// SwiGLU's element math (kernels/swiglu_math.cuh) against silu(a) * b and its gradients in fp64.
TEST(KernelMath, SwiGLUElements) {
  at::manual_seed(5);
  const at::Tensor a = at::randn({4096}) * 4, b = at::randn({4096}), dy = at::randn({4096});
  at::Tensor a64 = a.to(at::kDouble).requires_grad_(true), b64 = b.to(at::kDouble).requires_grad_(true);
  const at::Tensor y64 = at::silu(a64) * b64;
  y64.backward(dy.to(at::kDouble));
  at::Tensor y = at::empty_like(a), da = at::empty_like(a), db = at::empty_like(a);
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float ai = a.data_ptr<float>()[i], bi = b.data_ptr<float>()[i];
    y.data_ptr<float>()[i] = kk::swiglu_forward(ai, bi);
    kk::swiglu_backward(ai, bi, dy.data_ptr<float>()[i], da.data_ptr<float>()[i], db.data_ptr<float>()[i]);
  }
  expect_close(y, y64.detach(), 16.0, 1e-7, "swiglu y");
  expect_close(da, a64.grad(), 16.0, 1e-7, "swiglu da");
  expect_close(db, b64.grad(), 16.0, 1e-7, "swiglu db");
}

// The rotary turn (kernels/rope_math.cuh), forward and (turned by -angle) backward, against the
// composite rule and its autograd gradient in fp64, at given positions: fp32 to 4 ulps (two
// products and a sum).
TEST(KernelMath, RopePairs) {
  at::manual_seed(9);
  const int64_t B = 2, H = 3, T = 5, h = 8, rows = 11;
  const at::Tensor angles = at::rand({rows, h / 2}, at::kDouble) * 6;
  const at::Tensor cos = at::cat({angles.cos(), angles.cos()}, -1), sin = at::cat({angles.sin(), angles.sin()}, -1);
  const at::Tensor pos = at::tensor(std::vector<int64_t>{3, 0, 10, 7, 7});
  const at::Tensor x = at::randn({B, H, T, h}), dy = at::randn({B, H, T, h});
  at::Tensor x64 = x.to(at::kDouble).requires_grad_(true);
  const at::Tensor y64 = kiln::rope(x64, x64, cos, sin, pos, kiln::Kernels::reference).first;
  y64.backward(dy.to(at::kDouble));
  const at::Tensor c32 = cos.to(at::kFloat), s32 = sin.to(at::kFloat);
  at::Tensor y = at::empty_like(x), dx = at::empty_like(x);
  const auto X = x.accessor<float, 4>(), DY = dy.accessor<float, 4>();
  auto Y = y.accessor<float, 4>(), DX = dx.accessor<float, 4>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t k = 0; k < H; ++k)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < h / 2; ++j) {
          const int64_t p = pos[t].item<int64_t>();
          const float c = c32[p][j].item<float>(), sn = s32[p][j].item<float>();
          kk::rope_turn(X[b][k][t][j], X[b][k][t][j + h / 2], c, sn, Y[b][k][t][j], Y[b][k][t][j + h / 2]);
          kk::rope_turn(DY[b][k][t][j], DY[b][k][t][j + h / 2], c, -sn, DX[b][k][t][j], DX[b][k][t][j + h / 2]);
        }
  // The tables rounded to fp32 as the kernel reads them: the fp64 rule with those tables.
  at::Tensor x64b = x.to(at::kDouble).requires_grad_(true);
  const at::Tensor yb = kiln::rope(x64b, x64b, c32.to(at::kDouble), s32.to(at::kDouble), pos, kiln::Kernels::reference).first;
  yb.backward(dy.to(at::kDouble));
  expect_close(y, yb.detach(), 4.0, 1e-7, "rope y");
  expect_close(dx, x64b.grad(), 4.0, 1e-7, "rope dx");
  EXPECT_LT((y64.detach() - yb.detach()).abs().max().item<double>(), 1e-6);  // the tables' rounding alone
}

// AdamW's element math (kernels/adamw_math.cuh) and the entry's reference path (LibTorch's CPU
// _fused_adamw_ after the clip multiply) against the rule in fp64 from the same fp32 inputs and
// fp32-rounded hyperparameters, over gradients from 1e-6 to 10, steps 1, 7 and 1000, with and
// without weight decay. Bounds: the new p, m and v each rounded once more than fp64 and their
// products and sums in fp32: 2 ulps of the value plus 32 u (u = 2^-24) of the terms' scale --
// for p, |p| lr wd and the update's size (lr / bc1) |m| / denom; for m and v, the two terms.
TEST(KernelMath, AdamWElements) {
  at::manual_seed(17);
  const int64_t n = 3000;
  const float lr = 6e-4f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, c = 0.37f;
  const double u = std::ldexp(1.0, -24);
  for (const float wd : {0.0f, 0.1f})
    for (const float t : {1.0f, 7.0f, 1000.0f}) {
      const at::Tensor p0 = at::randn({n}), m0 = at::randn({n}) * 0.05, v0 = at::rand({n}) * 0.01;
      const at::Tensor g0 = at::randn({n}) * at::pow(10.0, at::randint(-6, 2, {n}).to(at::kFloat));
      // The math, element by element, from the clipped gradient float(g c).
      at::Tensor p = p0.clone(), m = m0.clone(), v = v0.clone();
      const kk::AdamWScalars sc = kk::adamw_scalars(lr, b1, b2, wd, eps, t);
      auto P = p.accessor<float, 1>(), M = m.accessor<float, 1>(), V = v.accessor<float, 1>();
      auto G = g0.accessor<float, 1>();
      for (int64_t i = 0; i < n; ++i) kk::adamw_element(P[i], G[i] * c, M[i], V[i], sc);
      // The entry's reference path (what the CPU runs), the clip factor as a 0-dim tensor.
      kiln::AdamWGroup grp{{p0.clone()}, {g0.clone()}, {m0.clone()}, {v0.clone()}, {at::full({}, t)}, {}};
      kiln::adamw_update(grp, {lr, b1, b2, wd, eps}, at::full({}, c), at::Tensor(), kiln::Kernels::fused);
      // fp64 from the same inputs (the clipped gradient as both paths round it).
      const auto d = [](const at::Tensor& x) { return x.to(at::kDouble); };
      const at::Tensor g = d(g0 * c), L = at::full({}, static_cast<double>(lr), at::kDouble);
      const double B1 = b1, B2 = b2, E = eps, W = wd, T = t;
      const at::Tensor pd = d(p0) - L * W * d(p0);
      const at::Tensor m64 = B1 * d(m0) + (1 - B1) * g, v64 = B2 * d(v0) + (1 - B2) * g * g;
      const double bc1 = 1 - std::pow(B1, T), bc2s = std::sqrt(1 - std::pow(B2, T));
      const at::Tensor upd = (L / bc1) * m64 / (v64.sqrt() / bc2s + E);
      const at::Tensor p64 = pd - upd;
      const at::Tensor p_slack = 32 * u * (d(p0).abs() * L * W + upd.abs());
      const at::Tensor m_slack = 32 * u * (B1 * d(m0).abs() + (1 - B1) * g.abs());
      const at::Tensor v_slack = 32 * u * (B2 * d(v0) + (1 - B2) * g * g);
      const std::string at_ = " (wd " + std::to_string(wd) + ", t " + std::to_string(t) + ")";
      expect_close(p, p64, 2.0, p_slack, "math p" + at_);
      expect_close(m, m64, 2.0, m_slack, "math m" + at_);
      expect_close(v, v64, 2.0, v_slack, "math v" + at_);
      expect_close(grp.params[0], p64, 2.0, p_slack, "reference p" + at_);
      expect_close(grp.exp_avg[0], m64, 2.0, m_slack, "reference m" + at_);
      expect_close(grp.exp_avg_sq[0], v64, 2.0, v_slack, "reference v" + at_);
    }
}

// The entry's reference path: the gradients left holding c g, the 16-bit working copies the new
// masters rounded to nearest even, and found_inf = 1 moving nothing; AdamW::step with a factor
// is the clip multiply then the step, bit for bit.
TEST(KernelEntries, AdamWUpdateReference) {
  at::manual_seed(19);
  auto group = [](int64_t n, at::ScalarType working) {
    kiln::AdamWGroup g;
    for (int64_t k : {n, n / 3 + 1}) {
      g.params.push_back(at::randn({k}));
      g.grads.push_back(at::randn({k}));
      g.exp_avg.push_back(at::zeros({k}));
      g.exp_avg_sq.push_back(at::zeros({k}));
      g.steps.push_back(at::ones({}));
      g.working.push_back(g.params.back().to(working));
    }
    return g;
  };
  for (const auto wt : {at::kBFloat16, at::kHalf}) {
    kiln::AdamWGroup g = group(100, wt);
    const std::vector<at::Tensor> grads0 = {g.grads[0].clone(), g.grads[1].clone()};
    const at::Tensor c = at::full({}, 0.5f);
    kiln::adamw_update(g, {1e-3, 0.9, 0.95, 0.1, 1e-8}, c, at::zeros({}), kiln::Kernels::fused);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_TRUE(at::equal(g.grads[i], grads0[i] * c));
      EXPECT_TRUE(at::equal(g.working[i], g.params[i].to(wt)));
      EXPECT_GT(g.exp_avg[i].abs().max().item<float>(), 0.0f);
    }
    const std::vector<at::Tensor> before = {g.params[0].clone(), g.exp_avg[0].clone(), g.exp_avg_sq[0].clone(), g.working[0].clone()};
    kiln::adamw_update(g, {1e-3, 0.9, 0.95, 0.1, 1e-8}, c, at::ones({}), kiln::Kernels::fused);
    EXPECT_TRUE(at::equal(g.params[0], before[0]));
    EXPECT_TRUE(at::equal(g.exp_avg[0], before[1]));
    EXPECT_TRUE(at::equal(g.exp_avg_sq[0], before[2]));
    EXPECT_TRUE(at::equal(g.working[0], before[3]));
  }
  // The rate read from a device tensor (a CUDA graph's update): the same update as the number,
  // which is then ignored (2^-10: exact in fp32, so no rounding of the rate enters the comparison).
  for (const auto wt : {at::kBFloat16, at::kHalf}) {
    at::manual_seed(29);
    kiln::AdamWGroup a = group(50, wt);
    at::manual_seed(29);
    kiln::AdamWGroup b = group(50, wt);
    const at::Tensor c = at::full({}, 0.5f);
    kiln::adamw_update(a, {0.0009765625, 0.9, 0.95, 0.1, 1e-8}, c, at::zeros({}), kiln::Kernels::fused);
    kiln::adamw_update(b, {999.0, 0.9, 0.95, 0.1, 1e-8}, c, at::zeros({}), kiln::Kernels::fused, at::full({}, 0.0009765625f));
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_TRUE(at::equal(a.params[i], b.params[i]));
      EXPECT_TRUE(at::equal(a.exp_avg_sq[i], b.exp_avg_sq[i]));
      EXPECT_TRUE(at::equal(a.working[i], b.working[i]));
    }
  }
  kiln::AdamWGroup bad = group(10, at::kBFloat16);
  bad.steps.pop_back();
  EXPECT_THROW(kiln::adamw_update(bad, {1e-3, 0.9, 0.95, 0.1, 1e-8}, at::Tensor(), at::Tensor(), kiln::Kernels::fused),
               std::invalid_argument);
  // AdamW::step(lr, found_inf, factor) == the gradients times factor, then step(lr, found_inf).
  auto make = [](at::Tensor& w, at::Tensor& b) {
    at::manual_seed(23);
    w = at::randn({8, 6});
    b = at::randn({6});
  };
  at::Tensor w1, b1, w2, b2;
  make(w1, b1);
  make(w2, b2);
  kiln::AdamW o1({w1, b1}, kiln::AdamWConfig{}, at::kBFloat16), o2({w2, b2}, kiln::AdamWConfig{}, at::kBFloat16);
  o1.set_kernels(kiln::Kernels::fused);
  for (int s = 0; s < 3; ++s) {
    const at::Tensor gw = at::randn({8, 6}), gb = at::randn({6}), f = at::full({}, 0.25f + 0.1f * s);
    o1.grad_target(w1).mutable_grad() = gw.clone();
    o1.grad_target(b1).mutable_grad() = gb.clone();
    o2.grad_target(w2).mutable_grad() = gw * f;
    o2.grad_target(b2).mutable_grad() = gb * f;
    o1.step(1e-2, at::zeros({}), f);
    o2.step(1e-2, at::zeros({}));
  }
  EXPECT_TRUE(at::equal(w1, w2));
  EXPECT_TRUE(at::equal(b1, b2));
  EXPECT_TRUE(at::equal(o1.state_of(w1).master, o2.state_of(w2).master));
  EXPECT_TRUE(at::equal(o1.state_of(b1).exp_avg_sq, o2.state_of(b2).exp_avg_sq));
}

// On the CPU the entries run the composite ops whatever they are asked: bit for bit the plain
// ops, forward and backward.
TEST(KernelEntries, CpuRunsTheCompositeOps) {
  at::manual_seed(11);
  for (bool rms : {false, true}) {
    at::Tensor x1 = at::randn({2, 5, 24}).requires_grad_(true), x2 = x1.detach().clone().requires_grad_(true);
    at::Tensor w1 = at::randn({24}).requires_grad_(true), w2 = w1.detach().clone().requires_grad_(true);
    at::Tensor b1 = rms ? at::Tensor() : at::randn({24}).requires_grad_(true);
    at::Tensor b2 = rms ? at::Tensor() : b1.detach().clone().requires_grad_(true);
    const at::Tensor y1 = kiln::norm(x1, w1, b1, 1e-5, rms, kiln::Kernels::fused);
    const at::Tensor y2 = rms ? at::rms_norm(x2, {24}, w2, 1e-5) : at::layer_norm(x2, {24}, w2, b2, 1e-5);
    EXPECT_TRUE(at::equal(y1, y2));
    const at::Tensor g = at::randn_like(y1);
    y1.backward(g);
    y2.backward(g);
    EXPECT_TRUE(at::equal(x1.grad(), x2.grad()));
    EXPECT_TRUE(at::equal(w1.grad(), w2.grad()));
  }
  at::Tensor h = at::randn({3, 4, 16});
  const auto parts = h.chunk(2, -1);
  EXPECT_TRUE(at::equal(kiln::swiglu(h, kiln::Kernels::fused), at::silu(parts[0]) * parts[1]));
  const at::Tensor x = at::randn({5, 16}), wf = at::randn({64, 16}), bf = at::randn({64}), wp = at::randn({16, 64}),
                   bp = at::randn({16});
  EXPECT_TRUE(at::equal(kiln::gelu_mlp(x, wf, bf, wp, bp, kiln::Kernels::fused),
                        at::linear(at::gelu(at::linear(x, wf, bf), "tanh"), wp, bp)));
  const at::Tensor q = at::randn({2, 4, 6, 8}), kk2 = at::randn({2, 2, 6, 8}), cs = at::randn({6, 8}), sn = at::randn({6, 8});
  const auto qh = q.chunk(2, -1), kh = kk2.chunk(2, -1);
  const auto [qr, kr] = kiln::rope(q, kk2, cs, sn, at::Tensor(), kiln::Kernels::fused);
  EXPECT_TRUE(at::equal(qr, q * cs + at::cat({-qh[1], qh[0]}, -1) * sn));
  EXPECT_TRUE(at::equal(kr, kk2 * cs + at::cat({-kh[1], kh[0]}, -1) * sn));
}

// kernels/matmul.h: on the CPU a 16-bit product is the fp32 GEMM's product of the 16-bit values
// rounded once to 16 bits. Held against fp64 products of the same 16-bit values: within one
// rounding (2^-8 relative for bf16, 2^-11 for fp16) plus fp32 accumulation (2^-20 of the sum of
// the terms' magnitudes, K <= 40 terms of fp32 rounding each); LibTorch's own 16-bit kernel obeys
// the same bound. fp32 operands go to LibTorch unchanged (bit for bit).
TEST(KernelEntries, CpuProductsIn16BitsTakeTheFp32Gemm) {
  at::manual_seed(13);
  auto close = [](const at::Tensor& got, const at::Tensor& ref64, const at::Tensor& mag64, double rel) {
    const at::Tensor err = (got.to(at::kDouble) - ref64).abs();
    const at::Tensor bound = ref64.abs() * rel + mag64 * std::ldexp(1.0, -20) + 1e-30;
    return (err <= bound).all().item<bool>();
  };
  {  // fp32: LibTorch's own product, forward and backward
    at::Tensor x1 = at::randn({2, 7, 24}).requires_grad_(true), x2 = x1.detach().clone().requires_grad_(true);
    at::Tensor w1 = at::randn({40, 24}).requires_grad_(true), w2 = w1.detach().clone().requires_grad_(true);
    const at::Tensor y1 = kiln::linear_product(x1, w1), y2 = at::linear(x2, w2);
    EXPECT_TRUE(at::equal(y1, y2));
    const at::Tensor g = at::randn_like(y1);
    y1.backward(g);
    y2.backward(g);
    EXPECT_TRUE(at::equal(x1.grad(), x2.grad()));
    EXPECT_TRUE(at::equal(w1.grad(), w2.grad()));
  }
  for (const auto t : {at::kBFloat16, at::kHalf}) {
    const double rel = std::ldexp(1.0, t == at::kBFloat16 ? -8 : -11);
    at::Tensor x = at::randn({2, 7, 24}).to(t).requires_grad_(true), w = at::randn({40, 24}).to(t).requires_grad_(true);
    at::Tensor b = at::randn({40}).to(t).requires_grad_(true);
    const at::Tensor y = kiln::linear_product(x, w, b);
    ASSERT_EQ(y.scalar_type(), t);
    ASSERT_EQ(y.sizes(), (std::vector<int64_t>{2, 7, 40}));
    const at::Tensor x64 = x.detach().to(at::kDouble), w64 = w.detach().to(at::kDouble), b64 = b.detach().to(at::kDouble);
    const at::Tensor y64 = at::linear(x64, w64, b64), ymag = at::linear(x64.abs(), w64.abs(), b64.abs());
    EXPECT_TRUE(close(y, y64, ymag, rel)) << t;
    EXPECT_TRUE(close(at::linear(x.detach(), w.detach(), b.detach()), y64, ymag, rel)) << t;  // LibTorch's, same bound
    const at::Tensor g = at::randn({2, 7, 40}).to(t);
    y.backward(g);
    const at::Tensor g64 = g.to(at::kDouble).reshape({-1, 40}), x2 = x64.reshape({-1, 24});
    EXPECT_TRUE(close(x.grad().reshape({-1, 24}), g64.mm(w64), g64.abs().mm(w64.abs()), rel)) << t;
    EXPECT_TRUE(close(w.grad(), g64.t().mm(x2), g64.abs().t().mm(x2.abs()), rel)) << t;
    EXPECT_TRUE(close(b.grad(), g64.sum(0), g64.abs().sum(0), rel)) << t;
    EXPECT_EQ(x.grad().scalar_type(), t);
    // matmul_product (3-D first operand) and addmm_product (beta 0: c is not read, NaN or not)
    const at::Tensor m = kiln::matmul_product(g, w.detach());
    EXPECT_TRUE(close(m.reshape({-1, 24}), g64.mm(w64), g64.abs().mm(w64.abs()), rel)) << t;
    const at::Tensor nan = at::full({14, 24}, std::numeric_limits<double>::quiet_NaN(), at::TensorOptions().dtype(t));
    const at::Tensor a = kiln::addmm_product(nan, g.reshape({-1, 40}), w.detach(), 0.0, 0.5);
    EXPECT_TRUE(close(a, g64.mm(w64) * 0.5, g64.abs().mm(w64.abs()) * 0.5, rel)) << t;
  }
  {  // under CPU autocast: fp32 leaves cast to bf16 (as at::linear's autocast would), bf16 out,
     // fp32 gradients holding the bf16 products
    at::Tensor x = at::randn({3, 24}).requires_grad_(true), w = at::randn({40, 24}).requires_grad_(true);
    at::Tensor b = at::randn({40}).requires_grad_(true);
    at::Tensor y;
    {
      at::autocast::set_autocast_enabled(at::kCPU, true);
      at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
      y = kiln::linear_product(x, w, b);
      at::autocast::set_autocast_enabled(at::kCPU, false);
      at::autocast::clear_cache();
    }
    EXPECT_EQ(y.scalar_type(), at::kBFloat16);
    const at::Tensor x16 = x.detach().to(at::kBFloat16).to(at::kDouble), w16 = w.detach().to(at::kBFloat16).to(at::kDouble);
    const at::Tensor b16 = b.detach().to(at::kBFloat16).to(at::kDouble);
    EXPECT_TRUE(close(y, at::linear(x16, w16, b16), at::linear(x16.abs(), w16.abs(), b16.abs()), std::ldexp(1.0, -8)));
    y.sum().backward();
    EXPECT_EQ(w.grad().scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(w.grad(), w.grad().to(at::kBFloat16).to(at::kFloat)));  // a bf16 product, widened
    const at::Tensor ones = at::ones({3, 40}, at::kDouble);
    EXPECT_TRUE(close(w.grad(), ones.t().mm(x16), ones.t().mm(x16.abs()), std::ldexp(1.0, -8)));
    EXPECT_TRUE(close(x.grad(), ones.mm(w16), ones.mm(w16.abs()), std::ldexp(1.0, -8)));
  }
}

// add_norm on the CPU: x + r then the norm, bit for bit, forward and backward (x and r each get
// the gradient of s).
TEST(KernelEntries, AddNormRunsTheCompositeOps) {
  at::manual_seed(12);
  for (bool rms : {false, true}) {
    at::Tensor x1 = at::randn({2, 5, 24}).requires_grad_(true), r1 = at::randn({2, 5, 24}).requires_grad_(true);
    at::Tensor x2 = x1.detach().clone().requires_grad_(true), r2 = r1.detach().clone().requires_grad_(true);
    const at::Tensor w = at::randn({24}), b = rms ? at::Tensor() : at::randn({24});
    EXPECT_FALSE(kiln::add_norm_fused(x1, r1, kiln::Kernels::fused));
    const auto [s1, y1] = kiln::add_norm(x1, r1, w, b, 1e-5, rms, kiln::Kernels::fused);
    const at::Tensor s2 = x2 + r2;
    const at::Tensor y2 = rms ? at::rms_norm(s2, {24}, w, 1e-5) : at::layer_norm(s2, {24}, w, b, 1e-5);
    EXPECT_TRUE(at::equal(s1, s2));
    EXPECT_TRUE(at::equal(y1, y2));
    const at::Tensor gs = at::randn_like(s1), gy = at::randn_like(y1);
    (s1 * gs + y1 * gy).sum().backward();
    (s2 * gs + y2 * gy).sum().backward();
    EXPECT_TRUE(at::equal(x1.grad(), x2.grad()));
    EXPECT_TRUE(at::equal(r1.grad(), r2.grad()));
  }
}

// The classifier's composite path: the loss sum and softmax - onehot over the real columns, 0 in
// the padding columns, against log_softmax in fp64.
TEST(KernelEntries, SoftmaxCrossEntropyReference) {
  at::manual_seed(13);
  const int64_t c = 6, V = 37, Vp = 40;
  const at::Tensor z = at::randn({c, Vp}) * 4, t = at::randint(0, V, {c, 1}, at::kLong);
  at::Tensor G = at::empty({c, Vp}, at::kBFloat16);
  const at::Tensor loss = kiln::softmax_cross_entropy_rows(z.clone(), t, V, G, kiln::Kernels::fused);
  const at::Tensor lsm = at::log_softmax(z.narrow(1, 0, V).to(at::kDouble), 1);
  EXPECT_NEAR(loss.item<double>(), -lsm.gather(1, t).sum().item<double>(), 1e-4);
  at::Tensor want = at::zeros({c, Vp}, at::kDouble);
  want.narrow(1, 0, V).copy_(lsm.exp());
  want.narrow(1, 0, V).scatter_add_(1, t, -at::ones({c, 1}, at::kDouble));
  expect_close(G, want, 1.0, 1e-7, "G");
  EXPECT_TRUE(at::equal(G.narrow(1, V, Vp - V), at::zeros({c, Vp - V}, at::kBFloat16)));
}

// GPT::set_kernels reaches every norm, MLP and MoE layer; on the CPU the loss and gradients are the
// reference's bit for bit.
TEST(KernelEntries, ModelTakesTheChoice) {
  kiln::GPTConfig cfg = tiny_gpt();
  cfg.position = "rope";
  cfg.norm = "rmsnorm";
  cfg.mlp = "swiglu";
  cfg.bias = "none";
  cfg.tie_embeddings = false;
  cfg.n_experts = 4;
  cfg.top_k = 2;
  cfg.moe_every = 2;
  auto run = [&](kiln::Kernels k) {
    kiln::GPT m(cfg, at::TensorOptions());
    m.init_weights(1);
    m.set_kernels(k);
    int norms = 0, mlps = 0, moes = 0;
    for (const auto& mod : m.modules(false)) {
      if (auto* n = dynamic_cast<kiln::LayerNormImpl*>(mod.get())) norms += n->kernels == k;
      if (auto* p = dynamic_cast<kiln::MLPImpl*>(mod.get())) mlps += p->kernels == k;
      if (auto* e = dynamic_cast<kiln::MoEImpl*>(mod.get())) moes += e->kernels == k;
    }
    EXPECT_EQ(norms, 5);  // ln_1, ln_2 per block, ln_f
    EXPECT_EQ(mlps, 1);
    EXPECT_EQ(moes, 1);
    EXPECT_EQ(m.kernels(), k);
    return loss_and_grads(m);
  };
  const auto a = run(kiln::Kernels::fused), b = run(kiln::Kernels::reference);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << i;
}

// GPT-2's shape with the GELU epilogue asked for: every MLP takes it (fused only), and the CPU
// runs the composite ops, bit for bit.
TEST(KernelEntries, GeluEpilogueReachesTheMLPs) {
  kiln::GPTConfig cfg = tiny_gpt();
  auto run = [&](kiln::Kernels k, bool epilogue) {
    kiln::GPT m(cfg, at::TensorOptions());
    m.init_weights(1);
    m.set_kernels(k, epilogue);
    int with = 0;
    for (const auto& mod : m.modules(false))
      if (auto* p = dynamic_cast<kiln::MLPImpl*>(mod.get())) with += p->gelu_epilogue;
    EXPECT_EQ(with, epilogue && k == kiln::Kernels::fused ? 2 : 0);
    return loss_and_grads(m);
  };
  const auto a = run(kiln::Kernels::fused, true), b = run(kiln::Kernels::reference, false);
  run(kiln::Kernels::reference, true);  // the epilogue needs the fused kernels
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << i;
}
