// tests/test_pipeline_interleaved.cpp -- the interleaved 1F1B schedule
// (parallel/pipeline_interleaved.h), rank by rank and all ranks together.
//
//   - Goldens written out by hand from Megatron-LM's rule (pp 2, two chunks).
//   - For every pp in 2..5, chunks in 2..4 and m a multiple of pp up to 12: each rank's computes
//     against the definition (the k-th forward and backward, W_r forwards first, every chunk's
//     forward before its backward, the live chunks bounded as the header says), each transfer on
//     the right side of its compute.
//   - tests/pipeline_sim.h runs all ranks together on the ring under sends that never buffer and
//     one channel a pair of ranks: no deadlock, no message taken by the wrong receive, and a
//     makespan of exactly (m V + pp - 1) x 3 chunk units, so the idle share is
//     interleaved_bubble_fraction() -- 1F1B's with m V micro-batches.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "parallel/pipeline_interleaved.h"
#include "pipeline_sim.h"

namespace kiln {
namespace {

using Kind = PipeTransfer::Kind;
using Type = PipeAction::Type;
using Schedule = std::vector<PipeAction>;

std::vector<Schedule> all_ranks(int pp, int chunks, int m, bool forward_only = false) {
  std::vector<Schedule> ranks;
  for (int r = 0; r < pp; ++r)
    ranks.push_back(forward_only ? interleaved_forward_only(pp, r, chunks, m) : interleaved_one_f_one_b(pp, r, chunks, m));
  return ranks;
}

std::string case_name(int pp, int chunks, int m, int r) {
  return "pp " + std::to_string(pp) + " chunks " + std::to_string(chunks) + " m " + std::to_string(m) + " rank " +
         std::to_string(r);
}

// The (micro, chunk) of the k-th forward or backward, written out from the header's rule.
std::pair<int, int> kth(int pp, int chunks, int k, bool forward) {
  const int i = k % (pp * chunks);
  return {k / (pp * chunks) * pp + i % pp, forward ? i / pp : chunks - 1 - i / pp};
}

// pp 2, chunks 2, m 2 = pp: all forwards first. Rank 0 holds virtual stages 0 and 2, rank 1
// stages 1 and 3 (the loss).
TEST(Interleaved, GoldenAllWarmup) {
  EXPECT_EQ(to_string(interleaved_one_f_one_b(2, 0, 2, 2)),
            "F0 [>A0] F1 [>A1 <A0:1] F0:1 [>A0:1 <A1:1] F1:1 [>A1:1 <G0:1] B0:1 [>G0:1 <G1:1] B1:1 [>G1:1 <G0] "
            "B0 [<G1] B1");
  EXPECT_EQ(to_string(interleaved_one_f_one_b(2, 1, 2, 2)),
            "[<A0] F0 [>A0 <A1] F1 [>A1 <A0:1] F0:1 [<A1:1] F1:1 B0:1 [>G0:1] B1:1 [>G1:1 <G0] B0 [>G0 <G1] B1 "
            "[>G1]");
}

// pp 2, chunks 2, m 4: rank 0 warms up with 2 (pp - 1) + (V - 1) pp = 4 forwards, rank 1 with 2.
// A steady step is a forward and a backward, with one Exchange after it: both outputs, and the
// inputs of the next forward and backward ([>A2 >G0 <A3 <G1]).
TEST(Interleaved, GoldenSteadyPhase) {
  EXPECT_EQ(interleaved_warmup(2, 0, 2, 4), 4);
  EXPECT_EQ(interleaved_warmup(2, 1, 2, 4), 2);
  EXPECT_EQ(to_string(interleaved_one_f_one_b(2, 1, 2, 4)),
            "[<A0] F0 [>A0 <A1] F1 [>A1 <A0:1] F0:1 B0:1 [>G0:1 <A1:1] F1:1 B1:1 [>G1:1 <A2 <G0] F2 B0 "
            "[>A2 >G0 <A3 <G1] F3 B1 [>A3 >G1 <A2:1] F2:1 B2:1 [>G2:1 <A3:1] F3:1 B3:1 [>G3:1 <G2] B2 [>G2 <G3] B3 "
            "[>G3]");
}

TEST(Interleaved, ComputeFollowsTheDefinition) {
  for (int pp = 2; pp <= 5; ++pp)
    for (int chunks = 2; chunks <= 4; ++chunks)
      for (int m = pp; m <= 12; m += pp)
        for (int r = 0; r < pp; ++r) {
          const Schedule sched = interleaved_one_f_one_b(pp, r, chunks, m);
          SCOPED_TRACE(case_name(pp, chunks, m, r) + ": " + to_string(sched));
          const int total = m * chunks, w = interleaved_warmup(pp, r, chunks, m);
          EXPECT_EQ(w, m == pp ? total : std::min(2 * (pp - r - 1) + (chunks - 1) * pp, total));
          std::string pattern, expected = std::string(w, 'F');
          for (int i = 0; i < total - w; ++i) expected += "FB";
          expected += std::string(w, 'B');
          int f = 0, b = 0, live = 0, most = 0;
          std::map<std::pair<int, int>, int> forwarded;  // (micro, chunk) -> forwards minus backwards
          for (const PipeAction& a : sched) {
            if (a.type == Type::Exchange) continue;
            const bool fwd = a.type == Type::Forward;
            pattern += fwd ? 'F' : 'B';
            EXPECT_EQ(std::make_pair(a.micro, a.chunk), kth(pp, chunks, fwd ? f++ : b++, fwd));
            int& n = forwarded[{a.micro, a.chunk}];
            if (fwd) {
              EXPECT_EQ(n, 0) << "forwarded twice";
              ++n;
              most = std::max(most, ++live);
            } else {
              EXPECT_EQ(n, 1) << "backward without its forward";
              --n;
              --live;
            }
          }
          EXPECT_EQ(pattern, expected);
          EXPECT_EQ(f, total);
          EXPECT_EQ(b, total);
          EXPECT_EQ(most, interleaved_live_chunks(pp, r, chunks, m));
        }
}

// Each chunk's inputs arrive before its compute and its outputs leave after, exactly once; the
// first virtual stage (rank 0, chunk 0) receives no activation and sends no gradient, the last
// (rank pp - 1, chunk V - 1) sends no activation and receives no gradient.
TEST(Interleaved, TransfersSurroundTheirCompute) {
  for (int pp = 2; pp <= 5; ++pp)
    for (int chunks = 2; chunks <= 4; ++chunks)
      for (int m = pp; m <= 12; m += pp)
        for (int r = 0; r < pp; ++r) {
          const Schedule sched = interleaved_one_f_one_b(pp, r, chunks, m);
          SCOPED_TRACE(case_name(pp, chunks, m, r));
          std::map<std::tuple<int, int, int>, int> at;  // (kind or compute, micro, chunk) -> position
          auto put = [&](int what, int micro, int chunk, int pos) {
            auto [it, fresh] = at.emplace(std::make_tuple(what, micro, chunk), pos);
            EXPECT_TRUE(fresh) << "twice: " << what << " " << micro << ":" << chunk;
          };
          for (int i = 0; i < int(sched.size()); ++i) {
            const PipeAction& a = sched[i];
            if (a.type == Type::Exchange) {
              for (const PipeTransfer& t : a.transfers) put(int(t.kind), t.micro, t.chunk, i);
            } else {
              put(10 + int(a.type), a.micro, a.chunk, i);
            }
          }
          auto pos = [&](int what, int j, int c) {
            auto it = at.find({what, j, c});
            return it == at.end() ? -1 : it->second;
          };
          for (int j = 0; j < m; ++j)
            for (int c = 0; c < chunks; ++c) {
              SCOPED_TRACE(std::to_string(j) + ":" + std::to_string(c));
              const int fwd = pos(10 + int(Type::Forward), j, c), bwd = pos(10 + int(Type::Backward), j, c);
              ASSERT_GE(fwd, 0);
              ASSERT_GT(bwd, fwd);
              const bool first = r == 0 && c == 0, last = r == pp - 1 && c == chunks - 1;
              const int ra = pos(int(Kind::RecvActivation), j, c), sg = pos(int(Kind::SendGrad), j, c);
              const int sa = pos(int(Kind::SendActivation), j, c), rg = pos(int(Kind::RecvGrad), j, c);
              if (first) {
                EXPECT_EQ(ra, -1);
                EXPECT_EQ(sg, -1);
              } else {
                EXPECT_GE(ra, 0);
                EXPECT_LT(ra, fwd);
                EXPECT_GT(sg, bwd);
              }
              if (last) {
                EXPECT_EQ(sa, -1);
                EXPECT_EQ(rg, -1);
              } else {
                EXPECT_GT(sa, fwd);
                EXPECT_GE(rg, 0);
                EXPECT_LT(rg, bwd);
              }
            }
        }
}

// All ranks together on the ring: every one finishes, every message is the one its receive
// expects, and the makespan is (m V + pp - 1)(1 + 2) chunk units.
TEST(Interleaved, AllRanksFinishWithTheExpectedBubble) {
  for (int pp = 2; pp <= 6; ++pp)
    for (int chunks = 2; chunks <= 4; ++chunks)
      for (int m = pp; m <= 16; m += pp) {
        SCOPED_TRACE("pp " + std::to_string(pp) + " chunks " + std::to_string(chunks) + " m " + std::to_string(m));
        const sim::SimResult r = sim::simulate(all_ranks(pp, chunks, m), /*ring=*/true);
        ASSERT_TRUE(r.finished) << r.error;
        EXPECT_EQ(r.makespan, 3 * (m * chunks + pp - 1));
        for (int busy : r.busy) EXPECT_EQ(busy, 3 * m * chunks);
        EXPECT_NEAR(1.0 - 3.0 * m * chunks / r.makespan, interleaved_bubble_fraction(pp, chunks, m), 1e-12);
      }
}

// Forward only: every rank finishes for any m (groups of pp, the last one short), each message the
// expected one, in m V + pp - 1 units when m is a multiple of pp.
TEST(Interleaved, ForwardOnlyFinishes) {
  for (int pp = 2; pp <= 5; ++pp)
    for (int chunks = 1; chunks <= 3; ++chunks)
      for (int m = 1; m <= 11; ++m) {
        SCOPED_TRACE("pp " + std::to_string(pp) + " chunks " + std::to_string(chunks) + " m " + std::to_string(m));
        const sim::SimResult r = sim::simulate(all_ranks(pp, chunks, m, /*forward_only=*/true), /*ring=*/true);
        ASSERT_TRUE(r.finished) << r.error;
        if (m % pp == 0) {
          EXPECT_EQ(r.makespan, m * chunks + pp - 1);
        }
      }
}

TEST(Interleaved, RulesAndBadArguments) {
  EXPECT_EQ(interleaved_rule(4, 2, 8), "");
  EXPECT_EQ(interleaved_rule(4, 2, 6),
            "the interleaved schedule needs --grad-accum (micro-batches a step) a multiple of --pp 4 (got 6; 8 works)");
  EXPECT_EQ(interleaved_rule(4, 2, 2),
            "the interleaved schedule needs --grad-accum (micro-batches a step) a multiple of --pp 4 (got 2; 4 works)");
  EXPECT_EQ(interleaved_rule(1, 2, 4), "--pp-virtual 2 needs --pp of 2 or more");
  EXPECT_EQ(interleaved_rule(2, 0, 4), "--pp-virtual must be at least 1 (got 0)");
  EXPECT_THROW(interleaved_one_f_one_b(4, 0, 2, 6), std::invalid_argument);
  EXPECT_THROW(interleaved_one_f_one_b(4, 4, 2, 8), std::invalid_argument);
  EXPECT_THROW(interleaved_one_f_one_b(4, 0, 0, 8), std::invalid_argument);
  EXPECT_THROW(interleaved_warmup(4, 0, 2, 5), std::invalid_argument);
  EXPECT_DOUBLE_EQ(interleaved_bubble_fraction(4, 2, 8), 3.0 / 19.0);
  EXPECT_DOUBLE_EQ(interleaved_bubble_fraction(4, 1, 8), bubble_fraction(4, 8));
  EXPECT_EQ(interleaved_live_chunks(4, 0, 2, 8), 2 * 3 + 4 + 1);
  EXPECT_EQ(interleaved_live_chunks(4, 3, 2, 8), 4 + 1);
  EXPECT_EQ(interleaved_live_chunks(2, 0, 2, 2), 4);  // m = pp: all forwards first
}

}  // namespace
}  // namespace kiln
