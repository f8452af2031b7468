// tests/test_pipeline_zero_bubble.cpp -- the ZB-H1 schedule (parallel/pipeline_zero_bubble.h).
//
//   - A golden schedule, pp 3, m 4.
//   - For every pp in 1..6, m in 1..10 and stage: the Exchanges 1F1B's, in its order; stage 0
//     1F1B itself; elsewhere each micro-batch's F, I, W once each, in micro-batch order, F before
//     I before W; the first s W's deferred, never more than s + 1 at once; at most pp micro-batches'
//     graphs held (forwarded, not through W).
//   - tests/pipeline_sim.h runs all stages together under its exchange rules (sends that never
//     buffer): every schedule finishes, never after 1F1B, and with F = I = W = 1 the step takes
//     3m + (pp - 1) for m >= pp -- (pp - 1) idle against 1F1B's 3 (pp - 1): a third -- the fraction
//     zb_h1_bubble_fraction gives (for fewer micro-batches too: (pp - 1) + (pp - m) idle).
//     The W's places matter: after the steady phase's Exchange
//     instead of before it, the bubble is 2 (pp - 1).
//   - With unequal passes (integer t_F, t_I, t_W, t_W <= min(t_F, t_I)) the simulated idle time is
//     zb_h1_idle's (pp - 1)(t_F + t_I - t_W) + max(0, pp - m) t_W.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/pipeline_zero_bubble.h"
#include "pipeline_sim.h"

namespace kiln {
namespace {

using Type = PipeAction::Type;
using Schedule = std::vector<PipeAction>;

std::vector<Schedule> all_stages(int pp, int m, Schedule (*make)(int, int, int)) {
  std::vector<Schedule> out;
  for (int s = 0; s < pp; ++s) out.push_back(make(pp, s, m));
  return out;
}

TEST(ZeroBubble, GoldenThreeStagesFourMicros) {
  EXPECT_EQ(to_string(zb_h1(3, 0, 4)), to_string(one_f_one_b(3, 0, 4)));  // stage 0: the fused backward
  // stage 1 defers one W, stage 2 two; the steady W's before their Exchange, the cool-down's after
  EXPECT_EQ(to_string(zb_h1(3, 1, 4)),
            "[<A0] F0 [>A0] [<A1] F1 [>A1 <G0] I0 [>G0 <A2] F2 [>A2 <G1] I1 W0 [>G1 <A3] F3 [>A3 <G2] I2 [>G2] W1 "
            "[<G3] I3 [>G3] W2 W3");
  EXPECT_EQ(to_string(zb_h1(3, 2, 4)), "[<A0] F0 I0 [>G0 <A1] F1 I1 [>G1 <A2] F2 I2 W0 [>G2 <A3] F3 I3 [>G3] W1 W2 W3");
}

TEST(ZeroBubble, OrderAndDeferralFollowTheDefinition) {
  for (int pp = 1; pp <= 6; ++pp)
    for (int m = 1; m <= 10; ++m)
      for (int s = 0; s < pp; ++s) {
        const Schedule zb = zb_h1(pp, s, m), base = one_f_one_b(pp, s, m);
        SCOPED_TRACE("pp " + std::to_string(pp) + " stage " + std::to_string(s) + " m " + std::to_string(m) + ": " +
                     to_string(zb));
        if (s == 0) {
          EXPECT_EQ(to_string(zb), to_string(base));
          continue;
        }
        auto exchanges = [](const Schedule& sched) {
          std::string out;
          for (const PipeAction& a : sched)
            if (a.type == Type::Exchange) out += to_string({a});
          return out;
        };
        EXPECT_EQ(exchanges(zb), exchanges(base));
        std::map<Type, int> next;  // the next micro-batch of each kind: each kind in order
        int held = 0, most = 0, deferred = 0, most_deferred = 0, inputs = 0, weights_early = 0;
        for (const PipeAction& a : zb) {
          if (a.type == Type::Exchange) continue;
          ASSERT_NE(a.type, Type::Backward) << "a fused backward off stage 0";
          EXPECT_EQ(a.micro, next[a.type]++) << to_string({a});
          if (a.type == Type::Forward) most = std::max(most, ++held);
          if (a.type == Type::BackwardInput) {
            EXPECT_LT(a.micro, next[Type::Forward]);
            ++inputs;
            most_deferred = std::max(most_deferred, ++deferred);
          }
          if (a.type == Type::BackwardWeight) {
            EXPECT_LT(a.micro, next[Type::BackwardInput]);
            if (inputs <= s && inputs < m) ++weights_early;  // the end's W's excepted
            --deferred;
            --held;
          }
        }
        EXPECT_EQ(next[Type::Forward], m);
        EXPECT_EQ(next[Type::BackwardInput], m);
        EXPECT_EQ(next[Type::BackwardWeight], m);
        EXPECT_EQ(weights_early, 0) << "a W before s I's";
        EXPECT_LE(most, pp);
        EXPECT_LE(most_deferred, s + 1);
      }
}

// Unequal passes, as a transformer stage's (W the weight GEMMs only, I with attention's backward):
// the simulated idle time equals zb_h1_idle's (p - 1)(t_F + t_I - t_W) + max(0, p - m) t_W
// wherever t_W <= min(t_F, t_I); the case it excludes (W longer than I) idles more.
TEST(ZeroBubble, IdleTimeOfUnequalPasses) {
  int checked = 0;
  for (int f = 1; f <= 6; ++f)
    for (int i = 1; i <= 8; ++i)
      for (int w = 1; w <= std::min(f, i); ++w)
        for (int pp = 1; pp <= 6; ++pp)
          for (int m = 1; m <= 10; ++m) {
            const sim::SimResult r = sim::simulate(all_stages(pp, m, zb_h1), /*ring=*/false, {f, i, w});
            ASSERT_TRUE(r.finished) << r.error;
            ASSERT_EQ(r.makespan - m * (f + i + w), zb_h1_idle(pp, m, f, i, w))
                << "t_F " << f << " t_I " << i << " t_W " << w << " pp " << pp << " m " << m;
            ++checked;
          }
  EXPECT_EQ(checked, 6 * 10 * 133);  // pp 1-6, m 1-10, 133 (f, i, w) triples with w <= min(f, i)
  const sim::SimResult beyond = sim::simulate(all_stages(2, 4, zb_h1), /*ring=*/false, {2, 1, 2});
  ASSERT_TRUE(beyond.finished) << beyond.error;
  EXPECT_GT(beyond.makespan - 4 * 5, 2 + 1 - 2);  // W > I: more than the formula's (p - 1)(t_F + t_I - t_W)
}

// The W's places, against the steady phase's Exchange: after it instead of before.
Schedule w_after_exchange(int pp, int s, int m) {
  Schedule zb = zb_h1(pp, s, m);
  for (size_t i = 0; i + 1 < zb.size(); ++i)
    if (zb[i].type == Type::BackwardWeight && zb[i + 1].type == Type::Exchange && zb[i + 1].transfers.size() > 1)
      std::swap(zb[i], zb[i + 1]), ++i;
  return zb;
}

TEST(ZeroBubble, AllStagesFinishWithAThirdOfTheBubble) {
  for (int pp = 1; pp <= 6; ++pp)
    for (int m = 1; m <= 10; ++m) {
      SCOPED_TRACE("pp " + std::to_string(pp) + " m " + std::to_string(m));
      const sim::SimResult zb = sim::simulate(all_stages(pp, m, zb_h1));
      const sim::SimResult base = sim::simulate(all_stages(pp, m, one_f_one_b));
      ASSERT_TRUE(zb.finished) << zb.error;
      EXPECT_LE(zb.makespan, base.makespan);
      EXPECT_NEAR(1.0 - 3.0 * m / zb.makespan, zb_h1_bubble_fraction(pp, m), 1e-12);
      if (m < pp) continue;
      EXPECT_EQ(base.makespan - 3 * m, 3 * (pp - 1));
      EXPECT_EQ(zb.makespan - 3 * m, pp - 1);
      const sim::SimResult late = sim::simulate(all_stages(pp, m, w_after_exchange));
      ASSERT_TRUE(late.finished) << late.error;
      if (pp > 1 && m > pp) {
        EXPECT_EQ(late.makespan - 3 * m, 2 * (pp - 1)) << "W after the steady Exchange";
      }
    }
  EXPECT_THROW(zb_h1_bubble_fraction(4, 0), std::invalid_argument);
  EXPECT_THROW(zb_h1_idle(4, 8, 1.0, 1.0, 1.5), std::invalid_argument);  // W longer than F: the formula does not hold
  EXPECT_THROW(zb_h1(4, 4, 8), std::invalid_argument);
}

}  // namespace
}  // namespace kiln
