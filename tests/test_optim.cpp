// tests/test_optim.cpp -- AdamW against the update written out by hand, the LR schedule at
// values worked out by hand, global-norm clipping, and the FP16 loss scaler's sequences of
// scale, skip and growth against DeepSpeed's rule worked out by hand.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "distributed/error.h"
#include "optim/adamw.h"
#include "optim/grad_clip.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "parallel/main_grads.h"

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

// found_inf (the step's verdict as a tensor, no host read): 1 skips the update inside the fused
// kernel -- weights, moments and step counts as before -- and the next clean step is the one an
// optimizer that never saw the skipped step would take (bias correction at t = 1, not 2).
TEST(AdamW, FoundInfSkipsTheUpdateOnTheDevice) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  auto w = at::randn({4, 3}, gen).requires_grad_(true);
  auto w_ref = w.detach().clone().requires_grad_(true);
  kiln::AdamW opt({w}, kiln::AdamWConfig{}), ref({w_ref}, kiln::AdamWConfig{});
  const auto before = w.detach().clone();
  w.mutable_grad() = at::full({4, 3}, std::numeric_limits<float>::infinity());
  opt.step(1e-2, at::ones({}));  // skipped
  EXPECT_TRUE(at::equal(w.detach(), before));
  EXPECT_TRUE(at::equal(opt.state_of(w).exp_avg, at::zeros({4, 3})));
  EXPECT_EQ(opt.state_of(w).step.item<float>(), 0.0f);
  const auto g = at::randn({4, 3}, gen);
  w.mutable_grad() = g.clone();
  w_ref.mutable_grad() = g.clone();
  opt.step(1e-2, at::zeros({}));  // applied
  ref.step(1e-2);
  EXPECT_TRUE(at::equal(w.detach(), w_ref.detach()));
  EXPECT_EQ(opt.state_of(w).step.item<float>(), 1.0f);
}

// 16-bit working weights (optim/adamw.h): the fp32 masters take exactly fp32 AdamW's steps on
// the same fp32 gradients, and the working copies are their round-to-nearest bf16 / fp16.
TEST(AdamW, SixteenBitWorkingWeightsKeepFp32Masters) {
  for (const at::ScalarType working : {at::kBFloat16, at::kHalf}) {
    at::manual_seed(3);
    auto w32 = at::randn({16, 8}).requires_grad_(true), b32 = at::randn({8}).requires_grad_(true);
    auto w16 = w32.detach().clone().requires_grad_(true), b16 = b32.detach().clone().requires_grad_(true);
    const kiln::AdamWConfig cfg{0.9, 0.95, 1e-8, 0.1};
    kiln::AdamW fp32({w32, b32}, cfg), mixed({w16, b16}, cfg, working);
    ASSERT_TRUE(mixed.has_masters());
    EXPECT_EQ(w16.scalar_type(), working);  // the model's parameter, cast
    const at::Tensor master = mixed.state_of(w16).master;
    EXPECT_EQ(master.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(master, w32.detach()));  // made from the fp32 values, before the cast
    EXPECT_TRUE(mixed.grad_target(w16).is_same(master));
    EXPECT_TRUE(fp32.grad_target(w32).is_same(w32));
    for (int step = 0; step < 3; ++step) {
      const auto gw = at::randn({16, 8}), gb = at::randn({8});
      w32.mutable_grad() = gw.clone();
      b32.mutable_grad() = gb.clone();
      mixed.grad_target(w16).mutable_grad() = gw.clone();
      mixed.grad_target(b16).mutable_grad() = gb.clone();
      fp32.step(1e-2);
      mixed.step(1e-2);
      EXPECT_TRUE(at::equal(master, w32.detach())) << step;
      EXPECT_TRUE(at::equal(mixed.state_of(b16).master, b32.detach())) << step;
      EXPECT_TRUE(at::equal(w16.detach(), w32.detach().to(working))) << step;
      EXPECT_TRUE(at::equal(b16.detach(), b32.detach().to(working))) << step;
    }
    EXPECT_FALSE(at::equal(w16.detach().to(at::kFloat), master));  // the working copy is a rounding
  }
}

// parallel/main_grads.h: each backward's bf16 gradient is added into the fp32 main grad at once
// and freed. 1 + 2^-9 has no bf16 (8-bit mantissa) spelling -- accumulated in bf16 it would stay
// 1 -- and is exact in fp32.
TEST(MainGrads, AccumulateInFp32AndFreeThe16BitGradient) {
  auto w = at::ones({4}).requires_grad_(true);
  kiln::AdamW opt({w}, kiln::AdamWConfig{}, at::kBFloat16);
  kiln::MainGrads main({w}, opt.grad_targets());
  main.zero_grad();
  (w * 1.0).sum().backward();
  EXPECT_FALSE(w.grad().defined());  // moved into the main grad
  (w * std::ldexp(1.0, -9)).sum().backward();
  const at::Tensor g = opt.grad_target(w).grad();
  EXPECT_EQ(g.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(g, at::full({4}, 1.0 + std::ldexp(1.0, -9))));
  EXPECT_TRUE(at::equal((at::ones({4}, at::kBFloat16) + at::full({4}, std::ldexp(1.0, -9), at::kBFloat16)).to(at::kFloat), at::ones({4})));
  main.zero_grad();
  EXPECT_TRUE(at::equal(opt.grad_target(w).grad(), at::zeros({4})));
}

// optim/adamw.h's read_working_grads: with nothing to accumulate, AdamW reading the 16-bit
// gradients autograd leaves takes the same update, bit for bit, as it does through the fp32 main
// grads (0 + float(g) is float(g)): masters, moments and working copies, with a clip factor and a
// skipped step; the 16-bit gradient stays on the parameter and no main grad is made.
TEST(AdamW, ReadingThe16BitGradientsEqualsTheMainGradPath) {
  for (const at::ScalarType working : {at::kBFloat16, at::kHalf}) {
    at::manual_seed(5);
    const auto w0 = at::randn({16, 8}), b0 = at::randn({8});
    auto wa = w0.clone().requires_grad_(true), ba = b0.clone().requires_grad_(true);
    auto wb = w0.clone().requires_grad_(true), bb = b0.clone().requires_grad_(true);
    const kiln::AdamWConfig cfg{0.9, 0.95, 1e-8, 0.1};
    kiln::AdamW main_path({wa, ba}, cfg, working), direct({wb, bb}, cfg, working);
    direct.read_working_grads();
    ASSERT_TRUE(direct.reads_working_grads());
    EXPECT_TRUE(direct.grad_target(wb).is_same(wb));
    ASSERT_EQ(direct.grad_targets().size(), 2u);
    EXPECT_TRUE(direct.grad_targets()[0].is_same(wb));
    EXPECT_TRUE(direct.grad_targets()[1].is_same(bb));
    kiln::MainGrads main({wa, ba}, main_path.grad_targets());
    for (int step = 0; step < 4; ++step) {
      main.zero_grad();
      wb.mutable_grad() = at::Tensor();
      bb.mutable_grad() = at::Tensor();
      const auto x = at::randn({3, 16}).to(working);
      ((x.matmul(wa) + ba).square().sum() * 0.5).backward();
      ((x.matmul(wb) + bb).square().sum() * 0.5).backward();
      ASSERT_TRUE(wb.grad().defined());
      EXPECT_EQ(wb.grad().scalar_type(), working);
      EXPECT_FALSE(direct.state_of(wb).master.grad().defined());
      // the clip norm over either: the same fp64 sum of the same values
      EXPECT_TRUE(at::equal(kiln::grad_norm(main_path.grad_targets()), kiln::grad_norm(direct.grad_targets()))) << step;
      const at::Tensor factor = at::full({}, 0.37f), skip = at::full({}, step == 2 ? 1.0f : 0.0f);
      main_path.step(1e-2, skip, factor);
      direct.step(1e-2, skip, factor);
      for (const auto& [a, b] : {std::pair{wa, wb}, std::pair{ba, bb}}) {
        const auto sa = main_path.state_of(a), sb = direct.state_of(b);
        EXPECT_TRUE(at::equal(sa.master, sb.master)) << step;
        EXPECT_TRUE(at::equal(sa.exp_avg, sb.exp_avg)) << step;
        EXPECT_TRUE(at::equal(sa.exp_avg_sq, sb.exp_avg_sq)) << step;
        EXPECT_TRUE(at::equal(sa.step, sb.step)) << step;
        EXPECT_TRUE(at::equal(a.detach(), b.detach())) << step;
      }
    }
    EXPECT_EQ(direct.state_of(wb).step.item<float>(), 3.0f);  // step 2 skipped
  }
  // fp32 working weights: nothing to change
  auto w = at::randn({4, 4}).requires_grad_(true);
  kiln::AdamW fp32({w}, kiln::AdamWConfig{});
  fp32.read_working_grads();
  EXPECT_FALSE(fp32.reads_working_grads());
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

TEST(LRSchedule, ConstantAfterWarmup) {
  kiln::LRSchedule s{1.0, 0.1, 4, 100, kiln::LRShape::Constant};
  EXPECT_DOUBLE_EQ(s.at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.at(3), 1.0);
  EXPECT_DOUBLE_EQ(s.at(50), 1.0);
  EXPECT_DOUBLE_EQ(s.at(500), 1.0);
}

// DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR, as DeepSpeed 0.19.8's own classes give
// them update by update (tests/deepspeed/lr_golden.py printed this table; it documents how to
// re-run it). The arithmetic is the same formulas in the same order, so the match is to ~1e-15
// relative; 1e-12 leaves room for another libm's log and cos.
TEST(LRSchedule, DeepSpeedGolden) {
  struct Case {
    const char* name;
    kiln::LRSchedule schedule;
    std::vector<double> lr;  // lr of updates 0, 1, 2, ...
  };
  const std::vector<Case> cases = {
    {"warmup_log", {0.001, 0.0, 10, 0, kiln::LRShape::Warmup, 1e-05, true},
     {1e-05, 1e-05, 0.0003080196957073414, 0.00048235004217246576, 0.0006060393914146827, 0.0007019803042926585, 0.0007803697378798071, 0.0008466470596141142, 0.0009040590871220239, 0.0009547000843449315, 0.0009999999999999998, 0.001, 0.001, 0.001}},
    {"warmup_linear_w1", {0.002, 0.0, 1, 0, kiln::LRShape::Warmup, 0.0, false},
     {0.0, 0.0, 0.001, 0.002, 0.002}},
    {"decay_log", {0.001, 0.0, 5, 20, kiln::LRShape::WarmupDecay, 0.0, true},
     {0.0, 0.0, 0.00043067655807339306, 0.0006826061944859854, 0.0008613531161467861, 0.001, 0.001, 0.0009333333333333333, 0.0008666666666666667, 0.0008, 0.0007333333333333333, 0.0006666666666666666, 0.0006, 0.0005333333333333334, 0.00046666666666666666, 0.0004, 0.0003333333333333333, 0.0002666666666666667, 0.0002, 0.00013333333333333334, 6.666666666666667e-05, 0.0, 0.0, 0.0}},
    {"decay_linear", {0.002, 0.0, 3, 12, kiln::LRShape::WarmupDecay, 0.0001, false},
     {0.0001, 0.0001, 0.0007333333333333333, 0.0013666666666666666, 0.002, 0.001788888888888889, 0.0015777777777777778, 0.0013666666666666666, 0.0011555555555555557, 0.0009444444444444445, 0.0007333333333333333, 0.0005222222222222222, 0.0003111111111111111, 0.0001, 0.0001}},
    {"cosine_log", {0.001, 5e-05, 5, 20, kiln::LRShape::WarmupCosine, 0.0001, true},
     {0.0, 0.0001, 0.0004876089022660538, 0.0007143455750373869, 0.0008752178045321076, 0.001, 0.0009896201103485576, 0.0009589340923802355, 0.0009092830723281, 0.0008428370380204576, 0.0007624999999999999, 0.0006717830723281001, 0.0005746510200521354, 0.0004753489799478646, 0.0003782169276719, 0.0002875000000000001, 0.00020716296197954249, 0.00014071692767190003, 9.106590761976455e-05, 6.0379889651442304e-05, 5e-05, 5e-05, 5e-05, 5e-05}},
    {"cosine_linear", {0.003, 3.0000000000000004e-07, 4, 10, kiln::LRShape::WarmupCosine, 0.0, false},
     {0.0, 0.0, 0.00075, 0.0015, 0.0022500000000000003, 0.0027990582018660904, 0.002250075, 0.00150015, 0.0007502250000000003, 0.0002012417981339096, 3.0000000000000004e-07, 3.0000000000000004e-07}},
  };
  for (const auto& c : cases) {
    for (size_t u = 0; u < c.lr.size(); ++u) {
      const double got = c.schedule.at(static_cast<int64_t>(u)), want = c.lr[u];
      EXPECT_NEAR(got, want, 1e-12 * std::max(1e-3, std::abs(want))) << c.name << " update " << u;
    }
  }
}

TEST(GradClip, NormAndScaling) {
  auto a = at::zeros({2}).requires_grad_(true);
  auto b = at::zeros({1}).requires_grad_(true);
  auto c = at::zeros({3}).requires_grad_(true);  // no gradient: left out
  a.mutable_grad() = at::tensor({3.0f, 0.0f});
  b.mutable_grad() = at::tensor({4.0f});
  EXPECT_NEAR(kiln::grad_norm({a, b, c}).item<double>(), 5.0, 1e-6);
  // The clipping factor (the update applies it, AdamW::step's grad_factor). Above the limit: the
  // gradients scaled to norm 1 (up to the 1e-6 guard).
  const at::Tensor n = kiln::grad_norm({a, b, c});
  const at::Tensor f = kiln::clip_factor(n, 1.0, 1.0);
  EXPECT_EQ(f.scalar_type(), at::kFloat);
  EXPECT_NEAR((a.grad()[0] * f).item<double>(), 0.6, 1e-6);
  EXPECT_NEAR((b.grad()[0] * f).item<double>(), 0.8, 1e-6);
  // Below the limit: 1.
  EXPECT_NEAR(kiln::clip_factor(n, 10.0, 1.0).item<double>(), 1.0, 1e-6);
  // With a loss scale S (the gradients hold S g, n the norm of g): the factor over S; clipping
  // off: 1 / S; off without a scale: nothing to multiply.
  EXPECT_NEAR(kiln::clip_factor(n, 1.0, 4.0).item<double>(), 0.05, 1e-7);
  EXPECT_NEAR(kiln::clip_factor(n, 10.0, 4.0).item<double>(), 0.25, 1e-7);
  EXPECT_NEAR(kiln::clip_factor(n, 0.0, 4.0).item<double>(), 0.25, 1e-7);
  EXPECT_FALSE(kiln::clip_factor(n, 0.0, 1.0).defined());
}

// Scale 16, window 3, hysteresis 2. Each row: overflow in, then expected skip, scale and
// hysteresis left, from the rule in optim/loss_scaler.h applied by hand.
// The weighted sum of squared norms the sharded clippings use (tp, ep, pipeline): one
// multi-tensor norm per distinct weight, equal to the per-tensor sum (within fp64 rounding of the
// order), weight-0 pieces left out, undefined for none.
TEST(GradClip, WeightedSquaredNormEqualsThePerTensorSum) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  std::vector<std::pair<at::Tensor, double>> pieces;
  double want = 0.0;
  const double weights[] = {1.0, 0.5, 1.0, 0.0, 0.25, 0.5};
  for (int i = 0; i < 6; ++i) {
    const at::Tensor t = at::randn({7 + i, 3}, gen);
    pieces.push_back({t, weights[i]});
    want += weights[i] * t.to(at::kDouble).square().sum().item<double>();
  }
  const at::Tensor got = kiln::weighted_sq_norm(pieces);
  EXPECT_EQ(got.scalar_type(), at::kDouble);
  EXPECT_NEAR(got.item<double>(), want, 1e-12 * want);
  EXPECT_FALSE(kiln::weighted_sq_norm({}).defined());
  EXPECT_FALSE(kiln::weighted_sq_norm({{at::ones({3}), 0.0}}).defined());
}

TEST(LossScaler, DynamicSequenceWithHysteresisAndGrowth) {
  kiln::LossScaler s({/*enabled=*/true, /*static_scale=*/0.0, /*initial_scale_power=*/4, /*window=*/3,
                      /*hysteresis=*/2, /*min_scale=*/1.0});
  EXPECT_EQ(s.scale(), 16.0);
  struct Row { bool overflow, skip; double scale; int64_t hyst; };
  const Row rows[] = {
      {false, false, 16, 2},  // iter 0: 1 clean step since iter -1
      {false, false, 16, 2},  // iter 1: 2
      {false, false, 32, 2},  // iter 2: 3 clean steps -> doubles
      {true, true, 32, 1},    // iter 3: first overflow tolerated (hysteresis 2 -> 1), still skipped
      {true, true, 16, 1},    // iter 4: second overflow halves
      {false, false, 16, 1},  // iter 5: clean steps do not restore hysteresis...
      {false, false, 16, 1},  // iter 6
      {false, false, 32, 2},  // iter 7: ...growth does (3 clean since iter 4)
      {true, true, 32, 1},    // iter 8: tolerated
      {false, false, 32, 1},  // iter 9
      {true, true, 16, 1},    // iter 10: hysteresis not reset by one clean step: halves
  };
  int i = 0;
  for (const Row& r : rows) {
    SCOPED_TRACE("iter " + std::to_string(i++));
    EXPECT_EQ(s.update(r.overflow), r.skip);
    EXPECT_EQ(s.scale(), r.scale);
    EXPECT_EQ(s.hysteresis_left(), r.hyst);
  }
}

TEST(LossScaler, HalvesDownToTheMinimumThenRefuses) {
  kiln::LossScaler s({true, 0.0, /*initial_scale_power=*/2, /*window=*/1000, /*hysteresis=*/1, /*min_scale=*/1.0});
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 2.0);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 1.0);
  try {
    s.update(true);
    FAIL() << "overflow at the minimum scale must be an error";
  } catch (const kiln::NumericsError& e) {
    EXPECT_NE(std::string(e.what()).find("minimum loss scale"), std::string::npos) << e.what();
  }
}

TEST(LossScaler, MinimumClampsTheHalving) {
  kiln::LossScaler s({true, 0.0, 3, 1000, 1, /*min_scale=*/5.0});  // 8 -> max(4, 5) = 5
  s.update(true);
  EXPECT_EQ(s.scale(), 5.0);
}

TEST(LossScaler, StaticScaleSkipsButNeverMoves) {
  kiln::LossScaler s({true, /*static_scale=*/128.0, 16, /*window=*/1, 2, 1.0});
  EXPECT_EQ(s.scale(), 128.0);
  EXPECT_FALSE(s.update(false));
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 128.0);
}

TEST(LossScaler, DisabledIsOneAndNeverSkips) {
  kiln::LossScaler s({/*enabled=*/false, 0.0, 16, 1000, 2, 1.0});
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 1.0);
}

TEST(LossScaler, StateCarriesOverOnlyBetweenDynamicScalers) {
  kiln::LossScaler fp16({true, 0.0, 4, 3, 2, 1.0});
  fp16.update(true);
  fp16.update(true);  // scale 8
  kiln::LossScaler bf16({/*enabled=*/false, 0.0, 16, 1000, 2, 1.0});
  bf16.load_state(fp16.state());  // resumed in bf16: no scaling
  EXPECT_EQ(bf16.scale(), 1.0);
  kiln::LossScaler fresh({true, 0.0, 16, 1000, 2, 1.0});
  fresh.load_state(bf16.state());  // an fp32/bf16 checkpoint resumed in fp16: 2^16, not 1
  EXPECT_EQ(fresh.scale(), 65536.0);
  kiln::LossScaler fixed({true, /*static_scale=*/128.0, 16, 1000, 2, 1.0});
  fixed.load_state(fp16.state());
  EXPECT_EQ(fixed.scale(), 128.0);
  kiln::LossScaler dyn({true, 0.0, 16, 1000, 2, 1.0});
  dyn.load_state(fp16.state());
  EXPECT_EQ(dyn.scale(), 8.0);
}

TEST(LossScaler, StateRoundTripContinuesTheSameSequence) {
  kiln::LossScalerConfig cfg{true, 0.0, 4, 3, 2, 1.0};
  kiln::LossScaler a(cfg);
  const bool flags[] = {false, true, false, false, true, true, false, false, false, false};
  for (int i = 0; i < 5; ++i) a.update(flags[i]);
  kiln::LossScaler b(cfg);
  b.load_state(a.state());
  for (int i = 5; i < 10; ++i) {
    EXPECT_EQ(a.update(flags[i]), b.update(flags[i]));
    EXPECT_EQ(a.scale(), b.scale());
    EXPECT_EQ(a.hysteresis_left(), b.hysteresis_left());
  }
}
