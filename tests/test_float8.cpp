// tests/test_float8.cpp -- the float8 recipe's numerics on the CPU (kernels/float8.h; issue 52's
// first step): LibTorch 2.11 runs _scaled_mm on the CPU with tensorwise scales.
//   - to_float8: the largest element lands on the format's largest value; every element comes back
//     within half a unit in its last place (3 mantissa bits for e4m3: 2^-4 relative; 2 for e5m2:
//     2^-3) inside the formats' normal range;
//   - float8_linear's forward and both backward products equal fp32 products of the same quantised
//     operands (the gradient quantised to e5m2 as the backward does) within 1e-5 of their scale --
//     _scaled_mm accumulates in fp32 as the reference does, in another order;
//   - against the exact fp32 product the error is the quantisation's (below 10% of the scale at
//     K = 96 here, far above 1e-5: the comparison above is not vacuous);
//   - a bf16 input gives a bf16 output and gradient (the weight's stays fp32), its output the product
//     of its own quantised operands within bf16's rounding;
//   - the weight's 8-bit forms kept for an optimizer step (Float8WeightCache) give the products the
//     per-use quantisation gives, bit for bit, are made once a step, and eval mode bypasses them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

#include "distributed/error.h"
#include "kernels/float8.h"
#include "kernels/matmul.h"
#include "models/gpt.h"
#include "parallel/backward_split.h"

#ifdef KILN_WITH_KERNELS
#include <cuda_fp8.h>

#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>

#include "kernels/float8_math.cuh"
#endif

namespace {

double rel(const at::Tensor& a, const at::Tensor& b) {
  return ((a.to(at::kDouble) - b.to(at::kDouble)).abs().max() / b.to(at::kDouble).abs().max()).item<double>();
}

}  // namespace

TEST(Float8, QuantisationKeepsTheLargestAndHalfAnUlp) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor x = at::randn({64, 96}, gen) * 3.0;
  for (auto [dtype, fmax, ulp] : {std::make_tuple(at::kFloat8_e4m3fn, 448.0, 1.0 / 8), std::make_tuple(at::kFloat8_e5m2, 57344.0, 1.0 / 4)}) {
    const kiln::Float8Tensor q = kiln::to_float8(x, dtype);
    EXPECT_EQ(q.data.scalar_type(), dtype);
    EXPECT_DOUBLE_EQ(q.data.to(at::kFloat).abs().max().item<double>(), fmax);
    const at::Tensor back = q.dequantized();
    const at::Tensor big = x.abs() > x.abs().max() * 0.05;  // inside the formats' normal range
    const double worst = ((back - x).abs() / x.abs()).masked_select(big).max().item<double>();
    EXPECT_LE(worst, ulp / 2 * 1.0001) << c10::toString(dtype);
  }
}

TEST(Float8, LinearEqualsTheProductsOfItsQuantisedOperands) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor x0 = at::randn({2, 24, 96}, gen), w0 = at::randn({40, 96}, gen) * 0.1, g = at::randn({2, 24, 40}, gen);
  at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  const at::Tensor y = kiln::float8_linear(x, w);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{2, 24, 40}));
  y.backward(g);
  const kiln::Float8Tensor qx = kiln::to_float8(x0.reshape({-1, 96}), at::kFloat8_e4m3fn);
  const kiln::Float8Tensor qw = kiln::to_float8(w0, at::kFloat8_e4m3fn);
  const kiln::Float8Tensor qg = kiln::to_float8(g.reshape({-1, 40}), at::kFloat8_e5m2);
  const at::Tensor y_ref = at::mm(qx.dequantized(), qw.dequantized().t()).view({2, 24, 40});
  const at::Tensor dx_ref = at::mm(qg.dequantized(), qw.dequantized()).view({2, 24, 96});
  const at::Tensor dw_ref = at::mm(qg.dequantized().t(), qx.dequantized());
  std::printf("float8 linear against its quantised operands: y %.1e, dx %.1e, dw %.1e; against fp32: y %.1e\n",
              rel(y, y_ref), rel(x.grad(), dx_ref), rel(w.grad(), dw_ref), rel(y, at::matmul(x0, w0.t())));
  EXPECT_LE(rel(y, y_ref), 1e-5);
  EXPECT_LE(rel(x.grad(), dx_ref), 1e-5);
  EXPECT_LE(rel(w.grad(), dw_ref), 1e-5);
  const double exact = rel(y, at::matmul(x0, w0.t()));
  EXPECT_GT(exact, 1e-4);
  EXPECT_LT(exact, 0.1);

  at::Tensor xb = x0.to(at::kBFloat16).requires_grad_(true), wb = w0.clone().requires_grad_(true);
  const at::Tensor yb = kiln::float8_linear(xb, wb);
  EXPECT_EQ(yb.scalar_type(), at::kBFloat16);
  yb.backward(g.to(at::kBFloat16));
  EXPECT_EQ(xb.grad().scalar_type(), at::kBFloat16);
  EXPECT_EQ(wb.grad().scalar_type(), at::kFloat);
  // against the products of its own quantised operands (x rounded to bf16 first): bf16's rounding of
  // the output, half of 2^-7 relative at most
  const at::Tensor yb_ref = at::mm(kiln::to_float8(x0.to(at::kBFloat16).reshape({-1, 96}), at::kFloat8_e4m3fn).dequantized(),
                                   qw.dequantized().t()).view({2, 24, 40});
  EXPECT_LE(rel(yb.to(at::kFloat), yb_ref), 1.0 / 256);
}

// The bias rides in the product (one rounding of y), db = the gradient's column sums; the
// gradient's format is the scaling's (e4m3 here: the largest gradient on 448).
TEST(Float8, BiasAndTheGradientFormat) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor x0 = at::randn({24, 32}, gen), w0 = at::randn({48, 32}, gen) * 0.1, b0 = at::randn({48}, gen);
  const at::Tensor g = at::randn({24, 48}, gen);
  at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
  kiln::Float8Scaling s = kiln::float8_tensorwise();
  s.grad_dtype = kiln::float8_grad_dtype("e4m3");
  const at::Tensor y = kiln::float8_linear(x, w, b, s);
  y.backward(g);
  const kiln::Float8Tensor qx = kiln::to_float8(x0, at::kFloat8_e4m3fn), qw = kiln::to_float8(w0, at::kFloat8_e4m3fn);
  const kiln::Float8Tensor qg = kiln::to_float8(g, at::kFloat8_e4m3fn);
  EXPECT_LE(rel(y, at::mm(qx.dequantized(), qw.dequantized().t()) + b0), 1e-5);
  EXPECT_LE(rel(x.grad(), at::mm(qg.dequantized(), qw.dequantized())), 1e-5);
  EXPECT_LE(rel(w.grad(), at::mm(qg.dequantized().t(), qx.dequantized())), 1e-5);
  EXPECT_LE(rel(b.grad(), g.sum(0)), 1e-6);
  EXPECT_THROW(kiln::float8_grad_dtype("e3m4"), kiln::ConfigError);
}

// |y - ref| within bf16's rounding of ref element by element (half a unit in the last of bf16's 8
// significant bits: 2^-8 relative), plus fp32 summation order (1e-5 of the largest): <= 1 passes.
double in_bf16_rounding(const at::Tensor& y, const at::Tensor& ref) {
  const at::Tensor r = ref.to(at::kDouble), d = (y.to(at::kDouble) - r).abs();
  return (d / (r.abs() * std::ldexp(1.0, -8) + 1e-5 * r.abs().max())).max().item<double>();
}

// The rowwise recipe's three products: each equals the fp32 product of its operands quantised
// along the product's non-contracted dims -- x and W by rows for y (a scale per token, per output
// row), g by rows and W by columns for dX, g and x by columns (a scale per feature, over the
// tokens) for dW -- rounded once to bf16 (the rowwise GEMM's output). 40 rows: dW's contracted dim
// padded to 48 with zero rows. The gradients in e4m3 (the recipe's default).
TEST(Float8, RowwiseLinearEqualsTheProductsOfItsQuantisedOperands) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(13);
  const at::Tensor x0 = at::randn({2, 20, 96}, gen), w0 = at::randn({48, 96}, gen) * 0.1, b0 = at::randn({48}, gen), g = at::randn({2, 20, 48}, gen);
  at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
  const kiln::Float8Scaling s = kiln::float8_rowwise();
  EXPECT_EQ(s.grad_dtype, at::kFloat8_e4m3fn);
  const at::Tensor y = kiln::float8_linear(x, w, b, s);
  EXPECT_EQ(y.scalar_type(), at::kFloat);
  y.backward(g);
  const at::Tensor x2 = x0.reshape({-1, 96}), g2 = g.reshape({-1, 48});
  auto deq = [](const at::Tensor& t, int64_t dim) { return kiln::to_float8_along(t, at::kFloat8_e4m3fn, dim).dequantized(); };
  EXPECT_EQ(kiln::to_float8_along(x2, at::kFloat8_e4m3fn, 1).scale.sizes(), (std::vector<int64_t>{40, 1}));
  EXPECT_EQ(kiln::to_float8_along(x2, at::kFloat8_e4m3fn, 0).scale.sizes(), (std::vector<int64_t>{1, 96}));
  const at::Tensor y_ref = at::mm(deq(x2, 1), deq(w0, 1).t()) + b0.to(at::kBFloat16).to(at::kFloat);
  const at::Tensor dx_ref = at::mm(deq(g2, 1), deq(w0, 0));
  const at::Tensor dw_ref = at::mm(deq(g2, 0).t(), deq(x2, 0));
  const double ey = in_bf16_rounding(y.reshape({-1, 48}), y_ref), edx = in_bf16_rounding(x.grad().reshape({-1, 96}), dx_ref),
               edw = in_bf16_rounding(w.grad(), dw_ref);
  std::printf("rowwise linear against its quantised operands (1 = bf16's rounding): y %.2f, dx %.2f, dw %.2f\n", ey, edx, edw);
  EXPECT_LE(ey, 1.0);
  EXPECT_LE(edx, 1.0);
  EXPECT_LE(edw, 1.0);
  EXPECT_LE(rel(b.grad(), g2.sum(0)), 1e-6);
  // the tensorwise quantisation of the same operands is another product (the check can fail)
  EXPECT_GT(in_bf16_rounding(y.reshape({-1, 48}), at::mm(kiln::to_float8(x2, at::kFloat8_e4m3fn).dequantized(),
                                                         kiln::to_float8(w0, at::kFloat8_e4m3fn).dequantized().t()) + b0), 1.0);
}

// Why rowwise: one token 10^5 times larger than the rest (an outlier activation) sets the
// tensorwise scale, and the other tokens fall below e4m3's smallest normal (2^-6; theirs land near
// 448 x 10^-5 ~ 2^-8) into its subnormals (steps of 2^-9: a bit or two left); a scale per row keeps
// their 3 mantissa bits. (At 10^4 they stay normal, and tensorwise loses nothing: 3.9e-2 against
// rowwise's 4.2e-2 here.) The other rows' error against the exact product, relative to their largest.
TEST(Float8, RowwiseKeepsTheRowsBesideAnOutlier) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(15);
  at::Tensor x = at::randn({32, 64}, gen);
  const at::Tensor w = at::randn({32, 64}, gen) * 0.1;
  x[0] *= 1e5;
  const at::Tensor exact = at::mm(x, w.t()).narrow(0, 1, 31);
  const double tensorwise = rel(kiln::float8_linear(x, w).narrow(0, 1, 31), exact);
  const double rowwise = rel(kiln::float8_linear(x, w, at::Tensor(), kiln::float8_rowwise()).narrow(0, 1, 31), exact);
  std::printf("the rows beside an outlier: tensorwise %.1e, rowwise %.1e\n", tensorwise, rowwise);
  EXPECT_LT(rowwise, 0.05);
  EXPECT_GT(tensorwise, 3 * rowwise);
}

// Two ranks' parts of a tensor, by hand: each part's reducer returns the elementwise maximum of
// its amax and the other part's amax of the same call (the i-th call of each part quantises the
// same operand along the same dim: the code path is the same). The parts' own amaxes are recorded
// in a first pass without reductions; they do not depend on the reductions (x, W and g are given).
struct TwoParts {
  std::vector<at::Tensor> seen[2];
  size_t next[2] = {0, 0};
  kiln::AmaxReduce reducer(int r, bool record) {
    return [this, r, record](const at::Tensor& amax) {
      if (record) {
        seen[r].push_back(amax.clone());
        return amax;
      }
      const at::Tensor other = seen[1 - r].at(next[r]++);
      EXPECT_EQ(other.sizes(), amax.sizes());
      return at::maximum(amax, other);
    };
  }
};

// A layer split in two as tp and cp split it, against the whole layer, for both recipes:
//   n  column-parallel (tp): W's rows, y's and g's columns in two parts;
//   k  row-parallel (tp): W's and x's columns; y and dX summed over the parts;
//   m  the rows (cp's sequence): x's and g's rows; dW summed over the parts.
// With the group's amax (Float8Scaling's reducer for the split dim) each part quantises as the
// whole layer does: the parts' y, dX and dW equal the whole's (concatenated or summed) within fp32
// summation order -- the products are the same quantised values -- and the output's rounding where
// it is summed (bf16 under rowwise: two roundings, 2^-7). Without the reducer the parts' scales
// differ (over 3x the bound: the check that the comparison can fail).
TEST(Float8, SplitLayerWithTheGroupsAmaxEqualsTheWholeLayer) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  const at::Tensor x0 = at::randn({32, 64}, gen), w0 = at::randn({64, 64}, gen) * 0.1, g = at::randn({32, 64}, gen);
  // The largest entries in part 0 of every split, so that part 1's own amaxes are smaller.
  w0[3][5] = 2.0, x0[2][7] = 9.0, g[1][4] = 8.0;
  for (const bool rowwise : {false, true}) {
    const kiln::Float8Scaling base = rowwise ? kiln::float8_rowwise() : kiln::float8_tensorwise();
    at::Tensor xw = x0.clone().requires_grad_(true), ww = w0.clone().requires_grad_(true);
    const at::Tensor yw = kiln::float8_linear(xw, ww, at::Tensor(), base);
    yw.backward(g);
    for (const char dim : {'n', 'k', 'm'}) {
      // this part's x, W and g
      auto part = [&](int r) {
        const int64_t o = 32 * r, h = dim == 'm' ? 16 : 32;
        if (dim == 'n') return std::make_tuple(x0, w0.narrow(0, o, 32), g.narrow(1, o, 32));
        if (dim == 'k') return std::make_tuple(x0.narrow(1, o, 32), w0.narrow(1, o, 32), g);
        return std::make_tuple(x0.narrow(0, r * h, h), w0, g.narrow(0, r * h, h));
      };
      for (const bool reduce : {true, false}) {
        TwoParts parts;
        at::Tensor y[2], dx[2], dw[2];
        for (const bool record : {true, false}) {
          if (record && !reduce) continue;
          for (int r = 0; r < 2; ++r) {
            kiln::Float8Scaling s = base;
            if (reduce) (dim == 'n' ? s.n : dim == 'k' ? s.k : s.m) = parts.reducer(r, record);
            auto [xp, wp, gp] = part(r);
            at::Tensor x = xp.clone().requires_grad_(true), w = wp.clone().requires_grad_(true);
            y[r] = kiln::float8_linear(x, w, at::Tensor(), s);
            y[r].backward(gp);
            dx[r] = x.grad(), dw[r] = w.grad();
          }
        }
        const at::Tensor y_all = dim == 'k' ? y[0] + y[1] : at::cat({y[0], y[1]}, dim == 'n' ? 1 : 0);
        const at::Tensor dx_all = dim == 'n' ? dx[0] + dx[1] : at::cat({dx[0], dx[1]}, dim == 'k' ? 1 : 0);
        const at::Tensor dw_all = dim == 'm' ? dw[0] + dw[1] : at::cat({dw[0], dw[1]}, dim == 'n' ? 0 : 1);
        const double worst = std::max({rel(y_all, yw.detach()), rel(dx_all, xw.grad()), rel(dw_all, ww.grad())});
        // fp32 sums in another order; under rowwise the products round to bf16, and a sum of two
        // parts' bf16 outputs is within two bf16 roundings of the whole's (2^-8 relative each)
        const double bound = rowwise ? 1.0 / 128 : 1e-6;
        std::printf("%s split over %c, %s reduction: worst %.1e\n", rowwise ? "rowwise" : "tensorwise", dim, reduce ? "with" : "without", worst);
        if (reduce) {
          EXPECT_LE(worst, bound) << rowwise << " " << dim;
        } else {
          EXPECT_GT(worst, 3 * bound) << rowwise << " " << dim;
        }
      }
    }
  }
}

// The weight's 8-bit forms kept for an optimizer step (Float8WeightCache): the products with the
// kept forms equal the ones quantised at each use, bit for bit (forward, dX, dW; both recipes),
// the kept forms are made once (W changed inside a step is not seen -- the trainer's contract: no
// change inside a step) and made again when the clock moves; a layer in eval mode quantises afresh.
TEST(Float8, TheWeightKeptForAStepEqualsItsQuantisationAtEachUse) {
  for (const bool rowwise : {false, true}) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
    const at::Tensor x0 = at::randn({2, 24, 96}, gen).to(at::kBFloat16), w0 = (at::randn({48, 96}, gen) * 0.1).to(at::kBFloat16);
    const at::Tensor g = at::randn({2, 24, 48}, gen).to(at::kBFloat16);
    kiln::Float8Scaling plain = rowwise ? kiln::float8_rowwise() : kiln::float8_tensorwise(), kept = plain;
    auto clock = std::make_shared<int64_t>(0);
    kept.cache = std::make_shared<kiln::Float8WeightCache>();
    kept.cache->clock = clock;
    auto run = [&](const at::Tensor& wv, const kiln::Float8Scaling& s) {
      at::Tensor x = x0.clone().requires_grad_(true), w = wv.clone().requires_grad_(true);
      const at::Tensor y = kiln::float8_linear(x, w, at::Tensor(), s);
      y.backward(g);
      return std::vector<at::Tensor>{y, x.grad(), w.grad()};
    };
    const auto want = run(w0, plain);
    for (int micro = 0; micro < 2; ++micro) {  // the first makes the forms, the second reads them
      const auto got = run(w0, kept);
      for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(at::equal(got[i], want[i])) << (rowwise ? "rowwise" : "tensorwise") << ", micro " << micro << ", output " << i;
    }
    EXPECT_EQ(kept.cache->at, 0);
    const at::Tensor kept_q = kept.cache->q.data;
    const at::Tensor w1 = w0 * 2;  // W changed without a new step: the kept forms stay
    EXPECT_TRUE(at::equal(run(w1, kept)[0], want[0]));
    EXPECT_TRUE(kept.cache->q.data.is_same(kept_q));
    ++*clock;  // a new step: made again, from the new W
    EXPECT_TRUE(at::equal(run(w1, kept)[0], run(w1, plain)[0]));
    EXPECT_FALSE(at::equal(run(w1, plain)[0], want[0]));
    EXPECT_EQ(kept.cache->at, 1);
    // The transpose dX takes is written once (tensorwise: column-major q_W; rowwise: W by columns).
    const at::Tensor& t = kept.cache->t.data;
    EXPECT_EQ(t.sizes(), w0.sizes());
    if (!rowwise) EXPECT_TRUE(t.stride(0) == 1 && t.stride(1) == 48 && at::equal(t.to(at::kFloat), kept.cache->q.data.to(at::kFloat)));
    else EXPECT_EQ(kept.cache->t.scale.sizes(), (std::vector<int64_t>{1, 96}));

    // The model's layer: in eval mode (an evaluation, a sample -- run between an update and the
    // next step) it quantises W afresh and leaves the kept forms alone.
    at::NoGradGuard no_grad;
    kiln::LinearImpl layer(96, 48, at::TensorOptions().dtype(at::kBFloat16), /*with_bias=*/false);
    layer.weight.copy_(w0);
    layer.float8 = kept;
    ++*clock;
    const at::Tensor before = layer.forward(x0);  // training mode: makes the forms from w0
    layer.weight.mul_(2);                         // the update
    layer.eval();
    EXPECT_TRUE(at::equal(layer.forward(x0), kiln::float8_linear(x0, w1, at::Tensor(), plain)));
    layer.train();
    EXPECT_TRUE(at::equal(layer.forward(x0), before));  // still the step's forms until the clock moves
  }
}

// ZB-H1's split backward (parallel/backward_split.h) asks a float8 layer for dX in its input pass
// and for dW in a later weight pass: g is quantised -- its amax reduced over n, the tp all-reduce
// of a column layer -- once, in the first pass, and kept for the second; the two passes' gradients
// equal one backward's, bit for bit.
TEST(Float8, SplitBackwardQuantisesTheGradientOnce) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(13);
  const at::Tensor x0 = at::randn({2, 16, 32}, gen).to(at::kBFloat16), w0 = (at::randn({48, 32}, gen) * 0.1).to(at::kBFloat16);
  const at::Tensor g = at::randn({2, 16, 48}, gen).to(at::kBFloat16);
  int reductions = 0;  // the n reducer: W's amax in the forward, g's in the backward
  kiln::Float8Scaling s = kiln::float8_tensorwise();
  s.n = [&reductions](const at::Tensor& amax) {
    ++reductions;
    return amax;
  };
  at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  kiln::float8_linear(x, w, at::Tensor(), s).backward(g);
  EXPECT_EQ(reductions, 2);
  reductions = 0;
  at::Tensor xs = x0.clone().requires_grad_(true), ws = w0.clone().requires_grad_(true);
  const at::Tensor y = kiln::float8_linear(xs, ws, at::Tensor(), s);
  kiln::SplitBackward split;
  const at::Tensor dx = split.input_pass(y, g, xs, {ws});
  EXPECT_FALSE(ws.grad().defined());  // the weight pass's
  split.weight_pass();
  EXPECT_EQ(reductions, 2);  // not 3: g once
  EXPECT_TRUE(at::equal(dx, x.grad()));
  EXPECT_TRUE(at::equal(ws.grad(), w.grad()));
}

TEST(Float8, SizeFilter) {
  EXPECT_TRUE(kiln::float8_layer_eligible(768, 3072, true));    // GPT-2 124M's mlp.c_proj
  EXPECT_FALSE(kiln::float8_layer_eligible(2304, 768, true));   // its c_attn: no gain measured
  EXPECT_TRUE(kiln::float8_layer_eligible(2304, 768, false));
  EXPECT_TRUE(kiln::float8_layer_eligible(8192, 2048, true));
  EXPECT_FALSE(kiln::float8_layer_eligible(100, 64, false));    // _scaled_mm's multiples of 16
}

// kernels/matmul.h's entry with float8 on, under CPU autocast: the output in autocast's dtype,
// the fp32 weight's gradient fp32.
TEST(Float8, LinearProductUnderAutocast) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  at::Tensor x = at::randn({2, 8, 32}, gen).requires_grad_(true), w = (at::randn({48, 32}, gen) * 0.1).requires_grad_(true);
  at::Tensor b = at::randn({48}, gen).requires_grad_(true);
  const kiln::Float8Scaling s = kiln::float8_tensorwise();
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  at::autocast::set_autocast_enabled(at::kCPU, true);
  const at::Tensor y = kiln::linear_product(x, w, b, &s);
  at::autocast::set_autocast_enabled(at::kCPU, false);
  at::autocast::clear_cache();
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  y.sum().backward();
  EXPECT_EQ(w.grad().scalar_type(), at::kFloat);
  EXPECT_EQ(b.grad().scalar_type(), at::kFloat);
  EXPECT_EQ(x.grad().scalar_type(), at::kFloat);
  const at::Tensor ref = at::mm(kiln::to_float8(x.detach().to(at::kBFloat16).reshape({-1, 32}), at::kFloat8_e4m3fn).dequantized(),
                                kiln::to_float8(w.detach(), at::kFloat8_e4m3fn).dequantized().t()) +
                         b.detach().to(at::kBFloat16).to(at::kFloat);
  EXPECT_LE(rel(y.reshape({-1, 48}).to(at::kFloat), ref), 1.0 / 256);
}

#ifdef KILN_WITH_KERNELS
// The quantisation kernels' element math (kernels/float8_math.cuh) on the host, against the
// composite path's ops: the max over abs_bits is torch.max of |x| (NaN wins, then inf); the
// prescaled value is (x / s).clamp(-fmax, fmax) bit for bit, NaN kept; and CUDA's cast
// (__nv_cvt_float_to_fp8, satfinite, which cuda_fp8.h also compiles for the host) gives LibTorch's
// float8 bits for every bf16 value and a million fp32 ones in range, both formats -- so the
// kernels' bytes are the reference's (gpu.kernels checks them on the device).
TEST(Float8, KernelMathMatchesTheCompositeOps) {
  namespace kk = kiln::kernels;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  at::Tensor x = at::randn({4096}, gen) * 100;
  for (const float special : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
    at::Tensor y = x.clone();
    y[77] = special;
    y[78] = -special;
    uint32_t m = 0;
    for (int64_t i = 0; i < y.numel(); ++i) m = std::max(m, kk::abs_bits(y[i].item<float>()));
    const float want = y.abs().max().item<float>();
    EXPECT_TRUE(std::isnan(want) ? std::isnan(kk::from_bits(m)) : kk::from_bits(m) == want) << want;
  }
  uint32_t m = 0;
  for (int64_t i = 0; i < x.numel(); ++i) m = std::max(m, kk::abs_bits(x[i].item<float>()));
  EXPECT_EQ(kk::from_bits(m), x.abs().max().item<float>());
  const float s = 0.37f;
  at::Tensor v = x.clone();
  v[5] = std::nanf("");
  const at::Tensor ref = (v / s).clamp(-448.0, 448.0);
  for (int64_t i = 0; i < v.numel(); ++i) {
    const float got = kk::float8_prescaled(v[i].item<float>(), s, 448.0f), want = ref[i].item<float>();
    ASSERT_TRUE(std::isnan(want) ? std::isnan(got) : got == want) << i << " " << got << " " << want;
  }
  // the cast
  std::vector<float> values;
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = kk::from_bits(b << 16);  // every bf16 value
    if (std::isfinite(f)) values.push_back(f);
  }
  const at::Tensor r = at::rand({1 << 20}, gen) * 2 - 1;
  for (int64_t i = 0; i < r.numel(); ++i) values.push_back(r.data_ptr<float>()[i] * (i % 2 ? 448.0f : 0.02f));
  int64_t differ = 0;
  for (const float f : values) {
    const float e4 = std::fmin(std::fmax(f, -448.0f), 448.0f), e5 = std::fmin(std::fmax(f, -57344.0f), 57344.0f);
    differ += __nv_cvt_float_to_fp8(e4, __NV_SATFINITE, __NV_E4M3) != c10::Float8_e4m3fn(e4).x;
    differ += __nv_cvt_float_to_fp8(e5, __NV_SATFINITE, __NV_E5M2) != c10::Float8_e5m2(e5).x;
  }
  std::printf("float8 casts compared: %zu values, both formats; %lld differ\n", values.size(), static_cast<long long>(differ));
  EXPECT_EQ(differ, 0);
}
#endif
