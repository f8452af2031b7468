// tests/test_float8.cpp -- the float8 recipe's numerics on the CPU (models/float8.h; issue 52's
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
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "models/float8.h"

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
