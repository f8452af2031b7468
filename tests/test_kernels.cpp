// tests/test_kernels.cpp -- kiln's kernels on the CPU: each kernel's per-row math (the
// host-and-device functions of kernels/*_math.cuh, the very code the CUDA kernels run) against
// ATen in fp64, and each entry's composite path, which is what the CPU runs whatever --kernels
// says. The fused kernels themselves run in tests/test_kernels_gpu.cpp (gpu.kernels).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "distributed/error.h"
#include "kernels/classifier.h"
#include "kernels/gelu_mlp.h"
#include "kernels/kernel_choice.h"
#include "kernels/norm.h"
#include "kernels/norm_math.cuh"
#include "kernels/rope.h"
#include "kernels/rope_math.cuh"
#include "kernels/softmax_math.cuh"
#include "kernels/swiglu.h"
#include "kernels/swiglu_math.cuh"
#include "models/gpt.h"

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
    const float m = rms ? 0.0f : kk::norm_partial_sum(xr, d, 0, 1) / static_cast<float>(d);
    const float s = kk::norm_rstd(kk::norm_partial_sq(xr, d, 0, 1, m), d, eps);
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
