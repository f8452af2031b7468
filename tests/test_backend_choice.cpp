// tests/test_backend_choice.cpp -- the backend rule (distributed/backend_choice.h) and the watchdog
// probes and health checks the NCCL backend relies on (distributed/watchdog.h), both on the CPU.
// Run under mpirun (2 ranks): choose_backend is collective; the ranks agree on the verdict
// (all-reduce of the failure flag) so one failing rank fails the test.
//
// The rule's GPU cases (distinct GPUs, two ranks on one GPU, UUIDs on different nodes) are
// checked on facts written by hand through decide_backend, which choose_backend applies to the
// facts it gathers; the gathering itself runs here on CPU ranks.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <mpi.h>

#include "distributed/backend_choice.h"
#include "distributed/env.h"
#include "distributed/error.h"
#include "distributed/watchdog.h"

namespace {

using kiln::RankDevice;

RankDevice gpu(int node, const std::string& uuid) { return {true, node, uuid, "cuda:0 on host n" + std::to_string(node)}; }
RankDevice cpu(int node) { return {false, node, "", "cpu on host n" + std::to_string(node)}; }

// The ConfigError's message, or "" when none was thrown.
std::string config_error(const std::string& requested, bool have_nccl, const std::vector<RankDevice>& ranks) {
  try {
    kiln::decide_backend(requested, have_nccl, ranks);
  } catch (const kiln::ConfigError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Polls `ok` for up to `seconds`.
template <typename F>
bool eventually(F ok, double seconds = 3.0) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (ok()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return ok();
}

// A watchdog handler that records the message instead of aborting the job.
struct Recorder {
  std::mutex mu;
  std::string message;
  std::atomic<bool> fired{false};
  std::function<void(const std::string&)> handler() {
    return [this](const std::string& m) {
      std::lock_guard<std::mutex> lock(mu);
      message = m;
      fired = true;
    };
  }
  std::string get() {
    std::lock_guard<std::mutex> lock(mu);
    return message;
  }
};

}  // namespace

// ---- choose_backend on this job's CPU ranks ----------------------------------------------------

TEST(BackendChoice, AutoOnCpuIsMpi) {
  EXPECT_EQ(kiln::choose_backend("auto", c10::Device(c10::kCPU), MPI_COMM_WORLD), "mpi");
  EXPECT_EQ(kiln::choose_backend("mpi", c10::Device(c10::kCPU), MPI_COMM_WORLD), "mpi");
  EXPECT_EQ(kiln::choose_backend("auto", c10::Device(c10::kCPU), MPI_COMM_SELF), "mpi");  // a world of one
}

TEST(BackendChoice, NcclOnCpuIsAConfigErrorOnEveryRank) {
  try {
    kiln::choose_backend("nccl", c10::Device(c10::kCPU), MPI_COMM_WORLD);
    FAIL() << "nccl on CPU ranks must be refused";
  } catch (const kiln::ConfigError& e) {
    const std::string m = e.what();
    EXPECT_TRUE(contains(m, "--backend nccl: ")) << m;
    EXPECT_TRUE(contains(m, "use --backend mpi")) << m;
    if (kiln::build_has_nccl()) {  // the same line on every rank: rank 0 is named on rank 1 too
      EXPECT_TRUE(contains(m, "rank 0 computes on cpu on host ")) << m;
    }
    EXPECT_EQ(m.find('\n'), std::string::npos) << "one line: " << m;
    EXPECT_EQ(e.exit_code(), 2);
  }
  EXPECT_THROW(kiln::choose_backend("nccl", c10::Device(c10::kCPU), MPI_COMM_SELF), kiln::ConfigError);
  EXPECT_THROW(kiln::choose_backend("gloo", c10::Device(c10::kCPU), MPI_COMM_WORLD), kiln::ConfigError);
}

// ---- the rule on facts written by hand -------------------------------------------------------

TEST(BackendRule, OneGpuPerRankIsNccl) {
  const std::vector<RankDevice> ranks = {gpu(0, "GPU-a"), gpu(0, "GPU-b"), gpu(2, "GPU-a"), gpu(2, "GPU-b")};
  EXPECT_EQ(kiln::decide_backend("auto", true, ranks), "nccl");
  EXPECT_EQ(kiln::decide_backend("nccl", true, ranks), "nccl");
  EXPECT_EQ(kiln::decide_backend("mpi", true, ranks), "mpi");
  // The same UUID on two nodes is two GPUs (the ids only mean something within a node).
  EXPECT_EQ(kiln::decide_backend("nccl", true, {gpu(0, "GPU-a"), gpu(1, "GPU-a")}), "nccl");
}

TEST(BackendRule, TwoRanksOnOneGpuIsMpiOrAnError) {
  const std::vector<RankDevice> ranks = {gpu(0, "GPU-a"), gpu(0, "GPU-b"), gpu(2, "GPU-c"), gpu(2, "GPU-c")};
  EXPECT_EQ(kiln::decide_backend("auto", true, ranks), "mpi");
  const std::string m = config_error("nccl", true, ranks);
  EXPECT_TRUE(contains(m, "ranks 2 and 3 share one GPU (cuda:0 on host n2)")) << m;
  EXPECT_TRUE(contains(m, "use --backend mpi")) << m;
}

TEST(BackendRule, ACpuRankOrNoNcclIsMpiOrAnError) {
  const std::vector<RankDevice> mixed = {gpu(0, "GPU-a"), cpu(0)};
  EXPECT_EQ(kiln::decide_backend("auto", true, mixed), "mpi");
  EXPECT_TRUE(contains(config_error("nccl", true, mixed), "rank 1 computes on cpu on host n0"));
  const std::vector<RankDevice> gpus = {gpu(0, "GPU-a"), gpu(0, "GPU-b")};
  EXPECT_EQ(kiln::decide_backend("auto", false, gpus), "mpi");
  EXPECT_TRUE(contains(config_error("nccl", false, gpus), "this build of kiln has no NCCL"));
}

TEST(BackendRule, AWorldOfOneFollowsTheDevice) {
  EXPECT_EQ(kiln::decide_backend("auto", true, {gpu(0, "GPU-a")}), "nccl");
  EXPECT_EQ(kiln::decide_backend("nccl", true, {gpu(0, "GPU-a")}), "nccl");
  EXPECT_EQ(kiln::decide_backend("auto", true, {cpu(0)}), "mpi");
  EXPECT_TRUE(contains(config_error("nccl", true, {cpu(0)}), "the device is cpu on host n0"));
  EXPECT_TRUE(contains(config_error("bogus", true, {cpu(0)}), "--backend must be auto, nccl or mpi (got 'bogus')"));
}

// ---- watchdog probes and health checks ---------------------------------------------------------

TEST(WatchdogProbes, AProbeCompletesItsEntry) {
  Recorder rec;
  kiln::Watchdog wd(30.0, rec.handler());
  std::atomic<bool> done{false};
  const uint64_t plain = wd.start("plain");
  wd.start("probed", [&done] { return done.load(); });
  EXPECT_EQ(wd.outstanding(), 2u);
  std::this_thread::sleep_for(std::chrono::milliseconds(250));  // two ticks: a false probe keeps it
  EXPECT_EQ(wd.outstanding(), 2u);
  done = true;
  EXPECT_TRUE(eventually([&] { return wd.outstanding() == 1u; }));  // the plain entry stays
  wd.complete(plain);
  EXPECT_EQ(wd.outstanding(), 0u);
  EXPECT_FALSE(rec.fired.load());
}

TEST(WatchdogProbes, AProbeThatNeverFiresTimesOut) {
  Recorder rec;
  kiln::Watchdog wd(0.3, rec.handler());
  wd.start("rank 0: all_reduce #1 on group 'dp' (nccl, 4 bytes)", [] { return false; });
  ASSERT_TRUE(eventually([&] { return rec.fired.load(); }));
  EXPECT_EQ(rec.get(),
            "rank 0: all_reduce #1 on group 'dp' (nccl, 4 bytes) did not complete within 0.3 s (--comm-timeout): "
            "a peer rank has stalled or died; aborting the job");
}

TEST(WatchdogProbes, AProbeThatThrowsEndsTheJob) {
  Recorder rec;
  kiln::Watchdog wd(30.0, rec.handler());
  wd.start("rank 0: broadcast #3 on group 'world' (nccl, 8 bytes)",
           []() -> bool { throw kiln::Error("cudaEventQuery failed: an illegal memory access was encountered"); });
  ASSERT_TRUE(eventually([&] { return rec.fired.load(); }));
  EXPECT_EQ(rec.get(),
            "rank 0: broadcast #3 on group 'world' (nccl, 8 bytes) failed: cudaEventQuery failed: an illegal memory "
            "access was encountered; aborting the job");
}

TEST(WatchdogProbes, AFailedHealthCheckRunsItsHookThenEndsTheJob) {
  Recorder rec;
  kiln::Watchdog wd(30.0, rec.handler());
  std::atomic<int> calls{0};
  std::atomic<bool> hook_ran{false}, hook_before_handler{false};
  wd.add_health_check(
      [&calls]() -> std::string {
        return ++calls < 3 ? "" : "rank 0: NCCL error on group 'dp' (cuda:0): remote process exited or there was a network error";
      },
      [&] {
        hook_before_handler = !rec.fired.load();
        hook_ran = true;
      });
  ASSERT_TRUE(eventually([&] { return rec.fired.load(); }));
  EXPECT_TRUE(hook_ran.load());
  EXPECT_TRUE(hook_before_handler.load());
  EXPECT_GE(calls.load(), 3);  // checked every tick until it failed
  EXPECT_EQ(rec.get(), "rank 0: NCCL error on group 'dp' (cuda:0): remote process exited or there was a network error; "
                       "aborting the job");
}

TEST(WatchdogProbes, RemovingAHealthCheckWaitsForARunningOne) {
  Recorder rec;
  kiln::Watchdog wd(30.0, rec.handler());
  std::atomic<bool> running{false};
  std::atomic<int> calls{0};
  const uint64_t id = wd.add_health_check([&]() -> std::string {
    running = true;
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    running = false;
    return "";
  });
  ASSERT_TRUE(eventually([&] { return running.load(); }));
  wd.remove_health_check(id);
  EXPECT_FALSE(running.load()) << "remove_health_check returned while the check was still running";
  const int after = calls.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(350));
  EXPECT_EQ(calls.load(), after) << "a removed check ran again";
  // start() and complete() do not wait for a slow probe or check.
  std::atomic<bool> inside{false};
  const uint64_t slow = wd.add_health_check([&inside]() -> std::string {
    inside = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    inside = false;
    return "";
  });
  ASSERT_TRUE(eventually([&] { return inside.load(); }));
  const auto t0 = std::chrono::steady_clock::now();
  wd.complete(wd.start("quick"));  // blocked, this would take the rest of the check's second
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.5);
  wd.remove_health_check(slow);
  EXPECT_FALSE(rec.fired.load());
}

int main(int argc, char** argv) {
  kiln::Environment env(&argc, &argv);
  if (!env.info().mpi) {
    std::fprintf(stderr, "test_backend_choice: run under mpirun (e.g. mpirun -np 2 %s)\n", argv[0]);
    return 2;
  }
  ::testing::InitGoogleTest(&argc, argv);
  if (env.info().rank != 0) {  // one rank reports; the verdict is shared below
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (env.info().rank == 0)
    std::printf("test_backend_choice: %d ranks, %s\n", env.info().world_size, any_failed ? "FAILED on some rank" : "passed on every rank");
  return any_failed;
}
