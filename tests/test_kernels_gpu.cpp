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

#include "kernels/classifier.h"
#include "kernels/gelu_mlp.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
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

TEST(GpuKernels, LinearCrossEntropyUnderAutocast) {
  // The loss as the model runs it: bf16 autocast, chunks of rows, the padded vocabulary.
  at::manual_seed(3);
  const int64_t N = 777, d = 128, V = 50257, Vp = 50304;
  const at::Tensor x0 = at::randn({N, d}, cuda(at::kBFloat16)), w0 = (at::randn({Vp, d}, cuda(at::kFloat)) * 0.05).to(at::kBFloat16);
  const at::Tensor t = at::randint(0, V, {N}, cuda(at::kLong));
  auto run = [&](Kernels k) {
    at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    at::Tensor loss = kiln::linear_cross_entropy(x, w, t, V, 100, k);
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

int main(int argc, char** argv) {
  if (!torch::cuda::is_available()) {
    std::printf("SKIP: no CUDA device visible to LibTorch\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
