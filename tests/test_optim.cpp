// tests/test_optim.cpp -- AdamW against the update written out by hand, the LR schedule at
// values worked out by hand, and global-norm clipping.
#include <cmath>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "optim/adamw.h"
#include "optim/grad_clip.h"
#include "optim/lr_schedule.h"

namespace {

// AdamW (Loshchilov & Hutter) in double precision, one tensor.
struct RefAdamW {
  at::Tensor p, m, v;
  int t = 0;
  void step(const at::Tensor& g, double lr, double b1, double b2, double eps, double wd) {
    ++t;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    p = p * (1 - lr * wd);
    auto mhat = m / (1 - std::pow(b1, t));
    auto vhat = v / (1 - std::pow(b2, t));
    p = p - lr * mhat / (vhat.sqrt() + eps);
  }
};

}  // namespace

TEST(AdamW, MatchesHandWrittenUpdateWithDecayOnMatricesOnly) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  auto w = at::randn({5, 3}, gen).requires_grad_(true);  // matrix: decayed
  auto b = at::randn({3}, gen).requires_grad_(true);     // bias: not decayed
  kiln::AdamWConfig cfg{0.9, 0.95, 1e-8, 0.1};
  kiln::AdamW opt({w, b}, cfg);
  RefAdamW rw{w.detach().to(at::kDouble), at::zeros({5, 3}, at::kDouble), at::zeros({5, 3}, at::kDouble)};
  RefAdamW rb{b.detach().to(at::kDouble), at::zeros({3}, at::kDouble), at::zeros({3}, at::kDouble)};
  const double lrs[] = {1e-2, 5e-3, 2e-2, 1e-3};
  for (double lr : lrs) {
    auto gw = at::randn({5, 3}, gen), gb = at::randn({3}, gen);
    w.mutable_grad() = gw.clone();
    b.mutable_grad() = gb.clone();
    opt.step(lr);
    rw.step(gw.to(at::kDouble), lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay);
    rb.step(gb.to(at::kDouble), lr, cfg.beta1, cfg.beta2, cfg.eps, 0.0);
    // fp32 kernel against the fp64 formula: a few ulps of the parameter's magnitude.
    EXPECT_TRUE(at::allclose(w.detach().to(at::kDouble), rw.p, 1e-6, 1e-7));
    EXPECT_TRUE(at::allclose(b.detach().to(at::kDouble), rb.p, 1e-6, 1e-7));
  }
  EXPECT_EQ(opt.steps_taken(), 4);
}

TEST(AdamW, DecayAloneShrinksMatricesNotBiases) {
  // With a zero gradient Adam's step is 0/(0+eps) = 0, so only the decay acts: p *= 1 - lr wd.
  auto w = at::ones({2, 2}).requires_grad_(true);
  auto b = at::ones({2}).requires_grad_(true);
  kiln::AdamW opt({w, b}, kiln::AdamWConfig{0.9, 0.95, 1e-8, 0.5});
  w.mutable_grad() = at::zeros({2, 2});
  b.mutable_grad() = at::zeros({2});
  opt.step(0.1);
  EXPECT_TRUE(at::allclose(w.detach(), at::full({2, 2}, 0.95)));
  EXPECT_TRUE(at::equal(b.detach(), at::ones({2})));
}

TEST(AdamW, ParametersWithoutGradientAreUntouched) {
  auto w = at::ones({2, 2}).requires_grad_(true);
  auto frozen = at::ones({2, 2}).requires_grad_(true);
  kiln::AdamW opt({w, frozen}, kiln::AdamWConfig{});
  w.mutable_grad() = at::ones({2, 2});
  opt.step(0.1);
  EXPECT_FALSE(at::equal(w.detach(), at::ones({2, 2})));
  EXPECT_TRUE(at::equal(frozen.detach(), at::ones({2, 2})));
}

TEST(LRSchedule, WarmupCosineFloor) {
  kiln::LRSchedule s{1.0, 0.1, 10, 110};
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);   // (0 + 1) / 10
  EXPECT_DOUBLE_EQ(s.at(4), 0.5);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);  // cosine starts at the peak
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);  // halfway: min + (max - min) / 2
  EXPECT_NEAR(s.at(35), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-12);
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.at(1000), 0.1);
  kiln::LRSchedule no_warmup{2.0, 0.0, 0, 4};
  EXPECT_DOUBLE_EQ(no_warmup.at(0), 2.0);
  EXPECT_NEAR(no_warmup.at(2), 1.0, 1e-12);
}

TEST(GradClip, NormAndScaling) {
  auto a = at::zeros({2}).requires_grad_(true);
  auto b = at::zeros({1}).requires_grad_(true);
  auto c = at::zeros({3}).requires_grad_(true);  // no gradient: left out
  a.mutable_grad() = at::tensor({3.0f, 0.0f});
  b.mutable_grad() = at::tensor({4.0f});
  EXPECT_NEAR(kiln::grad_norm({a, b, c}).item<double>(), 5.0, 1e-6);
  // Above the limit: scaled to norm 1 (up to the 1e-6 guard).
  auto n = kiln::clip_grad_norm({a, b, c}, 1.0);
  EXPECT_NEAR(n.item<double>(), 5.0, 1e-6);
  EXPECT_NEAR(a.grad()[0].item<double>(), 0.6, 1e-6);
  EXPECT_NEAR(b.grad()[0].item<double>(), 0.8, 1e-6);
  // Below the limit: untouched.
  kiln::clip_grad_norm({a, b}, 10.0);
  EXPECT_NEAR(b.grad()[0].item<double>(), 0.8, 1e-6);
  // Off: the norm is still reported.
  EXPECT_NEAR(kiln::clip_grad_norm({a, b}, 0.0).item<double>(), 1.0, 1e-5);
}
