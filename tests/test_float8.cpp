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
//     of its own quantised operands within bf16's rounding.
#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

#include "distributed/error.h"
#include "kernels/float8.h"
#include "kernels/matmul.h"

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

// A column-split layer (tp 2 by hand: W's rows and so y's columns and g's columns in two parts)
// with the group's amax for W and g (Float8Scaling's reducers, here the max over both parts):
// each part's y columns and dW rows equal the whole layer's (within fp32 summation order), and the parts' dX sum to its dX
// (fp32 sums in another order). Without the reducers the parts' scales differ (the check that
// the comparison can fail).
TEST(Float8, SplitLayerWithTheGroupsAmaxEqualsTheWholeLayer) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  const at::Tensor x0 = at::randn({16, 32}, gen), w0 = at::randn({64, 32}, gen) * 0.1, g = at::randn({16, 64}, gen);
  w0[3][5] = 2.0;  // the largest weight in part 0, so part 1's own amax is smaller
  at::Tensor xw = x0.clone().requires_grad_(true), ww = w0.clone().requires_grad_(true);
  const at::Tensor yw = kiln::float8_linear(xw, ww);
  yw.backward(g);
  const at::Tensor wparts[2] = {w0.narrow(0, 0, 32), w0.narrow(0, 32, 32)};
  const at::Tensor gparts[2] = {g.narrow(1, 0, 32), g.narrow(1, 32, 32)};
  auto other_max = [](const at::Tensor& mine_whole) {  // the group's amax of a tensor split in two
    return kiln::AmaxReduce([mine_whole](const at::Tensor&) { return mine_whole.abs().max().to(at::kFloat); });
  };
  for (bool reduce : {true, false}) {
    at::Tensor dx = at::zeros_like(x0);
    double worst = 0.0;
    for (int r = 0; r < 2; ++r) {
      kiln::Float8Scaling s = kiln::float8_tensorwise();
      if (reduce) s.w_amax = other_max(w0), s.g_amax = other_max(g);
      at::Tensor x = x0.clone().requires_grad_(true), w = wparts[r].clone().requires_grad_(true);
      const at::Tensor y = kiln::float8_linear(x, w, at::Tensor(), s);
      y.backward(gparts[r]);
      worst = std::max({worst, rel(y, yw.narrow(1, 32 * r, 32)), rel(w.grad(), ww.grad().narrow(0, 32 * r, 32))});
      dx += x.grad();
    }
    if (reduce) {
      EXPECT_LE(worst, 1e-6);  // the same quantised values; fp32 sums, perhaps in another order
      EXPECT_LE(rel(dx, xw.grad()), 1e-6);
    } else {
      EXPECT_GT(worst, 1e-4);
    }
  }
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
