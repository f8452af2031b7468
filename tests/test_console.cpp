// tests/test_console.cpp -- rank 0's console lines (runtime/observe/console.h): durations, counts, the
// start-up line's layout, the step line's progress fields, the eval line's perplexity, and the closing summary; and the phase
// timer that times the steps (runtime/observe/phase_timer.h); the stragglers' rule
// (runtime/observe/stragglers.h).
#include <chrono>
#include <memory>
#include <cmath>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "distributed/wait_clock.h"
#include "runtime/observe/console.h"
#include "runtime/observe/phase_timer.h"
#include "runtime/observe/stragglers.h"

namespace kiln {
namespace {

TEST(Console, Durations) {
  EXPECT_EQ(human_duration(0), "0:00");
  EXPECT_EQ(human_duration(75.4), "1:15");
  EXPECT_EQ(human_duration(3599.6), "1:00:00");
  EXPECT_EQ(human_duration(3725), "1:02:05");
  EXPECT_EQ(human_duration(-1), "?");
  EXPECT_EQ(human_duration(NAN), "?");
}

TEST(Console, Counts) {
  EXPECT_EQ(human_count(512), "512");
  EXPECT_EQ(human_count(9999), "9999");
  EXPECT_EQ(human_count(12345), "12.3K");
  EXPECT_EQ(human_count(1.2e6), "1.20M");
  EXPECT_EQ(human_count(3.4e9), "3.40G");
}

// The start-up line's layout, as kiln plan names it (issue 48, item 12: `--cp 2` printed
// "dp 1 tp 1 pp 1").
TEST(Console, LayoutNamesEveryDimensionAboveOne) {
  EXPECT_EQ(format_layout(4, 1, 1, 1, false, 1), "dp 4 tp 1 pp 1");
  EXPECT_EQ(format_layout(1, 1, 2, 1, false, 1), "dp 1 cp 2 tp 1 pp 1");
  EXPECT_EQ(format_layout(4, 2, 1, 1, false, 1), "dp 4 (ep 2) tp 1 pp 1");
  EXPECT_EQ(format_layout(2, 2, 2, 2, true, 2), "dp 2 (ep 2) cp 2 tp 2 (sp) pp 2");
}

TEST(Console, StepLineCarriesProgress) {
  StepLine s;
  s.step = 120;
  s.steps = 300;
  s.loss = 3.21414;
  s.lr = 9.51e-4;
  s.norm = 0.812;
  s.step_ms = 48.3;
  s.tokens_per_s = 21200;
  s.tflops = 0.11;
  s.mem_gb = 0.43;
  s.tokens_seen = 122880;
  s.elapsed_s = 6.2;
  s.eta_s = 180 * 0.0483;
  const std::string line = format_step_line(s);
  EXPECT_EQ(line.rfind("step    120/300 | loss 3.2141 | lr 9.51e-04 | norm 0.812 |", 0), 0u) << line;
  EXPECT_NE(line.find("| 21.2K tok/s |"), std::string::npos) << line;
  EXPECT_NE(line.find("| 122.9K tok | 0:06 elapsed, ETA 0:09"), std::string::npos) << line;
  EXPECT_EQ(line.find("mfu"), std::string::npos) << line;    // no peak known
  EXPECT_EQ(line.find("scale"), std::string::npos) << line;  // not fp16
  s.mfu = 0.412;
  s.loss_scale = 65536;
  s.skipped = true;
  s.skip_reason = "overflow";
  s.step = 300;  // the last step: no ETA
  const std::string last = format_step_line(s);
  EXPECT_NE(last.find("| mfu 41.2% |"), std::string::npos) << last;
  EXPECT_NE(last.find("| scale 65536 | skipped (overflow) |"), std::string::npos) << last;
  EXPECT_EQ(last.find("ETA"), std::string::npos) << last;
}

TEST(Console, EvalLineHasPerplexityAndDuration) {
  EXPECT_EQ(format_eval_line(120, std::log(27.15), 0.43), "eval      120 | val loss 3.3014 | ppl 27.15 | 0.4 s");
}

TEST(Console, SummaryFromTheRecord) {
  // A run resumed at step 100 (100 updates then) that ran to step 300, skipping one: the record's
  // updates are the whole run's, 299; this invocation made 199 of them.
  nlohmann::json sum{{"start_step", 100}, {"end_step", 300}, {"updates", 299}, {"skipped_steps", 1}, {"final_loss", 2.10441},
                     {"mean_loss_last10", 2.121}, {"val_loss", std::log(9.03)}, {"mean_tokens_per_s", 20900.0},
                     {"mean_tflops", 0.11}, {"mean_mfu", nullptr}, {"peak_mem_gb", 0.43}, {"mean_watts", nullptr},
                     {"checkpoint", "ckpt/step_00000300"}, {"wall_s", 75.0}};
  const std::string out = format_summary(sum, 307200);
  EXPECT_NE(out.find("kiln: done in 1:15: steps 101-300 (199 updates, 1 skipped), 307.2K tokens seen"), std::string::npos) << out;
  EXPECT_NE(out.find("loss 2.1044 (mean of the last 10: 2.1210); val loss 2.2006 (ppl 9.03)"), std::string::npos) << out;
  EXPECT_NE(out.find("20.9K tok/s, 0.11 TFLOP/s/device; peak memory 0.43 GB"), std::string::npos) << out;
  EXPECT_EQ(out.find("mfu"), std::string::npos) << out;
  EXPECT_NE(out.find("last checkpoint ckpt/step_00000300"), std::string::npos) << out;
  EXPECT_EQ(out.find("rollback"), std::string::npos) << out;
  // Spike rollbacks say so, with the data they skipped.
  sum["rollbacks"] = 2;
  sum["skipped_samples"] = 24;
  const std::string rolled = format_summary(sum, 307200);
  EXPECT_NE(rolled.find("2 spike rollback(s); 24 sample position(s) of the stream skipped, never trained on"), std::string::npos) << rolled;
  // Nothing trained (--steps 0, or resumed at the end): no losses, no throughput.
  nlohmann::json none{{"start_step", 0}, {"end_step", 0}, {"updates", 0}, {"skipped_steps", 0}, {"final_loss", nullptr},
                      {"mean_tokens_per_s", nullptr}, {"peak_mem_gb", 0.1}, {"wall_s", 1.0}};
  const std::string empty = format_summary(none, 0);
  EXPECT_NE(empty.find("no steps"), std::string::npos) << empty;
  EXPECT_EQ(empty.find("loss"), std::string::npos) << empty;
  EXPECT_EQ(empty.find("tok/s"), std::string::npos) << empty;
}

// A rank is a straggler when its median compute is over factor x its stage's median: one stage
// of four ranks, rank 3 at 13 ms against a median of 10.25 (1.27x > 1.2).
TEST(Stragglers, ARankSlowerThanItsStage) {
  const std::vector<Straggler> s = find_stragglers({10.0, 10.5, 10.0, 13.0}, {0, 0, 0, 0}, 1.2);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].rank, 3);
  EXPECT_EQ(s[0].stage, 0);
  EXPECT_DOUBLE_EQ(s[0].median_ms, 13.0);
  EXPECT_DOUBLE_EQ(s[0].stage_median_ms, 10.25);
  EXPECT_TRUE(find_stragglers({10.0, 10.5, 10.0, 12.0}, {0, 0, 0, 0}, 1.2).empty());  // 1.17x
}

// Pipeline stages are compared with themselves only: a last stage that also runs the output layer
// is not slow; a stage of one rank has nobody to be slower than; a rank without timed steps (0).
TEST(Stragglers, StagesAreComparedWithThemselves) {
  EXPECT_TRUE(find_stragglers({10.0, 10.0, 20.0, 20.0}, {0, 0, 1, 1}, 1.2).empty());
  const std::vector<Straggler> s = find_stragglers({10.0, 10.0, 20.0, 31.0, 50.0}, {0, 0, 1, 1, 2}, 1.2);
  ASSERT_EQ(s.size(), 1u);  // rank 3: 31 > 1.2 x 25.5; rank 4 alone in stage 2
  EXPECT_EQ(s[0].rank, 3);
  EXPECT_TRUE(find_stragglers({0.0, 0.0}, {0, 0}, 1.2).empty());
}

// A world of one: the step's slowest rank is this one; nothing to compare at the end.
TEST(Stragglers, AWorldOfOne) {
  StragglerWatch w(nullptr, 0, 1.2);
  const SlowestRank a = w.step({12.5}, 12.5, /*timed=*/false);
  EXPECT_DOUBLE_EQ(a.compute_ms, 12.5);
  EXPECT_EQ(a.rank, 0);
  w.step({11.0}, 11.0, true);
  EXPECT_TRUE(w.finish().empty());
}

// The step's slowest rank from every rank's compute time: the largest, the lowest rank of a tie.
TEST(Stragglers, TheSlowestOfTheGatheredTimes) {
  StragglerWatch w(nullptr, 0, 1.2);
  const SlowestRank s = w.step({3.0, 7.5, 7.5, 1.0}, 3.0, true);
  EXPECT_DOUBLE_EQ(s.compute_ms, 7.5);
  EXPECT_EQ(s.rank, 1);
}

}  // namespace
}  // namespace kiln

// runtime/observe/phase_timer.h: a cut at an earlier mark leaves the later marks to the next interval,
// and the chain stays contiguous (the intervals add up to the time between their ends).
TEST(PhaseTimer, CutAtAMarkKeepsTheLaterMarksForTheNextInterval) {
  using namespace std::chrono_literals;
  kiln::PhaseTimer t(c10::Device(c10::kCPU));
  t.start();
  std::this_thread::sleep_for(2ms);
  t.mark(kiln::Phase::Forward);
  std::this_thread::sleep_for(2ms);
  const size_t update = t.mark(kiln::Phase::Optimizer);  // step 1 ends here
  std::this_thread::sleep_for(2ms);
  t.mark(kiln::Phase::Forward);  // step 2's forward, queued before step 1 is read
  t.wait(update);
  const auto first = t.cut(update);
  EXPECT_GE(first[static_cast<size_t>(kiln::Phase::Forward)], 1.5);
  EXPECT_GE(first[static_cast<size_t>(kiln::Phase::Optimizer)], 1.5);
  std::this_thread::sleep_for(2ms);
  const size_t update2 = t.mark(kiln::Phase::Optimizer);
  const auto boundary1 = t.cut_time();
  const auto second = t.cut(update2);
  EXPECT_GE(second[static_cast<size_t>(kiln::Phase::Forward)], 1.5);  // the forward marked before the first cut
  EXPECT_GE(second[static_cast<size_t>(kiln::Phase::Optimizer)], 1.5);
  double sum = 0.0;
  for (double ms : second) sum += ms;
  const double between = std::chrono::duration<double, std::milli>(t.cut_time() - boundary1).count();
  EXPECT_NEAR(sum, between, 1e-6);
  EXPECT_THROW(t.cut(update), std::logic_error);  // already cut
}

// distributed/wait_clock.h through the phase timer: a wait counts in the interval whose mark follows
// it, by that interval's phase; waits before a chain's start belong to no interval; a device wait
// (add_later) is read at the cut.
TEST(PhaseTimer, WaitsInCollectivesCountInTheirInterval) {
  auto clock = std::make_shared<kiln::WaitClock>();
  kiln::PhaseTimer t(c10::Device(c10::kCPU), clock);
  clock->add_ms(100.0);  // before the chain: dropped at start()
  t.start();
  clock->add_ms(3.0);
  t.mark(kiln::Phase::Forward);
  clock->add_later([] { return 4.0; });
  clock->add_ms(1.0);
  t.mark(kiln::Phase::Backward);
  clock->add_ms(5.0);
  const size_t comm = t.mark(kiln::Phase::Comm);
  clock->add_ms(7.0);  // after the cut's mark: the next interval's
  const size_t update = t.mark(kiln::Phase::Optimizer);
  std::array<double, kiln::kNumPhases> waited{};
  t.cut(comm, &waited);
  EXPECT_DOUBLE_EQ(waited[static_cast<size_t>(kiln::Phase::Forward)], 3.0);
  EXPECT_DOUBLE_EQ(waited[static_cast<size_t>(kiln::Phase::Backward)], 5.0);
  EXPECT_DOUBLE_EQ(waited[static_cast<size_t>(kiln::Phase::Comm)], 5.0);
  EXPECT_DOUBLE_EQ(waited[static_cast<size_t>(kiln::Phase::Optimizer)], 0.0);
  t.cut(update, &waited);
  EXPECT_DOUBLE_EQ(waited[static_cast<size_t>(kiln::Phase::Optimizer)], 7.0);
  EXPECT_DOUBLE_EQ(waited[static_cast<size_t>(kiln::Phase::Forward)], 0.0);
  EXPECT_DOUBLE_EQ(clock->take(12345), 0.0);  // an unknown segment
}
