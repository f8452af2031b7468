// tests/test_kernels_gpu.cpp -- gpu.kernels: every fused kernel against its composite reference
// on the device, forward and backward, at awkward shapes (rows not a multiple of a block, widths
// not a multiple of a warp, GPT-2's vocabulary of 50,257 padded to 50,304, a tp shard's width),
// in fp32, bf16 and fp16. Exits 77 (skipped) without a CUDA device.
//
// Both paths are held to fp64 computed from the same (rounded) inputs, with the bound each says:
//   16-bit outputs: one ulp of the output's dtype (each path rounds an fp32 value once; the fp32
//     values differ by their sums' order) plus a slack of the output's scale for fp32 sums:
//     1e-5 (a sum over at most 8,192 terms in fp32, pairwise by warps: ~1e-6 typical).
//   fp32 outputs: 64 fp32 ulps plus the same slack.
//   dw, db (sums over up to 4,099 rows): the same, the slack taken of the column sums' scale.
// and the fused path's error is printed beside the reference's, so a kernel that is merely
// within bounds but worse than ATen shows.
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/cuda.h>

#include "kernels/adamw.h"
#include "kernels/classifier.h"
#include "kernels/float8.h"
#include "kernels/gelu_mlp.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "models/gpt.h"
#include "models/linear_cross_entropy.h"

namespace {

using kiln::Kernels;

int ulp_bits(at::ScalarType t) { return t == at::kBFloat16 ? 7 : t == at::kHalf ? 10 : 23; }

// Largest |got - want| / bound over the elements (<= 1 passes), bound = k ulps of got's dtype at
// |want| + slack * max|want|.
double worst(const at::Tensor& got, const at::Tensor& want, double k, double slack) {
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  const at::Tensor mag = w.abs().clamp_min(1e-30);
  const at::Tensor u = at::exp2(at::floor(at::log2(mag)) - ulp_bits(got.scalar_type()));
  const at::Tensor bound = k * u + slack * w.abs().max();
  return ((g - w).abs() / bound).max().item<double>();
}

void check(const std::string& what, const at::Tensor& fused, const at::Tensor& ref, const at::Tensor& truth, double slack) {
  const double k = fused.scalar_type() == at::kFloat ? 64.0 : 1.0;
  const double wf = worst(fused, truth, k, slack), wr = worst(ref, truth, k, slack);
  std::printf("  %-58s fused %.3f  reference %.3f  (of the bound)\n", what.c_str(), wf, wr);
  EXPECT_LE(wf, 1.0) << what << ": the fused kernel is outside its bound";
  EXPECT_TRUE(at::isfinite(fused.to(at::kFloat)).all().item<bool>()) << what;
}

at::TensorOptions cuda(at::ScalarType t) { return at::TensorOptions().device(at::kCUDA).dtype(t); }

}  // namespace

TEST(GpuKernels, Norms) {
  at::manual_seed(1);
  const std::vector<std::pair<at::ScalarType, at::ScalarType>> types{
      {at::kFloat, at::kFloat}, {at::kBFloat16, at::kBFloat16}, {at::kBFloat16, at::kFloat}, {at::kHalf, at::kHalf}};
  const std::vector<std::pair<int64_t, int64_t>> shapes{{1, 1}, {7, 33}, {1000, 768}, {4099, 1600}, {3, 8192}, {257, 4100}};
  for (bool rms : {false, true}) {
    for (auto [xt, wt] : types) {
      for (auto [rows, d] : shapes) {
        const std::string what = std::string(rms ? "rms" : "layer") + " " + c10::toString(xt) + "/" + c10::toString(wt) +
                                 " " + std::to_string(rows) + "x" + std::to_string(d);
        const at::Tensor x0 = (at::randn({rows, d}, cuda(at::kFloat)) * 3 + 1).to(xt);
        const at::Tensor w0 = (at::randn({d}, cuda(at::kFloat)) * 0.5 + 1).to(wt);
        const at::Tensor b0 = rms ? at::Tensor() : at::randn({d}, cuda(at::kFloat)).to(wt);
        const at::Tensor dy = at::randn({rows, d}, cuda(at::kFloat)).to(xt);
        auto run = [&](Kernels k, at::ScalarType as) {
          at::Tensor x = x0.to(as).requires_grad_(true), w = w0.to(as == at::kDouble ? as : wt).requires_grad_(true);
          at::Tensor b = rms ? at::Tensor() : b0.to(as == at::kDouble ? as : wt).requires_grad_(true);
          at::Tensor y = kiln::norm(x, w, b, 1e-5, rms, k);
          y.backward(dy.to(y.scalar_type()));
          return std::make_tuple(y.detach(), x.grad(), w.grad(), rms ? at::Tensor() : b.grad());
        };
        const auto [yf, dxf, dwf, dbf] = run(Kernels::fused, xt);
        const auto [yr, dxr, dwr, dbr] = run(Kernels::reference, xt);
        const auto [y64, dx64, dw64, db64] = run(Kernels::reference, at::kDouble);
        EXPECT_EQ(yf.scalar_type(), xt) << what << ": the fused norm answers in x's dtype";
        check(what + " y", yf, yr, y64, 1e-5);
        check(what + " dx", dxf, dxr, dx64, 1e-5);
        check(what + " dw", dwf, dwr, dw64, 1e-5);
        if (!rms) check(what + " db", dbf, dbr, db64, 1e-5);
      }
    }
  }
}

// The residual add with the norm (kernels/norm.h's add_norm): s = x + r equal to the reference's
// bit for bit (one rounding of the same fp32 sum); y, dw, db to the norm's bounds against fp64
// from that s; dx = dr = the norm's dx + s's own gradient to the same bounds (the fused path
// rounds the sum once, the composite twice).
TEST(GpuKernels, AddNorm) {
  at::manual_seed(9);
  const std::vector<std::pair<at::ScalarType, at::ScalarType>> types{
      {at::kFloat, at::kFloat}, {at::kBFloat16, at::kBFloat16}, {at::kBFloat16, at::kFloat}, {at::kHalf, at::kHalf}};
  const std::vector<std::pair<int64_t, int64_t>> shapes{{1, 1}, {7, 33}, {4099, 1600}, {3, 8192}, {257, 4100}};
  for (bool rms : {false, true}) {
    for (auto [xt, wt] : types) {
      for (auto [rows, d] : shapes) {
        const std::string what = std::string(rms ? "add+rms" : "add+layer") + " " + c10::toString(xt) + "/" +
                                 c10::toString(wt) + " " + std::to_string(rows) + "x" + std::to_string(d);
        const at::Tensor x0 = (at::randn({rows, d}, cuda(at::kFloat)) * 3 + 1).to(xt);
        const at::Tensor r0 = at::randn({rows, d}, cuda(at::kFloat)).to(xt);
        const at::Tensor w0 = (at::randn({d}, cuda(at::kFloat)) * 0.5 + 1).to(wt);
        const at::Tensor b0 = rms ? at::Tensor() : at::randn({d}, cuda(at::kFloat)).to(wt);
        const at::Tensor gs = at::randn({rows, d}, cuda(at::kFloat)).to(xt), gy = at::randn({rows, d}, cuda(at::kFloat)).to(xt);
        ASSERT_TRUE(kiln::add_norm_fused(x0, r0, Kernels::fused)) << what;
        auto run = [&](Kernels k) {
          at::Tensor x = x0.clone().requires_grad_(true), r = r0.clone().requires_grad_(true);
          at::Tensor w = w0.clone().requires_grad_(true), b = rms ? at::Tensor() : b0.clone().requires_grad_(true);
          auto [sum, y] = kiln::add_norm(x, r, w, b, 1e-5, rms, k);
          torch::autograd::backward({sum, y}, {gs, gy.to(y.scalar_type())});
          return std::make_tuple(sum.detach(), y.detach(), x.grad(), r.grad(), w.grad(), rms ? at::Tensor() : b.grad());
        };
        const auto [sf, yf, dxf, drf, dwf, dbf] = run(Kernels::fused);
        const auto [sr, yr, dxr, drr, dwr, dbr] = run(Kernels::reference);
        // fp64 from the rounded sum: the norm's gradient plus s's own.
        at::Tensor s64 = sr.to(at::kDouble).requires_grad_(true);
        at::Tensor w64 = w0.to(at::kDouble).requires_grad_(true);
        at::Tensor b64 = rms ? at::Tensor() : b0.to(at::kDouble).requires_grad_(true);
        at::Tensor y64 = kiln::norm(s64, w64, b64, 1e-5, rms, Kernels::reference);
        y64.backward(gy.to(at::kDouble));
        const at::Tensor dx64 = s64.grad() + gs.to(at::kDouble);
        EXPECT_TRUE(at::equal(sf, sr)) << what << ": s = x + r differs from the composite add";
        EXPECT_TRUE(at::equal(dxf, drf)) << what << ": x and r must get the same gradient";
        check(what + " y", yf, yr, y64.detach(), 1e-5);
        check(what + " dx", dxf, dxr, dx64, 1e-5);
        check(what + " dw", dwf, dwr, w64.grad(), 1e-5);
        if (!rms) check(what + " db", dbf, dbr, b64.grad(), 1e-5);
      }
    }
  }
}

TEST(GpuKernels, NormUnderAutocastStaysSixteenBit) {
  // The point of the kernel: under CUDA autocast a bf16 x gives a bf16 y (the composite norm
  // gives fp32: autocast's fp32 list), with the same values to one bf16 ulp.
  const at::Tensor x = at::randn({64, 768}, cuda(at::kBFloat16)), w = at::ones({768}, cuda(at::kBFloat16));
  const at::Tensor b = at::zeros({768}, cuda(at::kBFloat16));
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  const at::Tensor yf = kiln::norm(x, w, b, 1e-5, false, Kernels::fused);
  const at::Tensor yr = kiln::norm(x, w, b, 1e-5, false, Kernels::reference);
  at::autocast::set_autocast_enabled(at::kCUDA, false);
  at::autocast::clear_cache();
  EXPECT_EQ(yf.scalar_type(), at::kBFloat16);
  EXPECT_EQ(yr.scalar_type(), at::kFloat);
  EXPECT_LE(worst(yf, yr, 1.0, 1e-6), 1.0);
}

TEST(GpuKernels, SoftmaxCrossEntropy) {
  at::manual_seed(2);
  for (auto [rows, V] : std::vector<std::pair<int64_t, int64_t>>{{1, 37}, {5, 50257}, {1025, 50257}, {3, 128256}, {17, 16032}}) {
    const int64_t Vp = (V + 127) / 128 * 128;
    for (auto gt : {at::kBFloat16, at::kFloat}) {
      const std::string what = "xent " + std::to_string(rows) + "x" + std::to_string(V) + " G " + c10::toString(gt);
      const at::Tensor z = at::randn({rows, Vp}, cuda(at::kFloat)) * 6;
      const at::Tensor t = at::randint(0, V, {rows, 1}, cuda(at::kLong));
      at::Tensor gf = at::empty({rows, Vp}, cuda(gt)), gr = at::empty({rows, Vp}, cuda(gt));
      const at::Tensor lf = kiln::softmax_cross_entropy_rows(z.clone(), t, V, gf, Kernels::fused);
      const at::Tensor lr = kiln::softmax_cross_entropy_rows(z.clone(), t, V, gr, Kernels::reference);
      const at::Tensor lsm = at::log_softmax(z.narrow(1, 0, V).to(at::kDouble), 1);
      const double l64 = -lsm.gather(1, t).sum().item<double>();
      at::Tensor g64 = at::zeros({rows, Vp}, cuda(at::kDouble));
      g64.narrow(1, 0, V).copy_(lsm.exp());
      g64.narrow(1, 0, V).scatter_add_(1, t, -at::ones({rows, 1}, cuda(at::kDouble)));
      std::printf("  %-58s loss fused %.3g  reference %.3g  (relative error)\n", what.c_str(),
                  std::fabs(lf.item<double>() - l64) / l64, std::fabs(lr.item<double>() - l64) / l64);
      EXPECT_LE(std::fabs(lf.item<double>() - l64), 1e-5 * l64) << what;
      // G's entries are probabilities (1e-5 of the largest: G's scale is 1).
      check(what + " G", gf, gr, g64, gt == at::kFloat ? 1e-6 : 1e-7);
      EXPECT_TRUE(at::equal(gf.narrow(1, V, Vp - V), at::zeros({rows, Vp - V}, cuda(gt)))) << what << ": padding";
      // Without a gradient (evaluation) the loss alone.
      const at::Tensor ln = kiln::softmax_cross_entropy_rows(z.clone(), t, V, at::Tensor(), Kernels::fused);
      EXPECT_EQ(ln.item<float>(), lf.item<float>()) << what;
    }
  }
}

// The vocabulary-parallel loss's local passes (kernels/classifier.h): the row stats (m exact:
// a max; s against the reference to 1e-5 relative, both fp32 sums of the same exponentials) and
// the gradient scale (exp(z - lse) - onehot) against fp64 from the same lse: one ulp of the
// output dtype + 1e-6 of its scale (64 ulps for fp32); padding columns exactly 0; targets held,
// not held (-1) and past the real columns.
TEST(GpuKernels, VocabParallelPasses) {
  at::manual_seed(10);
  for (auto zt : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (auto [rows, width, pad] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {1, 1, 0}, {7, 12576, 47}, {1025, 12576, 0}, {3, 32064, 0}, {5, 100, 100}}) {
      const int64_t cols = width - pad;
      const std::string what = std::string("vocab-parallel ") + c10::toString(zt) + " " + std::to_string(rows) + "x" +
                               std::to_string(width) + " real " + std::to_string(cols);
      const at::Tensor z = (at::randn({rows, width}, cuda(at::kFloat)) * 4).to(zt);
      const auto [mf, sf] = kiln::softmax_row_stats(z, cols, Kernels::fused);
      const auto [mr, sr] = kiln::softmax_row_stats(z, cols, Kernels::reference);
      EXPECT_TRUE(at::equal(mf, mr)) << what << ": the row maxima";
      if (cols > 0) EXPECT_LE(((sf - sr).abs() / sr).max().item<double>(), 1e-5) << what << ": the sums";
      else EXPECT_TRUE(at::equal(sf, sr)) << what;
      if (cols == 0) continue;
      const at::Tensor lse = mr + sr.log();
      at::Tensor t = at::randint(0, cols, {rows}, cuda(at::kLong));
      if (rows > 2) {
        t[1] = -1;    // the target on another rank
        t[2] = cols;  // past this rank's real columns
      }
      const at::Tensor scale = at::full({}, 0.37f, cuda(at::kFloat));
      const at::Tensor gf = kiln::softmax_xent_grad(z, cols, lse, t, scale, Kernels::fused);
      const at::Tensor gr = kiln::softmax_xent_grad(z, cols, lse, t, scale, Kernels::reference);
      at::Tensor truth = at::zeros({rows, width}, cuda(at::kDouble));
      at::Tensor p = (z.narrow(1, 0, cols).to(at::kDouble) - lse.to(at::kDouble).unsqueeze(1)).exp();
      const at::Tensor held = t.ge(0).logical_and(t.lt(cols));
      p = p - at::zeros_like(p).scatter_(1, t.clamp(0, cols - 1).unsqueeze(1), held.to(at::kDouble).unsqueeze(1));
      truth.narrow(1, 0, cols).copy_(p * 0.37);
      EXPECT_EQ(gf.scalar_type(), zt) << what;
      check(what + " dz", gf, gr, truth, 1e-6);
      if (pad > 0) EXPECT_TRUE(at::equal(gf.narrow(1, cols, pad), at::zeros({rows, pad}, cuda(zt)))) << what;
    }
  }
}

TEST(GpuKernels, LinearCrossEntropyUnderAutocast) {
  // The loss as the model runs it: bf16 autocast, chunks of rows, the padded vocabulary.
  at::manual_seed(3);
  const int64_t N = 777, d = 128, V = 50257, Vp = 50304;
  const at::Tensor x0 = at::randn({N, d}, cuda(at::kBFloat16)), w0 = (at::randn({Vp, d}, cuda(at::kFloat)) * 0.05).to(at::kBFloat16);
  const at::Tensor t = at::randint(0, V, {N}, cuda(at::kLong));
  auto run = [&](Kernels k, bool logits16 = false) {
    at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    at::Tensor loss = kiln::linear_cross_entropy(x, w, t, V, 100, k, logits16);
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
    loss.backward();
    return std::make_tuple(loss.detach(), x.grad(), w.grad());
  };
  const auto [lf, gxf, gwf] = run(Kernels::fused);
  const auto [lr, gxr, gwr] = run(Kernels::reference);
  // Same fp32 logits on both paths: the loss to fp32 rounding, the gradients to a bf16 ulp of G
  // carried through the products (2 ulps of their bf16 outputs, 1e-3 of their scale).
  EXPECT_NEAR(lf.item<double>(), lr.item<double>(), 1e-5 * lr.item<double>());
  EXPECT_LE(worst(gxf, gxr, 2.0, 1e-3), 1.0);
  EXPECT_LE(worst(gwf, gwr, 2.0, 1e-3), 1.0);
  // --logits-dtype bf16: the bf16 logits' two-pass kernels against the same math in ATen ops on
  // the same bf16 logits (the reference) -- the loss to 1e-5, the gradients as above; and both
  // within the logits' bf16 rounding of the fp32-logits loss (2^-8 x the mean |logit|, loosely:
  // 1e-2 relative).
  const auto [l16f, gx16f, gw16f] = run(Kernels::fused, /*logits16=*/true);
  const auto [l16r, gx16r, gw16r] = run(Kernels::reference, /*logits16=*/true);
  std::printf("  linear cross-entropy, bf16 logits: loss fused %.7f reference %.7f (fp32 logits %.7f)\n", l16f.item<double>(),
              l16r.item<double>(), lr.item<double>());
  EXPECT_NEAR(l16f.item<double>(), l16r.item<double>(), 1e-5 * l16r.item<double>());
  EXPECT_NEAR(l16f.item<double>(), lr.item<double>(), 1e-2 * lr.item<double>());
  EXPECT_LE(worst(gx16f, gx16r, 2.0, 1e-3), 1.0);
  EXPECT_LE(worst(gw16f, gw16r, 2.0, 1e-3), 1.0);
}

TEST(GpuKernels, SwiGLU) {
  at::manual_seed(4);
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (auto [rows, F] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 33}, {1000, 2048}, {513, 5461}}) {
      const std::string what = std::string("swiglu ") + c10::toString(dtype) + " " + std::to_string(rows) + "x" + std::to_string(F);
      const at::Tensor h0 = (at::randn({rows, 2 * F}, cuda(at::kFloat)) * 3).to(dtype);
      const at::Tensor dy = at::randn({rows, F}, cuda(at::kFloat)).to(dtype);
      auto run = [&](Kernels k, at::ScalarType as) {
        at::Tensor h = h0.to(as).requires_grad_(true);
        at::Tensor y = kiln::swiglu(h, k);
        y.backward(dy.to(as));
        return std::make_tuple(y.detach(), h.grad());
      };
      const auto [yf, dhf] = run(Kernels::fused, dtype);
      const auto [yr, dhr] = run(Kernels::reference, dtype);
      const auto [y64, dh64] = run(Kernels::reference, at::kDouble);
      check(what + " y", yf, yr, y64, 1e-6);
      check(what + " dh", dhf, dhr, dh64, 1e-6);
    }
  }
}

TEST(GpuKernels, Rope) {
  // q and k as the model hands them over: views [B, heads, T, h] of the qkv product [B, T, (H + 2
  // KV) h] (not contiguous), with and without positions (context parallelism's rows).
  at::manual_seed(5);
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (auto [B, H, KV, T, h] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>>{
             {1, 1, 1, 1, 2}, {2, 4, 2, 7, 64}, {3, 32, 8, 129, 128}, {1, 6, 6, 1000, 80}}) {
      const std::string what = std::string("rope ") + c10::toString(dtype) + " B" + std::to_string(B) + " H" +
                               std::to_string(H) + " T" + std::to_string(T) + " h" + std::to_string(h);
      const int64_t rows = T + 5;
      const at::Tensor angles = at::rand({rows, h / 2}, cuda(at::kFloat)) * 50;
      const at::Tensor cos = at::cat({angles.cos(), angles.cos()}, -1).to(dtype);
      const at::Tensor sin = at::cat({angles.sin(), angles.sin()}, -1).to(dtype);
      const at::Tensor qkv = at::randn({B, T, (H + 2 * KV) * h}, cuda(at::kFloat)).to(dtype);
      const at::Tensor pos = at::randperm(rows, cuda(at::kLong)).narrow(0, 0, T);
      for (bool with_pos : {false, true}) {
        const at::Tensor p = with_pos ? pos : at::Tensor();
        const at::Tensor dy = at::randn({B, H, T, h}, cuda(at::kFloat)).to(dtype);
        const at::Tensor dyk = at::randn({B, KV, T, h}, cuda(at::kFloat)).to(dtype);
        auto run = [&](Kernels k, at::ScalarType as) {
          at::Tensor src = qkv.to(as).requires_grad_(true);
          const at::Tensor q = src.narrow(-1, 0, H * h).view({B, T, H, h}).transpose(1, 2);
          const at::Tensor kv = src.narrow(-1, H * h, KV * h).view({B, T, KV, h}).transpose(1, 2);
          auto [y, yk] = kiln::rope(q, kv, cos.to(as), sin.to(as), p, k);
          // backward through both: the gradients of q's and k's columns of the product
          torch::autograd::backward({y, yk}, {dy.to(as), dyk.to(as)});
          return std::make_tuple(at::cat({y.detach().flatten(), yk.detach().flatten()}),
                                 src.grad().narrow(-1, 0, (H + KV) * h), y.is_contiguous() && yk.is_contiguous());
        };
        const auto [yf, gf, contiguous] = run(Kernels::fused, dtype);
        const auto [yr, gr, unused_r] = run(Kernels::reference, dtype);
        const auto [y64, g64, unused_64] = run(Kernels::reference, at::kDouble);
        const std::string w = what + (with_pos ? " positions" : "");
        check(w + " y", yf, yr, y64, 1e-6);
        check(w + " dx", gf, gr, g64, 1e-6);
        EXPECT_TRUE(contiguous) << w << ": q and k turned into contiguous tensors";
      }
    }
  }
}

TEST(GpuKernels, VarlenFlashAttention) {
  // --document-mask and the sliding window through flash's variable-length kernel
  // (models/gpt.h: varlen_flash_attention) against the masked SDPA (causal_attention with the
  // mask's bias, the reference), both held to fp64 math from the same rounded q, k, v: outputs and
  // the three gradients. Awkward shapes: T 100 and 257, documents cut at random places (a row
  // starting mid-document), GQA 8 over 2, a window alone and a window with documents.
  at::manual_seed(6);
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    for (auto [B, H, KV, T, h, window, documents] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool>>{
             {3, 8, 2, 100, 64, 0, true}, {2, 4, 4, 257, 128, 0, true}, {2, 4, 2, 100, 64, 17, false}, {1, 6, 3, 257, 64, 40, true}}) {
      const std::string what = std::string("varlen flash ") + c10::toString(dtype) + " B" + std::to_string(B) + " T" +
                               std::to_string(T) + " h" + std::to_string(h) + " W" + std::to_string(window) +
                               (documents ? " documents" : "");
      const at::Tensor tokens = at::randint(0, 6, {B, T}, cuda(at::kLong));  // token 0 opens a document: ~1 in 6
      auto make_mask = [&] {
        kiln::AttentionMask m;
        m.order = at::arange(T, cuda(at::kLong));
        m.batch = B;
        m.window = window;
        if (documents) m.ids = kiln::document_ids_of(tokens, 0);
        return m;
      };
      const at::Tensor q0 = at::randn({B, H, T, h}, cuda(at::kFloat)).to(dtype), k0 = at::randn({B, KV, T, h}, cuda(at::kFloat)).to(dtype);
      const at::Tensor v0 = at::randn({B, KV, T, h}, cuda(at::kFloat)).to(dtype), dy = at::randn({B, H, T, h}, cuda(at::kFloat)).to(dtype);
      auto run = [&](bool flash, at::ScalarType as) {
        at::Tensor q = q0.to(as).requires_grad_(true), k = k0.to(as).requires_grad_(true), v = v0.to(as).requires_grad_(true);
        kiln::AttentionMask m = make_mask();
        if (flash) EXPECT_TRUE(kiln::varlen_flash_eligible(q, k, v, Kernels::fused)) << what;
        at::Tensor y = flash ? kiln::varlen_flash_attention(q, k, v, m, 0.0) : kiln::causal_attention(q, k, v, 0.0, m.bias_in(as));
        y.backward(dy.to(as));
        return std::make_tuple(y.detach(), q.grad(), k.grad(), v.grad());
      };
      const auto [yf, dqf, dkf, dvf] = run(true, dtype);
      const auto [yr, dqr, dkr, dvr] = run(false, dtype);
      const auto [y64, dq64, dk64, dv64] = run(false, at::kDouble);
      // each path rounds its fp32 results once, but sums over up to T keys in another order: a
      // few ulps and 2e-3 of the scale (the masked SDPA's own error is printed beside)
      auto near = [&](const std::string& name, const at::Tensor& f, const at::Tensor& r, const at::Tensor& t) {
        const double wf = worst(f, t, 4.0, 2e-3), wr = worst(r, t, 4.0, 2e-3);
        std::printf("  %-58s flash %.3f  masked %.3f  (of the bound)\n", (what + " " + name).c_str(), wf, wr);
        EXPECT_LE(wf, 1.0) << what << " " << name;
      };
      near("y", yf, yr, y64);
      near("dq", dqf, dqr, dq64);
      near("dk", dkf, dkr, dk64);
      near("dv", dvf, dvr, dv64);
    }
  }
}

TEST(GpuKernels, GeluMLP) {
  // GPT-2's feed-forward with bias and GELU in cuBLASLt's epilogues. Both paths round h and g to
  // 16 bits inside (the fused one from fp32 in the epilogue, the composite one after each op),
  // each 2^-8 relative for bf16 (2^-11 fp16), carried through the second product's sum: the
  // bound is 4 ulps of the output plus 2^-7 (bf16; 2^-10 fp16) of the output's scale.
  at::manual_seed(6);
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    for (auto [N, d] : std::vector<std::pair<int64_t, int64_t>>{{1, 64}, {7, 768}, {4099, 1600}, {1024, 768}}) {
      const int64_t F = 4 * d;
      const std::string what = std::string("gelu mlp ") + c10::toString(dtype) + " " + std::to_string(N) + "x" + std::to_string(d);
      const auto o = cuda(at::kFloat);
      const at::Tensor x0 = at::randn({N, d}, o).to(dtype), wf0 = (at::randn({F, d}, o) * 0.05).to(dtype);
      const at::Tensor bf0 = (at::randn({F}, o) * 0.1).to(dtype), wp0 = (at::randn({d, F}, o) * 0.02).to(dtype);
      const at::Tensor bp0 = (at::randn({d}, o) * 0.1).to(dtype), dy = at::randn({N, d}, o).to(dtype);
      auto run = [&](Kernels k, at::ScalarType as) {
        std::vector<at::Tensor> in;
        for (const at::Tensor& t : {x0, wf0, bf0, wp0, bp0}) in.push_back(t.to(as).requires_grad_(true));
        at::Tensor y = kiln::gelu_mlp(in[0], in[1], in[2], in[3], in[4], k);
        y.backward(dy.to(as));
        std::vector<at::Tensor> out{y.detach()};
        for (const at::Tensor& t : in) out.push_back(t.grad());
        return out;
      };
      const auto f = run(Kernels::fused, dtype), r = run(Kernels::reference, dtype), t = run(Kernels::reference, at::kDouble);
      const double slack = dtype == at::kBFloat16 ? 1.0 / 128 : 1.0 / 1024;
      const char* names[] = {"out", "dx", "dw_fc", "db_fc", "dw_proj", "db_proj"};
      for (size_t i = 0; i < f.size(); ++i) {
        const double k = 4.0;
        const double wf = worst(f[i], t[i], k, slack), wr = worst(r[i], t[i], k, slack);
        std::printf("  %-58s fused %.3f  reference %.3f  (of the bound)\n", (what + " " + names[i]).c_str(), wf, wr);
        EXPECT_LE(wf, 1.0) << what << " " << names[i];
      }
    }
  }
}

// The one-pass AdamW (kernels/adamw.cu) against the reference (clip multiply, _fused_adamw_,
// copy into the working weights) on the device, both held to the rule in fp64 from the same
// inputs, as tests/test_kernels.cpp's KernelMath.AdamWElements on the CPU: 2 fp32 ulps of the new
// p, m, v plus 32 u (2^-24) of their terms' scale. 130 tensors of awkward sizes (0 to 300,001;
// more than one launch's batch of 56), fp32 and bf16 gradients, bf16 / fp16 / no working copies,
// with and without a clip factor; the working copies equal to the fused masters rounded, bit for
// bit; found_inf = 1 moves nothing.
TEST(GpuKernels, AdamW) {
  at::manual_seed(7);
  const auto o = cuda(at::kFloat);
  std::vector<int64_t> sizes{1, 7, 0, 4097, 65537, 300001};
  while (sizes.size() < 130) sizes.push_back(at::randint(0, 3000, {1}).item<int64_t>());
  const double lr = 6e-4, b1 = 0.9, b2 = 0.95, eps = 1e-8, u = std::ldexp(1.0, -24);
  for (auto gt : {at::kFloat, at::kBFloat16})
    for (auto wt : {at::kBFloat16, at::kHalf, at::kFloat})  // kFloat: no working copies
      for (bool factor : {true, false})
        for (double wd : {0.1, 0.0}) {
          const std::string what = std::string("adamw grads ") + c10::toString(gt) + " working " +
                                   (wt == at::kFloat ? "none" : c10::toString(wt)) + (factor ? " clipped" : "") +
                                   " wd " + std::to_string(wd);
          std::vector<at::Tensor> p0, g0, m0, v0;
          for (int64_t n : sizes) {
            p0.push_back(at::randn({n}, o));
            g0.push_back((at::randn({n}, o) * at::pow(10.0, at::randint(-6, 2, {n}, o))).to(gt));
            m0.push_back(at::randn({n}, o) * 0.05);
            v0.push_back(at::rand({n}, o) * 0.01);
          }
          const float t = 3.0f;
          const at::Tensor c = factor ? at::full({}, 0.37f, o) : at::Tensor();
          auto make = [&]() {
            kiln::AdamWGroup g;
            for (size_t i = 0; i < sizes.size(); ++i) {
              g.params.push_back(p0[i].clone());
              g.grads.push_back(g0[i].clone());
              g.exp_avg.push_back(m0[i].clone());
              g.exp_avg_sq.push_back(v0[i].clone());
              g.steps.push_back(at::full({}, t, o));
              if (wt != at::kFloat) g.working.push_back(p0[i].to(wt));
            }
            return g;
          };
          kiln::AdamWGroup f = make(), r = make(), fl = make(), rl = make();
          ASSERT_TRUE(kiln::adamw_fused_eligible(f, c, at::zeros({}, o))) << what;
          kiln::adamw_update(f, {lr, b1, b2, wd, eps}, c, at::zeros({}, o), Kernels::fused);
          kiln::adamw_update(r, {lr, b1, b2, wd, eps}, c, at::zeros({}, o), Kernels::reference);
          // The rate read from the device (--cuda-graph's update; the number then ignored): the
          // fused kernel takes float(lr) either way, so bit for bit; the reference within the bound.
          const at::Tensor lr_t = at::full({}, static_cast<float>(lr), o);
          kiln::adamw_update(fl, {999.0, b1, b2, wd, eps}, c, at::zeros({}, o), Kernels::fused, lr_t);
          kiln::adamw_update(rl, {999.0, b1, b2, wd, eps}, c, at::zeros({}, o), Kernels::reference, lr_t);
          for (size_t i = 0; i < sizes.size(); ++i) {
            EXPECT_TRUE(at::equal(fl.params[i], f.params[i])) << what << ": the device rate, tensor " << i;
            EXPECT_TRUE(at::equal(fl.exp_avg_sq[i], f.exp_avg_sq[i])) << what;
            if (wt != at::kFloat) {
              EXPECT_TRUE(at::equal(fl.working[i], f.working[i])) << what;
            }
          }
          // Every tensor at once: the lists flattened into one vector each.
          const auto flat = [](const std::vector<at::Tensor>& l) {
            std::vector<at::Tensor> v;
            for (const auto& t : l) v.push_back(t.reshape({-1}).to(at::kDouble));
            return at::cat(v);
          };
          const at::Tensor P0 = flat(p0), M0 = flat(m0), V0 = flat(v0);
          std::vector<at::Tensor> g32;
          for (const auto& t : g0) g32.push_back(factor ? t.to(at::kFloat) * c : t.to(at::kFloat));
          const at::Tensor g = flat(g32);
          const double L = static_cast<float>(lr), B1 = static_cast<float>(b1), B2 = static_cast<float>(b2);
          const double E = static_cast<float>(eps), W = static_cast<float>(wd);
          const at::Tensor m64 = B1 * M0 + (1 - B1) * g, v64 = B2 * V0 + (1 - B2) * g * g;
          const double bc1 = 1 - std::pow(B1, t), bc2s = std::sqrt(1 - std::pow(B2, t));
          const at::Tensor upd = (L / bc1) * m64 / (v64.sqrt() / bc2s + E);
          const at::Tensor want[3] = {P0 - L * W * P0 - upd, m64, v64};
          const at::Tensor slack[3] = {32 * u * (P0.abs() * L * W + upd.abs()), 32 * u * (B1 * M0.abs() + (1 - B1) * g.abs()),
                                       32 * u * (B2 * V0 + (1 - B2) * g * g)};
          const at::Tensor got_f[3] = {flat(f.params), flat(f.exp_avg), flat(f.exp_avg_sq)};
          const at::Tensor got_r[3] = {flat(r.params), flat(r.exp_avg), flat(r.exp_avg_sq)};
          const at::Tensor got_rl[3] = {flat(rl.params), flat(rl.exp_avg), flat(rl.exp_avg_sq)};
          double wf = 0, wr = 0, wrl = 0;
          for (int k = 0; k < 3; ++k) {
            const at::Tensor mag = want[k].abs().clamp_min(1e-30);
            const at::Tensor bound = 2 * at::exp2(at::floor(at::log2(mag)) - 23) + slack[k];
            wf = std::max(wf, ((got_f[k] - want[k]).abs() / bound).max().item<double>());
            wr = std::max(wr, ((got_r[k] - want[k]).abs() / bound).max().item<double>());
            wrl = std::max(wrl, ((got_rl[k] - want[k]).abs() / bound).max().item<double>());
          }
          EXPECT_LE(wrl, 1.0) << what << ": the reference with the rate on the device";
          bool working_exact = true;
          if (wt != at::kFloat) {
            std::vector<at::Tensor> rounded;
            for (const auto& q : f.params) rounded.push_back(q.to(wt));
            working_exact = at::equal(at::cat(f.working), at::cat(rounded));
          }
          std::printf("  %-58s fused %.3f  reference %.3f  (of the bound)\n", what.c_str(), wf, wr);
          EXPECT_LE(wf, 1.0) << what;
          EXPECT_TRUE(working_exact) << what << ": a working copy is not its master rounded";
          // found_inf = 1: nothing moves.
          const at::Tensor p_before = f.params[4].clone(), m_before = f.exp_avg[4].clone();
          const at::Tensor w_before = wt != at::kFloat ? f.working[4].clone() : at::Tensor();
          kiln::adamw_update(f, {lr, b1, b2, wd, eps}, c, at::ones({}, o), Kernels::fused);
          EXPECT_TRUE(at::equal(f.params[4], p_before)) << what;
          EXPECT_TRUE(at::equal(f.exp_avg[4], m_before)) << what;
          if (w_before.defined()) EXPECT_TRUE(at::equal(f.working[4], w_before)) << what;
        }
}

int main(int argc, char** argv) {
  if (!torch::cuda::is_available()) {
    std::printf("SKIP: no CUDA device visible to LibTorch\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

// The float8 quantisation's kernels (kernels/float8.cu) against the composite ops on the device:
// the same scales and the same bytes, bit for bit (the amax is a max, the scale LibTorch's ops on
// both paths, the cast round-to-nearest-even of the same fp32 value: tests/test_float8.cpp checks
// CUDA's cast against LibTorch's on the host), tensorwise and along rows and columns, e4m3 and
// e5m2, fp32 / bf16 / fp16 inputs, with an amax reduction in between (a stand-in for the group's:
// twice the amax), at awkward shapes; an inf or a NaN in x makes the same NaNs; no rows is empty.
TEST(GpuKernels, Float8Quantisation) {
  at::manual_seed(6);
  auto same = [](const kiln::Float8Tensor& f, const kiln::Float8Tensor& r, const std::string& what) {
    EXPECT_EQ(f.scale.sizes(), r.scale.sizes()) << what;
    EXPECT_TRUE(at::allclose(f.scale, r.scale, 0.0, 0.0, /*equal_nan=*/true)) << what << ": scales " << f.scale.max().item<float>() << " vs " << r.scale.max().item<float>();
    const at::Tensor fb = f.data.view(at::kByte), rb = r.data.view(at::kByte);
    const at::Tensor nan_f = at::isnan(f.data.to(at::kFloat)), nan_r = at::isnan(r.data.to(at::kFloat));
    EXPECT_TRUE(at::equal(nan_f, nan_r)) << what << ": NaNs";
    const int64_t differ = (fb != rb).logical_and(nan_r.logical_not()).sum().item<int64_t>();
    EXPECT_EQ(differ, 0) << what << ": bytes";
  };
  const kiln::AmaxReduce twice = [](const at::Tensor& a) { return a * 2; };
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 33}, {1000, 2048}, {513, 5461}, {4099, 96}}) {
      at::Tensor x = at::randn({rows, cols}, cuda(at::kFloat)) * 3;
      x.view(-1)[x.numel() / 2] = 2000.0;  // an outlier: the others' scale in one row or column, or all
      x = x.to(dtype);
      for (auto fmt : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
        const std::string what = std::string("float8 ") + c10::toString(dtype) + " " + std::to_string(rows) + "x" +
                                 std::to_string(cols) + " " + c10::toString(fmt);
        same(kiln::to_float8(x, fmt, {}, true), kiln::to_float8(x, fmt, {}, false), what + " tensorwise");
        same(kiln::to_float8(x, fmt, twice, true), kiln::to_float8(x, fmt, twice, false), what + " tensorwise, reduced");
        for (int64_t dim : {0, 1}) {
          same(kiln::to_float8_along(x, fmt, dim, {}, true), kiln::to_float8_along(x, fmt, dim, {}, false),
               what + " along " + std::to_string(dim));
          same(kiln::to_float8_along(x, fmt, dim, twice, true), kiln::to_float8_along(x, fmt, dim, twice, false),
               what + " along " + std::to_string(dim) + ", reduced");
        }
      }
    }
  }
  at::Tensor bad = at::randn({64, 48}, cuda(at::kBFloat16));
  bad[3][5] = std::numeric_limits<float>::infinity();
  bad[9][1] = std::nanf("");
  for (int64_t dim : {0, 1}) same(kiln::to_float8_along(bad, at::kFloat8_e4m3fn, dim, {}, true), kiln::to_float8_along(bad, at::kFloat8_e4m3fn, dim, {}, false), "non-finite along");
  same(kiln::to_float8(bad, at::kFloat8_e4m3fn, {}, true), kiln::to_float8(bad, at::kFloat8_e4m3fn, {}, false), "non-finite");
  const at::Tensor none = at::empty({0, 64}, cuda(at::kBFloat16));
  EXPECT_EQ(kiln::to_float8_along(none, at::kFloat8_e4m3fn, 1, {}, true).data.numel(), 0);
}
