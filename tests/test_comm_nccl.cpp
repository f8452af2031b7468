// tests/test_comm_nccl.cpp -- every collective of the NCCL backend, every dtype, on CUDA tensors,
// on the world and on sub-groups, against values computed by hand; and the Work / stream /
// watchdog semantics of distributed/comm_nccl.h. Run under mpirun with one rank per GPU (CTest runs
// one rank: NCCL refuses two ranks on one GPU). Exits 77 (skipped) without a CUDA device. The
// ranks agree on the verdict (all-reduce of the failure flag) so one failing rank fails the test.
//
// Inputs: rank r holds (r + 1) * (i + 1) at element i. With n <= 7 ranks and i < 8 every Sum,
// Max and Min below is an integer under 256, exact in every dtype including uint8. Avg: NCCL
// multiplies each input by 1/n rounded to the dtype before summing, exact when n is a power of
// two; otherwise the rounding of 1/n bounds the error (bf16 8 bits, fp16 11, fp32 24), so the
// floating Avg checks allow a relative 2^-7 / 2^-10 / 2^-22 / 2^-50.
//
// The stream tests hold the caller's stream with a spinning kernel (at::cuda::sleep) for about
// half a second, so the order of events is fixed: what the tests observe would differ if the
// collective did not wait for the caller's stream, if wait() did not order the waiting stream,
// or if a tensor's memory were handed out again while the collective still used it.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/cuda.h>

#include "distributed/comm_nccl.h"
#include "distributed/env.h"
#include "distributed/error.h"
#include "distributed/watchdog.h"

namespace {

std::shared_ptr<kiln::Communicator> g_world;  // set by main(); tests only read it
std::shared_ptr<kiln::Watchdog> g_watchdog;   // g_world's (aborts the job on a stall)
int g_device = 0;

const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf,
                                             at::kInt,   at::kLong,   at::kByte};
constexpr int64_t kSpinCycles = 1'000'000'000;  // about 0.5 s at an H100's clock

at::TensorOptions on_gpu(at::ScalarType dtype) {
  return at::TensorOptions().dtype(dtype).device(at::kCUDA, static_cast<c10::DeviceIndex>(g_device));
}

at::Tensor ramp(int64_t n, double scale, at::ScalarType dtype) {
  return (at::arange(1, n + 1, at::kDouble) * scale).to(on_gpu(dtype));
}

std::string name(at::ScalarType dtype) { return c10::toString(dtype); }

void expect_equal(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  const at::Tensor g = got.to(at::kCPU).to(at::kDouble);
  EXPECT_TRUE(at::equal(g, want.to(at::kDouble))) << what << ": got " << g << " want " << want;
}

void expect_close(const at::Tensor& got, const at::Tensor& want, double rtol, const std::string& what) {
  const at::Tensor g = got.to(at::kCPU).to(at::kDouble);
  EXPECT_TRUE(at::allclose(g, want.to(at::kDouble), rtol, 0.0)) << what << ": got " << g << " want " << want;
}

double avg_rtol(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16: return 1.0 / 128;
    case at::kHalf: return 1.0 / 1024;
    case at::kFloat: return 1.0 / (1 << 22);
    default: return 1e-15;
  }
}

template <typename F>
bool eventually(F ok, double seconds = 5.0) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (ok()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return ok();
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// all_to_all (tests/test_comm_mpi.cpp has the same): rank s sends rows_to(s, j) rows to rank j,
// uneven, with empty blocks and a rank 1 that sends nothing; element c of row i of the block s
// sends j holds 10000 s + 1000 j + 10 i + c, so a misplaced row or element shows.
int64_t rows_to(int s, int j) { return s == 1 ? 0 : (3 * s + 2 * j + 1) % 5; }

// The blocks (sender, receiver) in order, rows of `width` elements, on the GPU.
at::Tensor a2a_rows(const std::vector<std::pair<int, int>>& blocks, int64_t width, at::ScalarType dtype) {
  int64_t rows = 0;
  for (const auto& [s, j] : blocks) rows += rows_to(s, j);
  auto t = at::empty({rows, width}, at::kDouble);
  int64_t at_row = 0;
  for (const auto& [s, j] : blocks)
    for (int64_t i = 0; i < rows_to(s, j); ++i, ++at_row)
      for (int64_t c = 0; c < width; ++c) t[at_row][c] = 10000.0 * s + 1000.0 * j + 10.0 * i + c;
  return t.to(on_gpu(dtype));
}

}  // namespace

TEST(NcclComm, AllReduceEveryOpEveryDtype) {
  auto& c = *g_world;
  const int n = c.size(), r = c.rank();
  for (auto dtype : kDtypes) {
    for (auto op : {kiln::ReduceOp::Sum, kiln::ReduceOp::Max, kiln::ReduceOp::Min, kiln::ReduceOp::Avg}) {
      auto t = ramp(8, r + 1, dtype);
      c.all_reduce(t, op)->wait();
      const double factor = op == kiln::ReduceOp::Sum   ? n * (n + 1) / 2.0
                            : op == kiln::ReduceOp::Max ? n
                            : op == kiln::ReduceOp::Min ? 1
                                                        : (n + 1) / 2.0;
      auto want = at::arange(1, 9, at::kDouble) * factor;
      const std::string what = name(dtype) + " op " + std::to_string(static_cast<int>(op));
      if (op != kiln::ReduceOp::Avg) {
        expect_equal(t, want, what);
      } else if (at::isIntegralType(dtype, false)) {  // sum, then division truncating (= floor here)
        expect_equal(t, (at::arange(1, 9, at::kDouble) * (n * (n + 1) / 2.0)).div(n, "floor"), what);
      } else {
        expect_close(t, want, avg_rtol(dtype), what);
      }
    }
  }
}

TEST(NcclComm, ReduceScatterAndAllGather) {
  auto& c = *g_world;
  const int n = c.size(), r = c.rank();
  for (auto dtype : kDtypes) {
    auto in = ramp(4 * n, r + 1, dtype);  // chunk k holds elements 4k..4k+3
    auto out = at::full({4}, 7, on_gpu(dtype));
    c.reduce_scatter(out, in, kiln::ReduceOp::Sum)->wait();
    expect_equal(out, at::arange(4 * r + 1, 4 * r + 5, at::kDouble) * (n * (n + 1) / 2.0), "reduce_scatter " + name(dtype));
    c.reduce_scatter(out, in, kiln::ReduceOp::Max)->wait();
    expect_equal(out, at::arange(4 * r + 1, 4 * r + 5, at::kDouble) * n, "reduce_scatter max " + name(dtype));

    auto mine = (at::arange(0, 3, at::kDouble) + 10.0 * r).to(on_gpu(dtype));
    auto all = at::zeros({3 * n}, on_gpu(dtype));
    c.all_gather(all, mine)->wait();
    auto want = at::empty({3 * n}, at::kDouble);
    for (int k = 0; k < n; ++k)
      for (int j = 0; j < 3; ++j) want[3 * k + j] = 10.0 * k + j;
    expect_equal(all, want, "all_gather " + name(dtype));
  }
}

// The in-place forms ZeRO uses (NCCL's own in-place rule).
TEST(NcclComm, InPlaceReduceScatterAndAllGather) {
  auto& c = *g_world;
  const int n = c.size(), r = c.rank();
  auto buf = ramp(4 * n, r + 1, at::kFloat);
  auto own = buf.narrow(0, 4 * r, 4);
  c.reduce_scatter(own, buf, kiln::ReduceOp::Avg)->wait();
  expect_equal(own, at::arange(4 * r + 1, 4 * r + 5, at::kDouble) * ((n + 1) / 2.0), "in-place reduce_scatter");
  auto all = at::full({3 * n}, -1.0, on_gpu(at::kFloat));
  auto mine = all.narrow(0, 3 * r, 3);
  mine.copy_(at::arange(0, 3, at::kFloat) + 10.0f * r);
  c.all_gather(all, mine)->wait();
  auto want = at::empty({3 * n}, at::kDouble);
  for (int k = 0; k < n; ++k)
    for (int j = 0; j < 3; ++j) want[3 * k + j] = 10.0 * k + j;
  expect_equal(all, want, "in-place all_gather");
}

TEST(NcclComm, BroadcastFromEveryRoot) {
  auto& c = *g_world;
  for (int root = 0; root < c.size(); ++root) {
    for (auto dtype : kDtypes) {
      auto t = at::full({5}, c.rank() + 1, on_gpu(dtype));
      c.broadcast(t, root)->wait();
      expect_equal(t, at::full({5}, root + 1, at::kDouble), "broadcast " + name(dtype));
    }
  }
}

TEST(NcclComm, RingSendRecvPostedTogether) {
  auto& c = *g_world;
  const int n = c.size(), r = c.rank();
  // Every rank sends right and receives from the left in one call (with one rank: to itself).
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
    auto out = at::full({6}, r, on_gpu(dtype));
    auto in = at::full({6}, -1, on_gpu(dtype));
    c.send_recv({{kiln::P2POp::Kind::Send, out, (r + 1) % n}, {kiln::P2POp::Kind::Recv, in, (r - 1 + n) % n}})->wait();
    expect_equal(in, at::full({6}, (r - 1 + n) % n, at::kDouble), "send_recv " + name(dtype));
  }
}

TEST(NcclComm, SubGroupsFromSplit) {
  auto& c = *g_world;
  const int n = c.size(), r = c.rank();
  auto half = c.split(r % 2, r, "parity");
  EXPECT_STREQ(half->backend(), "nccl");
  EXPECT_EQ(half->name(), "parity");
  int members = 0, rank_sum = 0;
  for (int k = 0; k < n; ++k)
    if (k % 2 == r % 2) ++members, rank_sum += k;
  EXPECT_EQ(half->size(), members);
  EXPECT_EQ(half->rank(), r / 2);
  for (auto dtype : kDtypes) {
    auto t = at::full({4}, r, on_gpu(dtype));
    half->all_reduce(t, kiln::ReduceOp::Sum)->wait();
    expect_equal(t, at::full({4}, rank_sum, at::kDouble), "sub-group all_reduce " + name(dtype));
  }
  auto mine = at::full({2}, r, on_gpu(at::kFloat));
  auto all = at::zeros({2 * members}, on_gpu(at::kFloat));
  half->all_gather(all, mine)->wait();
  auto want = at::empty({2 * members}, at::kDouble);
  for (int k = r % 2, j = 0; k < n; k += 2, ++j) want.narrow(0, 2 * j, 2).fill_(k);
  expect_equal(all, want, "sub-group all_gather");
  half->barrier();
  // The world still works after the split, and sub-group traffic is counted on the sub-group.
  auto t = at::ones({2}, on_gpu(at::kFloat));
  g_world->all_reduce(t, kiln::ReduceOp::Sum)->wait();
  expect_equal(t, at::full({2}, n, at::kDouble), "world after split");
  EXPECT_EQ(half->stats().calls, static_cast<int64_t>(kDtypes.size()) + 2);
  EXPECT_EQ(half->sequence(), kDtypes.size() + 2);
}

// all_to_all against the dense exchange each rank computes by itself: the counts first (an
// all_to_all of one int64 per rank, equal splits), then the rows, fp32 and int64; the traffic
// counted is the whole input (comm.h).
TEST(NcclComm, AllToAllUnevenSplitsAgainstTheDenseExchange) {
  auto& c = *g_world;
  const int n = c.size(), r = c.rank();
  std::vector<int64_t> in_splits;
  std::vector<std::pair<int, int>> sent, got;
  for (int k = 0; k < n; ++k) {
    in_splits.push_back(rows_to(r, k));
    sent.emplace_back(r, k);
    got.emplace_back(k, r);
  }
  auto counts = at::tensor(in_splits, at::kLong).to(on_gpu(at::kLong));
  auto theirs = at::full({n}, -1, on_gpu(at::kLong));
  c.all_to_all(theirs, counts, {}, {})->wait();
  const auto host = theirs.to(at::kCPU);
  std::vector<int64_t> out_splits(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + n);
  for (int k = 0; k < n; ++k) EXPECT_EQ(out_splits[k], rows_to(k, r)) << "the count exchange, from rank " << k;
  for (auto dtype : {at::kFloat, at::kLong}) {
    auto in = a2a_rows(sent, 3, dtype);
    auto want = a2a_rows(got, 3, dtype).to(at::kCPU);
    auto out = at::full(want.sizes(), -1, on_gpu(dtype));
    const auto before = c.stats();
    c.all_to_all(out, in, out_splits, in_splits)->wait();
    EXPECT_EQ(c.stats().bytes, before.bytes + static_cast<int64_t>(in.nbytes()));
    expect_equal(out, want, "all_to_all " + name(dtype));
  }
  auto eq_in = at::arange(2 * n, on_gpu(at::kFloat)) + 100 * r;  // equal splits: 2 rows of 1 each
  auto eq_out = at::full({2 * n}, -1, on_gpu(at::kFloat));
  c.all_to_all(eq_out, eq_in, {}, {})->wait();
  auto eq_want = at::empty({2 * n}, at::kDouble);
  for (int k = 0; k < n; ++k)
    for (int i = 0; i < 2; ++i) eq_want[2 * k + i] = 2 * r + i + 100 * k;
  expect_equal(eq_out, eq_want, "all_to_all equal splits");
  // Refused before it takes a sequence number: CPU tensors, splits that do not add up.
  const auto seq = c.sequence();
  auto cpu = at::zeros({2 * n}, at::kFloat);
  try {
    c.all_to_all(cpu, cpu.clone(), {}, {});
    FAIL() << "CPU tensors must be refused";
  } catch (const kiln::Error& e) {
    EXPECT_TRUE(contains(e.what(), "backend nccl does not support CPU tensors; ")) << e.what();
    EXPECT_TRUE(contains(e.what(), "all_to_all #")) << e.what();
  }
  std::vector<int64_t> wrong(static_cast<size_t>(n), 2);
  wrong[0] = 3;
  EXPECT_THROW(c.all_to_all(eq_out, eq_in, {}, wrong), kiln::Error);
  EXPECT_EQ(c.sequence(), seq) << "a refused call must not take a sequence number";
}

// The collective waits for what the caller's stream queued before it; wait() orders the waiting
// thread's current stream after the collective without blocking the host.
TEST(NcclComm, WorkIsOrderedOnStreamsNotOnTheHost) {
  auto& c = *g_world;
  const int n = c.size(), r = c.rank();
  const auto dev = static_cast<c10::DeviceIndex>(g_device);
  auto producer = c10::cuda::getStreamFromPool(false, dev);
  auto consumer = c10::cuda::getStreamFromPool(false, dev);
  auto in = at::zeros({1024}, on_gpu(at::kFloat));
  auto out = at::full({1024 * n}, -1.0, on_gpu(at::kFloat));
  c10::cuda::device_synchronize();
  std::shared_ptr<kiln::Work> work;
  {
    c10::cuda::CUDAStreamGuard guard(producer);
    at::cuda::sleep(kSpinCycles);  // the producer is busy for ~0.5 s ...
    in.fill_(r + 1);               // ... then writes the input
    work = c.all_gather(out, in);  // must gather r + 1, not the zeros there now
  }
  EXPECT_FALSE(work->is_completed()) << "the collective ran before the caller's stream reached it";
  {
    c10::cuda::CUDAStreamGuard guard(consumer);
    const auto t0 = std::chrono::steady_clock::now();
    work->wait();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(waited, 0.2) << "wait() blocked the host";
    EXPECT_FALSE(work->is_completed()) << "wait() returned after the device finished: it blocked the host";
    auto seen = out.to(at::kCPU);  // on the consumer stream: correct only because of wait()
    auto want = at::empty({1024 * n}, at::kDouble);
    for (int k = 0; k < n; ++k) want.narrow(0, 1024 * k, 1024).fill_(k + 1);
    expect_equal(seen, want, "all_gather read on another stream after wait()");
  }
  EXPECT_TRUE(work->is_completed());
}

// A tensor dropped right after the call keeps its memory until the collective is done with it
// (CUDACachingAllocator::recordStream). Without that, the allocator hands the same block to the
// next allocation of that size on the same stream at once.
TEST(NcclComm, ADroppedTensorIsNotReusedWhileTheCollectiveNeedsIt) {
  auto& c = *g_world;
  const int n = c.size(), r = c.rank();
  const auto dev = static_cast<c10::DeviceIndex>(g_device);
  auto producer = c10::cuda::getStreamFromPool(false, dev);
  auto out = at::zeros({(1 << 20) * n}, on_gpu(at::kFloat));
  c10::cuda::device_synchronize();
  std::shared_ptr<kiln::Work> work;
  {
    c10::cuda::CUDAStreamGuard guard(producer);
    at::cuda::sleep(kSpinCycles);
    auto in = at::full({1 << 20}, r + 1.0, on_gpu(at::kFloat));
    const void* block = in.data_ptr();
    work = c.all_gather(out, in);
    in.reset();
    auto next = at::full({1 << 20}, 99.0, on_gpu(at::kFloat));
    EXPECT_NE(next.data_ptr(), block) << "the input's memory was reused while the collective still needed it";
    work->wait();
  }
  auto want = at::empty({(1 << 20) * n}, at::kDouble);
  for (int k = 0; k < n; ++k) want.narrow(0, (1 << 20) * k, 1 << 20).fill_(k + 1);
  {
    c10::cuda::CUDAStreamGuard guard(producer);
    expect_equal(out, want, "all_gather of a dropped input");
  }
}

TEST(NcclComm, WorkHandlesAndCounters) {
  auto& c = *g_world;
  const auto before = c.stats();
  const auto seq = c.sequence();
  auto t = at::ones({1000}, on_gpu(at::kFloat));
  auto work = c.all_reduce(t, kiln::ReduceOp::Sum);
  EXPECT_TRUE(eventually([&] { return work->is_completed(); }));
  work->wait();  // idempotent once complete
  EXPECT_EQ(t[999].item<float>(), static_cast<float>(c.size()));
  EXPECT_EQ(c.sequence(), seq + 1);
  EXPECT_EQ(c.stats().calls, before.calls + 1);
  EXPECT_EQ(c.stats().bytes, before.bytes + 8000);  // all_reduce counts 2x (comm.h)
  c.barrier();
  EXPECT_EQ(c.sequence(), seq + 2);
  EXPECT_EQ(c.stats().bytes, before.bytes + 8000);  // all_reduce counts 2x (comm.h)
  // A dropped handle is fine: the collective still completes, and its result is on the stream.
  auto u = at::ones({16}, on_gpu(at::kInt));
  c.all_reduce(u, kiln::ReduceOp::Sum);
  c10::cuda::device_synchronize();
  EXPECT_EQ(u[15].item<int>(), c.size());
}

TEST(NcclComm, UnsupportedInputIsRefusedWithItsName) {
  auto& c = *g_world;
  const auto seq = c.sequence();
  auto on_cpu = at::ones({4}, at::kFloat);
  try {
    c.all_reduce(on_cpu, kiln::ReduceOp::Sum);
    FAIL() << "a CPU tensor must be refused";
  } catch (const kiln::Error& e) {
    EXPECT_TRUE(contains(e.what(), "backend nccl does not support CPU tensors; ")) << e.what();
    EXPECT_TRUE(contains(e.what(), "all_reduce #")) << e.what();
    // Algorithm bytes (distributed/comm.h, CommStats): an all-reduce counts twice its 16-byte tensor.
    EXPECT_TRUE(contains(e.what(), "on group 'world' (nccl, 32 bytes)")) << e.what();
  }
  auto b = at::ones({4}, on_gpu(at::kBool));
  try {
    c.all_reduce(b, kiln::ReduceOp::Sum);
    FAIL() << "bool must be refused";
  } catch (const kiln::Error& e) {
    EXPECT_TRUE(contains(e.what(), "backend nccl does not support dtype Bool")) << e.what();
  }
  auto strided = at::ones({4, 4}, on_gpu(at::kFloat)).t().narrow(0, 0, 2);
  EXPECT_THROW(c.all_reduce(strided, kiln::ReduceOp::Sum), kiln::Error);
  auto f = at::ones({2}, on_gpu(at::kFloat));
  auto d = at::ones({2 * c.size()}, on_gpu(at::kDouble));
  EXPECT_THROW(c.all_gather(d, f), kiln::Error);  // dtypes differ
  auto wrong = at::ones({2 * c.size() + 1}, on_gpu(at::kFloat));
  EXPECT_THROW(c.all_gather(wrong, f), kiln::Error);  // sizes do not match
  EXPECT_THROW(c.broadcast(f, c.size()), kiln::Error);
  EXPECT_EQ(c.sequence(), seq) << "a refused call must not take a sequence number";
}

// Every operation is watched until its event fires, and nothing stays registered afterwards
// (creation, destruction and barrier entries included).
TEST(NcclComm, TheWatchdogSeesEveryOperationUntilItsEventFires) {
  auto& c = *g_world;
  ASSERT_TRUE(eventually([] { return g_watchdog->outstanding() == 0; }));
  auto t = at::ones({8}, on_gpu(at::kFloat));
  at::cuda::sleep(kSpinCycles);  // on the current stream: the collective cannot finish yet
  auto work = c.all_reduce(t, kiln::ReduceOp::Sum);
  work->wait();
  EXPECT_EQ(g_watchdog->outstanding(), 1u) << "the entry went before the collective finished";
  work.reset();  // the entry outlives the handle
  EXPECT_EQ(g_watchdog->outstanding(), 1u);
  c10::cuda::device_synchronize();
  EXPECT_TRUE(eventually([] { return g_watchdog->outstanding() == 0; })) << "the probe did not complete the entry";
  {
    auto sub = c.split(0, c.rank(), "everyone");
    sub->barrier();
  }  // destroyed here
  EXPECT_TRUE(eventually([] { return g_watchdog->outstanding() == 0; }));
}

// A collective stuck behind its stream for longer than the timeout ends the job with one line.
TEST(NcclComm, AStalledCollectiveTimesOut) {
  std::mutex mu;
  std::string message;
  std::atomic<bool> fired{false};
  auto wd = std::make_shared<kiln::Watchdog>(120.0, [&](const std::string& m) {
    std::lock_guard<std::mutex> lock(mu);
    message = m;
    fired = true;
  });
  auto c = kiln::make_nccl_communicator(MPI_COMM_WORLD, "timed", g_device, wd);
  wd->set_timeout(0.3);  // after creation, which can take longer than that
  auto t = at::ones({4}, on_gpu(at::kFloat));
  at::cuda::sleep(3 * kSpinCycles);  // ~1.5 s
  auto work = c->all_reduce(t, kiln::ReduceOp::Sum);
  ASSERT_TRUE(eventually([&] { return fired.load(); }));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(contains(message, ": all_reduce #1 on group 'timed' (nccl, 32 bytes) did not complete within 0.3 s"))
        << message;
  }
  c10::cuda::device_synchronize();
  work.reset();
  c.reset();  // ncclCommDestroy; the watchdog thread has stopped after the handler returned
}

int main(int argc, char** argv) {
  if (!torch::cuda::is_available()) {  // before MPI is touched: a plain exit is a clean one
    std::printf("test_comm_nccl: SKIP: no CUDA device visible to LibTorch\n");
    return 77;
  }
  kiln::Environment env(&argc, &argv);
  if (!env.info().mpi) {
    std::fprintf(stderr, "test_comm_nccl: run under mpirun (e.g. mpirun -np 1 %s)\n", argv[0]);
    return 2;
  }
  ::testing::InitGoogleTest(&argc, argv);
  if (env.info().rank != 0) {  // one rank reports; the verdict is shared below
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  g_device = env.info().local_rank % static_cast<int>(torch::cuda::device_count());
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(g_device));
  g_watchdog = std::make_shared<kiln::Watchdog>(120.0);  // a hang ends the job with a line
  int failed = 0;
  try {
    g_world = kiln::make_nccl_communicator(MPI_COMM_WORLD, "world", g_device, g_watchdog);
    failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "test_comm_nccl: rank %d: %s\n", env.info().rank, e.what());
    failed = 1;
  }
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (env.info().rank == 0)
    std::printf("test_comm_nccl: %d ranks, %s\n", env.info().world_size, any_failed ? "FAILED on some rank" : "passed on every rank");
  g_world.reset();
  g_watchdog.reset();
  return any_failed;
}
