// tests/test_pipeline_schedule.cpp -- the 1F1B and forward-only schedules
// (parallel/pipeline_schedule.h), stage by stage and all stages together.
//
//   - Golden schedules, written out by hand from Megatron-LM's three phases.
//   - For every pp in 1..6, m in 1..10 and stage: the compute against the 1F1B definition
//     (F^w (F B)^r B^w, micro-batches in order, at most min(pp - s, m) in flight), each transfer
//     on the right side of its compute, and neighbours agreeing on the order of their messages.
//   - simulate() (tests/pipeline_sim.h): all stages run together with sends that never buffer --
//     a transfer completes only once the peer has posted its counterpart, matched in posting
//     order per pair of stages -- so
//     a schedule that can deadlock on NCCL or MPI does deadlock here. Forward takes 1 time unit,
//     backward 2, transfers 0; the makespan is then exactly (m + pp - 1) x 3 and the idle share
//     is bubble_fraction() (Narayanan et al. 2021, s2.2). The simulator is shown to catch a
//     deadlock (sends posted alone) and a mismatched message.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "parallel/pipeline_schedule.h"
#include "pipeline_sim.h"

namespace kiln {
namespace {

using Kind = PipeTransfer::Kind;
using Type = PipeAction::Type;
using Schedule = std::vector<PipeAction>;

constexpr int kMaxPp = 6, kMaxMicros = 10;

std::string case_name(int pp, int stage, int m) {
  return "pp " + std::to_string(pp) + " stage " + std::to_string(stage) + " m " + std::to_string(m);
}

std::vector<Schedule> all_stages(int pp, int m, Schedule (*make)(int, int, int)) {
  std::vector<Schedule> stages;
  for (int s = 0; s < pp; ++s) stages.push_back(make(pp, s, m));
  return stages;
}

// ---- the simulator: tests/pipeline_sim.h ------------------------------------------------------

using sim::is_send;
using sim::SimResult;
int peer_of(int stage, Kind k) { return sim::peer_of(stage, k, 0, /*ring=*/false); }
SimResult simulate(const std::vector<Schedule>& stages) { return sim::simulate(stages); }

// Each Exchange split into one Exchange per transfer, sends first (or receives first): what an
// executor does with blocking send and recv calls.
Schedule split_exchanges(const Schedule& schedule, bool sends_first) {
  Schedule out;
  for (const PipeAction& a : schedule) {
    if (a.type != Type::Exchange) {
      out.push_back(a);
      continue;
    }
    for (bool sends : {sends_first, !sends_first})
      for (const PipeTransfer& t : a.transfers)
        if (is_send(t.kind) == sends) out.push_back({Type::Exchange, -1, {t}});
  }
  return out;
}

// ---- golden schedules ------------------------------------------------------------------------

// pp 3, m 4: stage 0 warms up with 2 forwards, stage 1 with 1, stage 2 with none.
TEST(PipelineSchedule, GoldenThreeStagesFourMicros) {
  EXPECT_EQ(to_string(one_f_one_b(3, 0, 4)), "F0 [>A0] F1 [>A1] F2 [>A2 <G0] B0 F3 [>A3 <G1] B1 [<G2] B2 [<G3] B3");
  EXPECT_EQ(to_string(one_f_one_b(3, 1, 4)),
            "[<A0] F0 [>A0] [<A1] F1 [>A1 <G0] B0 [>G0 <A2] F2 [>A2 <G1] B1 [>G1 <A3] F3 [>A3 <G2] B2 [>G2] "
            "[<G3] B3 [>G3]");
  EXPECT_EQ(to_string(one_f_one_b(3, 2, 4)), "[<A0] F0 B0 [>G0 <A1] F1 B1 [>G1 <A2] F2 B2 [>G2 <A3] F3 B3 [>G3]");
}

// pp 4, m 2: fewer micro-batches than stages, so stages 0 and 1 have no steady phase.
TEST(PipelineSchedule, GoldenFewerMicrosThanStages) {
  EXPECT_EQ(to_string(one_f_one_b(4, 0, 2)), "F0 [>A0] F1 [>A1] [<G0] B0 [<G1] B1");
  EXPECT_EQ(to_string(one_f_one_b(4, 1, 2)), "[<A0] F0 [>A0] [<A1] F1 [>A1] [<G0] B0 [>G0] [<G1] B1 [>G1]");
  EXPECT_EQ(to_string(one_f_one_b(4, 2, 2)), "[<A0] F0 [>A0] [<A1] F1 [>A1 <G0] B0 [>G0] [<G1] B1 [>G1]");
  EXPECT_EQ(to_string(one_f_one_b(4, 3, 2)), "[<A0] F0 B0 [>G0 <A1] F1 B1 [>G1]");
}

TEST(PipelineSchedule, GoldenOneStage) {
  EXPECT_EQ(to_string(one_f_one_b(1, 0, 3)), "F0 B0 F1 B1 F2 B2");
  EXPECT_EQ(to_string(forward_only(1, 0, 3)), "F0 F1 F2");
  EXPECT_EQ(to_string(forward_only(3, 1, 2)), "[<A0] F0 [>A0] [<A1] F1 [>A1]");
}

TEST(PipelineSchedule, WarmupForwards) {
  EXPECT_EQ(warmup_forwards(4, 0, 8), 3);
  EXPECT_EQ(warmup_forwards(4, 2, 8), 1);
  EXPECT_EQ(warmup_forwards(4, 3, 8), 0);
  EXPECT_EQ(warmup_forwards(4, 0, 2), 2);  // capped at m
  EXPECT_EQ(warmup_forwards(1, 0, 5), 0);
}

// ---- each stage against the definition ------------------------------------------------------

// Compute: F^w (F B)^r B^w with forwards and backwards each in micro-batch order, at most
// min(pp - s, m) micro-batches forwarded and not yet backwarded, and that bound reached.
TEST(OneFOneB, ComputeFollowsTheDefinition) {
  for (int pp = 1; pp <= kMaxPp; ++pp)
    for (int m = 1; m <= kMaxMicros; ++m)
      for (int s = 0; s < pp; ++s) {
        const Schedule sched = one_f_one_b(pp, s, m);
        SCOPED_TRACE(case_name(pp, s, m) + ": " + to_string(sched));
        const int w = warmup_forwards(pp, s, m), r = m - w;
        ASSERT_EQ(w, std::min(pp - s - 1, m));

        std::string pattern, expected = std::string(w, 'F');
        for (int i = 0; i < r; ++i) expected += "FB";
        expected += std::string(w, 'B');
        int next_f = 0, next_b = 0, in_flight = 0, most = 0, forwards_before_first_b = -1;
        for (const PipeAction& a : sched) {
          if (a.type == Type::Exchange) continue;
          ASSERT_TRUE(a.transfers.empty());
          if (a.type == Type::Forward) {
            pattern += 'F';
            EXPECT_EQ(a.micro, next_f++);
            most = std::max(most, ++in_flight);
          } else {
            pattern += 'B';
            if (forwards_before_first_b < 0) forwards_before_first_b = next_f;
            EXPECT_EQ(a.micro, next_b++);
            EXPECT_LT(a.micro, next_f) << "backward before its forward";
            --in_flight;
          }
        }
        EXPECT_EQ(pattern, expected);
        EXPECT_EQ(next_f, m);
        EXPECT_EQ(next_b, m);
        EXPECT_EQ(forwards_before_first_b, w + (r > 0 ? 1 : 0));
        EXPECT_EQ(most, std::min(pp - s, m));
      }
}

// Transfers: stage s > 0 receives activation i before forward i, s < pp - 1 sends it after;
// gradients the same way round the backward. Each exactly once; none the stage does not do.
TEST(OneFOneB, TransfersSurroundTheirCompute) {
  for (int pp = 1; pp <= kMaxPp; ++pp)
    for (int m = 1; m <= kMaxMicros; ++m)
      for (int s = 0; s < pp; ++s) {
        const Schedule sched = one_f_one_b(pp, s, m);
        SCOPED_TRACE(case_name(pp, s, m) + ": " + to_string(sched));
        const bool first = s == 0, last = s == pp - 1;
        // Position of each compute and transfer, per micro-batch; -1 when absent, -2 when twice.
        std::vector<int> fwd(m, -1), bwd(m, -1);
        std::map<Kind, std::vector<int>> at;
        for (Kind k : {Kind::SendActivation, Kind::RecvActivation, Kind::SendGrad, Kind::RecvGrad}) at[k].assign(m, -1);
        for (int i = 0; i < int(sched.size()); ++i) {
          const PipeAction& a = sched[i];
          if (a.type == Type::Forward) fwd[a.micro] = i;
          if (a.type == Type::Backward) bwd[a.micro] = i;
          if (a.type != Type::Exchange) continue;
          EXPECT_FALSE(a.transfers.empty());
          EXPECT_EQ(a.micro, -1);
          for (const PipeTransfer& t : a.transfers) {
            ASSERT_GE(t.micro, 0);
            ASSERT_LT(t.micro, m);
            int& pos = at[t.kind][t.micro];
            pos = pos == -1 ? i : -2;
          }
        }
        for (int i = 0; i < m; ++i) {
          SCOPED_TRACE("micro-batch " + std::to_string(i));
          ASSERT_GE(fwd[i], 0);
          ASSERT_GE(bwd[i], 0);
          if (first) {
            EXPECT_EQ(at[Kind::RecvActivation][i], -1);
            EXPECT_EQ(at[Kind::SendGrad][i], -1);
          } else {
            EXPECT_GE(at[Kind::RecvActivation][i], 0);
            EXPECT_LT(at[Kind::RecvActivation][i], fwd[i]);
            EXPECT_GT(at[Kind::SendGrad][i], bwd[i]);
          }
          if (last) {
            EXPECT_EQ(at[Kind::SendActivation][i], -1);
            EXPECT_EQ(at[Kind::RecvGrad][i], -1);
          } else {
            EXPECT_GT(at[Kind::SendActivation][i], fwd[i]);
            EXPECT_GE(at[Kind::RecvGrad][i], 0);
            EXPECT_LT(at[Kind::RecvGrad][i], bwd[i]);
          }
        }
      }
}

// The micro-batches stage s sends to s + 1, in posting order, are those s + 1 receives from s;
// likewise the gradients back. And stronger, what the header's deadlock argument rests on: every
// Exchange involves one neighbour, and the Exchanges of s with s + 1 mirror those of s + 1 with
// s one to one ({>A f <G b} on s is {<A f >G b} on s + 1).
TEST(OneFOneB, NeighboursPostInTheSameOrder) {
  auto micros_of = [](const Schedule& sched, Kind k) {
    std::vector<int> out;
    for (const PipeAction& a : sched)
      for (const PipeTransfer& t : a.transfers)
        if (t.kind == k) out.push_back(t.micro);
    return out;
  };
  auto mirrored = [](PipeTransfer t) {
    switch (t.kind) {
      case Kind::SendActivation:
        return PipeTransfer{Kind::RecvActivation, t.micro};
      case Kind::RecvActivation:
        return PipeTransfer{Kind::SendActivation, t.micro};
      case Kind::SendGrad:
        return PipeTransfer{Kind::RecvGrad, t.micro};
      case Kind::RecvGrad:
        return PipeTransfer{Kind::SendGrad, t.micro};
    }
    return t;
  };
  for (int pp = 2; pp <= kMaxPp; ++pp)
    for (int m = 1; m <= kMaxMicros; ++m)
      for (int s = 0; s + 1 < pp; ++s) {
        const Schedule lo = one_f_one_b(pp, s, m), hi = one_f_one_b(pp, s + 1, m);
        SCOPED_TRACE(case_name(pp, s, m) + ": " + to_string(lo) + "\n  stage " + std::to_string(s + 1) + ": " +
                     to_string(hi));
        EXPECT_EQ(micros_of(lo, Kind::SendActivation), micros_of(hi, Kind::RecvActivation));
        EXPECT_EQ(micros_of(hi, Kind::SendGrad), micros_of(lo, Kind::RecvGrad));

        // The Exchanges of `sched` with stage `peer`, each after checking it has no other peer.
        auto with_peer = [](const Schedule& sched, int stage, int peer) {
          std::vector<std::vector<PipeTransfer>> out;
          for (const PipeAction& a : sched) {
            if (a.type != Type::Exchange) continue;
            const int p = peer_of(stage, a.transfers.front().kind);
            for (const PipeTransfer& t : a.transfers) EXPECT_EQ(peer_of(stage, t.kind), p) << "two peers";
            if (p == peer) out.push_back(a.transfers);
          }
          return out;
        };
        std::vector<std::vector<PipeTransfer>> lo_side = with_peer(lo, s, s + 1), hi_side = with_peer(hi, s + 1, s);
        for (std::vector<PipeTransfer>& e : hi_side) {
          for (PipeTransfer& t : e) t = mirrored(t);
          std::sort(e.begin(), e.end(), [](const PipeTransfer& a, const PipeTransfer& b) { return a.kind < b.kind; });
        }
        for (std::vector<PipeTransfer>& e : lo_side)
          std::sort(e.begin(), e.end(), [](const PipeTransfer& a, const PipeTransfer& b) { return a.kind < b.kind; });
        EXPECT_EQ(lo_side, hi_side);
      }
}

// ---- all stages together ---------------------------------------------------------------------

// Every stage finishes under rendezvous sends, and the makespan is the 1F1B one:
// (m + pp - 1)(t_f + t_b) with t_f = 1, t_b = 2, so the idle share 1 - 3m / makespan is
// exactly bubble_fraction(pp, m).
TEST(OneFOneB, AllStagesFinishWithTheExpectedBubble) {
  for (int pp = 1; pp <= kMaxPp; ++pp)
    for (int m = 1; m <= kMaxMicros; ++m) {
      SCOPED_TRACE("pp " + std::to_string(pp) + " m " + std::to_string(m));
      const SimResult r = simulate(all_stages(pp, m, one_f_one_b));
      ASSERT_TRUE(r.finished) << r.error;
      EXPECT_EQ(r.makespan, 3 * (m + pp - 1));
      EXPECT_DOUBLE_EQ(1.0 - 3.0 * m / r.makespan, bubble_fraction(pp, m));
    }
}

// The simulator can fail. With every Exchange split into blocking sends then receives (or
// receives then sends), neighbours in the steady phase each wait on a transfer the other has not
// posted: a deadlock wherever there are two stages and two micro-batches. Splitting one stage
// alone is not enough, since its neighbours still post both of their transfers together.
TEST(Simulator, ReportsDeadlockWhenAnExchangeIsSplit) {
  for (int pp = 2; pp <= kMaxPp; ++pp)
    for (int m = 2; m <= kMaxMicros; ++m)
      for (bool sends_first : {true, false}) {
        SCOPED_TRACE("pp " + std::to_string(pp) + " m " + std::to_string(m) +
                     (sends_first ? " sends first" : " receives first"));
        std::vector<Schedule> stages = all_stages(pp, m, one_f_one_b);
        for (Schedule& sched : stages) sched = split_exchanges(sched, sends_first);
        const SimResult r = simulate(stages);
        EXPECT_FALSE(r.finished);
        EXPECT_EQ(r.error.rfind("deadlock: ", 0), 0u) << r.error;

        stages = all_stages(pp, m, one_f_one_b);
        stages[1] = split_exchanges(stages[1], sends_first);
        EXPECT_TRUE(simulate(stages).finished) << "only stage 1 split";
      }
  // The case named in the header: stage 0 sends activation 1 while stage 1 sends gradient 0.
  std::vector<Schedule> stages = all_stages(2, 2, one_f_one_b);
  for (Schedule& sched : stages) sched = split_exchanges(sched, true);
  EXPECT_EQ(simulate(stages).error, "deadlock: stage 0 waits at action 3 [>A1]; stage 1 waits at action 3 [>G0]; ");
}

// Messages match in posting order: a stage that sends activations 1 then 0 while its neighbour
// receives 0 then 1 is reported, although every transfer would complete.
TEST(Simulator, ReportsMessagesMatchedOutOfOrder) {
  std::vector<Schedule> stages = all_stages(2, 2, forward_only);
  ASSERT_EQ(to_string(stages[0]), "F0 [>A0] F1 [>A1]");
  std::swap(stages[0][1].transfers[0].micro, stages[0][3].transfers[0].micro);
  const SimResult r = simulate(stages);
  EXPECT_FALSE(r.finished);
  EXPECT_EQ(r.error, "message 0 from stage 0 to 1 is micro-batch 1 on the sender and 0 on the receiver");
}

// ---- forward only ----------------------------------------------------------------------------

// recv i, forward i, send i for i in order (no recv on the first stage, no send on the last);
// all stages finish, the last at m + pp - 1 with unit forwards.
TEST(ForwardOnly, RecvForwardSendInOrder) {
  for (int pp = 1; pp <= kMaxPp; ++pp)
    for (int m = 1; m <= kMaxMicros; ++m) {
      for (int s = 0; s < pp; ++s) {
        Schedule expected;
        for (int i = 0; i < m; ++i) {
          if (s > 0) expected.push_back({Type::Exchange, -1, {{Kind::RecvActivation, i}}});
          expected.push_back({Type::Forward, i, {}});
          if (s < pp - 1) expected.push_back({Type::Exchange, -1, {{Kind::SendActivation, i}}});
        }
        EXPECT_EQ(to_string(forward_only(pp, s, m)), to_string(expected)) << case_name(pp, s, m);
      }
      const SimResult r = simulate(all_stages(pp, m, forward_only));
      ASSERT_TRUE(r.finished) << r.error;
      EXPECT_EQ(r.makespan, m + pp - 1);
    }
}

// ---- arguments and the bubble ----------------------------------------------------------------

TEST(PipelineSchedule, BadArgumentsThrow) {
  for (auto make : {one_f_one_b, forward_only}) {
    EXPECT_THROW(make(0, 0, 4), std::invalid_argument);
    EXPECT_THROW(make(4, -1, 4), std::invalid_argument);
    EXPECT_THROW(make(4, 4, 4), std::invalid_argument);
    EXPECT_THROW(make(4, 0, 0), std::invalid_argument);
  }
  EXPECT_THROW(warmup_forwards(2, 2, 1), std::invalid_argument);
  EXPECT_THROW(bubble_fraction(0, 4), std::invalid_argument);
  EXPECT_THROW(bubble_fraction(4, 0), std::invalid_argument);
  try {
    one_f_one_b(4, 4, 8);
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "one_f_one_b: need pp >= 1, 0 <= stage < pp and micros >= 1 (got pp 4, stage 4, micros 8)");
  }
}

TEST(PipelineSchedule, BubbleFraction) {
  EXPECT_DOUBLE_EQ(bubble_fraction(4, 8), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(1, 8), 0.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(2, 1), 0.5);
  EXPECT_DOUBLE_EQ(bubble_fraction(8, 64), 7.0 / 71.0);
}

}  // namespace
}  // namespace kiln
