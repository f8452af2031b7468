// tests/test_host_accumulator.cpp -- parallel/host_worker.h and parallel/host_accumulator.h on the
// CPU: tasks run in the order posted and wait() waits for exactly what it names; a failed task is
// reported to every later wait; every add lands, adds into one destination land in the order
// issued (the same sums as adding in line), the first add may copy instead (no zeroing), the two
// slots are reused without losing a source, and drain() waits for all of it.
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "parallel/host_accumulator.h"
#include "parallel/host_worker.h"

namespace {
const c10::Device kCpu(c10::kCPU);
}

TEST(HostWorker, RunsInOrderAndWaitsForWhatItNames) {
  kiln::HostWorker w(kCpu, /*threaded=*/1);
  std::vector<int> order;
  std::atomic<int> running{0};
  std::vector<int64_t> tickets;
  for (int i = 0; i < 6; ++i) {
    tickets.push_back(w.post([&, i] {
      EXPECT_EQ(running.fetch_add(1), 0) << "two tasks at once";
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      order.push_back(i);
      running.fetch_sub(1);
    }));
  }
  EXPECT_EQ(tickets.front(), 1);
  EXPECT_EQ(tickets.back(), 6);
  w.wait(tickets[2]);
  EXPECT_GE(order.size(), 3u);  // the third and every one before it have run
  w.drain();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5}));
}

TEST(HostWorker, AFailedTaskIsReportedAndStopsTheRest) {
  kiln::HostWorker w(kCpu, /*threaded=*/1);
  bool later_ran = false;
  w.post([] { throw std::runtime_error("the update broke"); });
  const int64_t t = w.post([&] { later_ran = true; });
  try {
    w.wait(t);
    FAIL() << "wait() did not rethrow";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("the update broke"), std::string::npos) << e.what();
  }
  EXPECT_ANY_THROW(w.drain());
  EXPECT_FALSE(later_ran);
}

TEST(HostAccumulator, SumsEqualAddingInLine) {
  kiln::HostWorker w(kCpu, /*threaded=*/1);
  kiln::HostAccumulator acc(w, kCpu, /*capacity=*/100000, /*slots=*/2);
  std::vector<at::Tensor> got, want;
  for (int u = 0; u < 5; ++u) {
    // the last ones large enough for at::parallel_for to split the add
    const int64_t n = u < 3 ? 100 + 150 * u : 70001 + u;
    got.push_back(at::full({n}, 7.0f));  // garbage the first (assigning) add must overwrite
    want.push_back(at::zeros({n}, at::kFloat));
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  for (int micro = 0; micro < 4; ++micro) {  // four micro-steps, every unit each time
    for (size_t u = 0; u < got.size(); ++u) {
      at::Tensor src = at::randn({got[u].numel()}, gen);
      want[u].add_(src);
      acc.add(src, got[u], /*assign=*/micro == 0);
      src.fill_(1e9);  // the caller may drop or reuse its source at once
    }
  }
  acc.drain();
  for (size_t u = 0; u < got.size(); ++u) EXPECT_TRUE(at::equal(got[u], want[u])) << "unit " << u;
}

TEST(HostWorker, InLineRunsEachTaskAtPost) {
  kiln::HostWorker w(kCpu, /*threaded=*/0);  // KILN_TEST_HOST_WORKER=inline: the serial order
  bool ran = false;
  const int64_t t = w.post([&] { ran = true; });
  EXPECT_TRUE(ran) << "post() returned before an in-line task ran";
  EXPECT_EQ(t, 1);
  EXPECT_THROW(w.post([] { throw std::runtime_error("in line"); }), std::runtime_error);
}

TEST(HostAccumulator, RefusesWhatItCannotAdd) {
  kiln::HostWorker w(kCpu, /*threaded=*/1);
  kiln::HostAccumulator acc(w, kCpu, 10);
  EXPECT_ANY_THROW(acc.add(at::zeros({11}), at::zeros({11})));                 // over capacity
  EXPECT_ANY_THROW(acc.add(at::zeros({4}), at::zeros({5})));                   // sizes differ
  EXPECT_ANY_THROW(acc.add(at::zeros({4}, at::kDouble), at::zeros({4}, at::kDouble)));  // not fp32
}
