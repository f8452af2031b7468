// distributed/comm_nccl.cpp -- Communicator over NCCL, on a CUDA stream of the communicator's own.
#include "distributed/all_to_all_blocks.h"
#include "distributed/comm_nccl.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <future>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "distributed/error.h"
#include "distributed/wait_clock.h"
#include "distributed/watchdog.h"

namespace kiln {

namespace {

// ---- checks ----------------------------------------------------------------------------------

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

// Where a checked call was made: the call as written, and the source line.
struct Site {
  const char* call;
  const char* file;
  int line;
};

// "ncclAllReduce at distributed/comm_nccl.cpp:123 on host gpu-7"
std::string where(const Site& s) {
  std::string call(s.call);
  call = call.substr(0, call.find('('));
  std::string file(s.file);
  const size_t cut = file.rfind("runtime/");
  if (cut != std::string::npos) file = file.substr(cut);
  return call + " at " + file + ":" + std::to_string(s.line) + " on host " + host_name();
}

const char* nccl_hint(ncclResult_t rc) {
  switch (rc) {
    case ncclSystemError:
    case ncclRemoteError:
      return " [a network, shared-memory or peer failure; NCCL_DEBUG=INFO shows which, NCCL_SOCKET_IFNAME picks the interface]";
    case ncclInvalidUsage:
      return " [NCCL_DEBUG=WARN prints NCCL's report; two ranks on one GPU need --backend mpi]";
    default:
      return " [NCCL_DEBUG=WARN prints NCCL's own report]";
  }
}

[[noreturn]] void throw_nccl(ncclResult_t rc, const Site& site, const std::string& what) {
  std::string m = what + ": " + where(site) + " failed: " + ncclGetErrorString(rc);
  const char* last = ncclGetLastError(nullptr);  // the comm argument is unused by NCCL
  if (last != nullptr && *last != '\0') m += std::string(" (") + last + ")";
  throw Error(m + nccl_hint(rc));
}

void check_nccl(ncclResult_t rc, const Site& site, const std::string& what) {
  if (rc != ncclSuccess) throw_nccl(rc, site, what);
}

void check_cuda(cudaError_t rc, const Site& site, const std::string& what) {
  if (rc == cudaSuccess) return;
  throw Error(what + ": " + where(site) + " failed: " + cudaGetErrorName(rc) + ": " + cudaGetErrorString(rc));
}

void check_mpi(int rc, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(what + " failed: " + std::string(msg, len));
}

// Every NCCL and CUDA call goes through one of these. `what` names rank, operation and group.
#define KILN_NCCL_CHECK(call, what) check_nccl((call), Site{#call, __FILE__, __LINE__}, (what))
#define KILN_CUDA_CHECK(call, what) check_cuda((call), Site{#call, __FILE__, __LINE__}, (what))

// ---- events and watchdog entries -------------------------------------------------------------

// A CUDA event without timing, made on the current device (callers hold a device guard).
class Event {
 public:
  // timing: an event cudaEventElapsedTime can read (the wait clock's); others are cheaper.
  explicit Event(const std::string& what, bool timing = false) {
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming), what);
  }
  ~Event() { cudaEventDestroy(event_); }  // fine while pending: CUDA releases it once it fires
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// The event recorded after a collective, shared by its Work and its watchdog probe (which may
// outlive the Work). `recorded` is set once the event is recorded: an event never recorded
// reads as complete, and the watchdog entry exists before the launch (NCCL may block the host
// while it connects to peers on a first call, and that wait must be timed too).
struct DoneEvent {
  explicit DoneEvent(int device, const std::string& what) : device(device), event(what) {}
  // True once the collective is complete on the device; throws on a device error.
  bool query(const std::string& what) const {
    if (!recorded.load()) return false;
    const cudaError_t rc = cudaEventQuery(event.get());
    if (rc == cudaSuccess) return true;
    if (rc == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error; clear it, as c10's CUDAEvent::query does
      return false;
    }
    check_cuda(rc, Site{"cudaEventQuery", __FILE__, __LINE__}, what);
    return false;
  }
  const int device;
  Event event;
  std::atomic<bool> recorded{false};
};

// A watchdog entry that is completed when this object dies, unless release() hands it on.
class WatchEntry {
 public:
  WatchEntry(std::shared_ptr<Watchdog> watchdog, const std::string& what,
             std::function<bool()> done = nullptr)
      : watchdog_(std::move(watchdog)) {
    if (watchdog_) token_ = done ? watchdog_->start(what, std::move(done)) : watchdog_->start(what);
  }
  ~WatchEntry() {
    if (watchdog_ && !released_) watchdog_->complete(token_);
  }
  WatchEntry(const WatchEntry&) = delete;
  WatchEntry& operator=(const WatchEntry&) = delete;
  uint64_t release() {
    released_ = true;
    return token_;
  }

 private:
  std::shared_ptr<Watchdog> watchdog_;
  uint64_t token_ = 0;
  bool released_ = false;
};

// The NCCL communicator handle, shared by the communicator and its watchdog health check.
struct NcclHandle {
  ncclComm_t comm = nullptr;
  int device = 0;
  std::atomic<bool> aborted{false};
};

// ncclCommAbort, given at most `limit` to return: on a failure the peers may not join it (NCCL
// documents it as collective over the active ranks), and the job must still end. Runs once.
void abort_nccl(const std::shared_ptr<NcclHandle>& h, std::chrono::seconds limit) {
  if (h->comm == nullptr || h->aborted.exchange(true)) return;
  auto finished = std::make_shared<std::promise<void>>();
  std::future<void> returned = finished->get_future();
  std::thread([h, finished] {
    cudaSetDevice(h->device);
    ncclCommAbort(h->comm);
    finished->set_value();
  }).detach();
  if (returned.wait_for(limit) != std::future_status::ready) {
    std::fprintf(stderr, "kiln: warning: ncclCommAbort did not return within %lld s; going on without it\n",
                 static_cast<long long>(limit.count()));
  }
}

// ---- Work ------------------------------------------------------------------------------------

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<DoneEvent> done, std::string what, std::shared_ptr<Watchdog> watchdog, uint64_t token,
           std::shared_ptr<WaitClock> clock)
      : done_(std::move(done)), what_(std::move(what)), watchdog_(std::move(watchdog)), token_(token), clock_(std::move(clock)) {}
  // The watchdog entry stays until the event fires, whether or not this handle is kept.
  ~NcclWork() override = default;

  // Stream semantics (c10d): the calling thread's current stream on the group's device waits for
  // the collective; the host does not block.
  void wait() override {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(done_->device));
    const cudaStream_t current = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(done_->device)).stream();
    if (!clock_) {
      KILN_CUDA_CHECK(cudaStreamWaitEvent(current, done_->event.get(), 0), what_);
      return;
    }
    // distributed/wait_clock.h: how long the stream stood still here, read once the work is done.
    auto before = std::make_shared<Event>(what_, /*timing=*/true), after = std::make_shared<Event>(what_, /*timing=*/true);
    KILN_CUDA_CHECK(cudaEventRecord(before->get(), current), what_);
    KILN_CUDA_CHECK(cudaStreamWaitEvent(current, done_->event.get(), 0), what_);
    KILN_CUDA_CHECK(cudaEventRecord(after->get(), current), what_);
    clock_->add_later([before, after] {
      float ms = 0;
      if (cudaEventSynchronize(after->get()) != cudaSuccess || cudaEventElapsedTime(&ms, before->get(), after->get()) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0.0;
      }
      return static_cast<double>(ms);
    });
  }

  bool is_completed() override {
    if (!done_->query(what_)) return false;
    if (watchdog_) watchdog_->complete(token_);
    return true;
  }

 private:
  std::shared_ptr<DoneEvent> done_;
  std::string what_;
  std::shared_ptr<Watchdog> watchdog_;
  uint64_t token_;
  std::shared_ptr<WaitClock> clock_;
};

// ---- dtypes and operations -------------------------------------------------------------------

ncclDataType_t nccl_type(const at::Tensor& t, const std::string& what) {
  switch (t.scalar_type()) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kBFloat16: return ncclBfloat16;
    case at::kHalf: return ncclFloat16;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kByte: return ncclUint8;
    default:
      throw Error(what + ": backend nccl does not support dtype " + std::string(c10::toString(t.scalar_type())));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

// A stream of the communicator's own, at the highest priority, so collectives of one group never
// queue behind those of another (ranks may issue the groups' calls in different orders). It is
// never destroyed: the caching allocator records events on it whenever a tensor that a
// collective used is freed, which may be long after the communicator is gone.
c10::cuda::CUDAStream make_stream(int device, const std::string& what) {
  int count = 0;
  KILN_CUDA_CHECK(cudaGetDeviceCount(&count), what);
  if (device < 0 || device >= count) {
    throw Error(what + ": no GPU cuda:" + std::to_string(device) + " (" + std::to_string(count) + " visible)");
  }
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  int least = 0, greatest = 0;
  KILN_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest), what);
  cudaStream_t s = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest), what);
  return c10::cuda::getStreamFromExternal(s, static_cast<c10::DeviceIndex>(device));
}

// ---- the communicator ------------------------------------------------------------------------

// A sub-group's origin: ncclCommSplit of the parent's communicator with this color and key.
struct SplitOf {
  ncclComm_t parent = nullptr;
  int color = 0, key = 0;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MPI_Comm comm, std::string name, int device, std::shared_ptr<Watchdog> watchdog,
                   const SplitOf* split_of = nullptr)
      : name_(std::move(name)), device_(device), watchdog_(std::move(watchdog)),
        stream_(make_stream(device, "group '" + name_ + "' (nccl)")), nccl_(std::make_shared<NcclHandle>()) {
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
    const std::string what = "rank " + std::to_string(world_rank_) + ": init on group '" + name_ + "' (nccl, 0 bytes)";
    check_mpi(MPI_Comm_dup(comm, &mpi_), what + ": MPI_Comm_dup");
    try {
      MPI_Comm_set_errhandler(mpi_, MPI_ERRORS_RETURN);
      MPI_Comm_rank(mpi_, &rank_);
      MPI_Comm_size(mpi_, &size_);
      if (split_of != nullptr) init_split(*split_of, what);
      else init(what);
    } catch (...) {
      MPI_Comm_free(&mpi_);
      throw;
    }
    if (watchdog_) {
      const std::string who = "rank " + std::to_string(world_rank_) + ": NCCL error on group '" + name_ +
                              "' (cuda:" + std::to_string(device_) + ")";
      std::shared_ptr<NcclHandle> h = nccl_;
      health_ = watchdog_->add_health_check(
          [h, who]() -> std::string {
            if (h->aborted.load()) return "";
            ncclResult_t async = ncclSuccess;
            const ncclResult_t rc = ncclCommGetAsyncError(h->comm, &async);
            if (rc != ncclSuccess) return who + ": ncclCommGetAsyncError failed: " + ncclGetErrorString(rc);
            if (async == ncclSuccess || async == ncclInProgress) return "";
            std::string line = who + ": " + ncclGetErrorString(async);
            const char* last = ncclGetLastError(h->comm);
            if (last != nullptr && *last != '\0') line += std::string(" (") + last + ")";
            return line;
          },
          [h]() { abort_nccl(h, std::chrono::seconds(10)); });
    }
  }

  ~NcclCommunicator() override {
    if (watchdog_ && health_ != 0) watchdog_->remove_health_check(health_);  // no check runs after this
    if (nccl_->comm != nullptr && !nccl_->aborted.load()) {
      ncclResult_t async = ncclSuccess;
      const bool failed = ncclCommGetAsyncError(nccl_->comm, &async) != ncclSuccess ||
                          (async != ncclSuccess && async != ncclInProgress);
      if (failed || std::uncaught_exceptions() > 0) {
        // After an error: the peers may never join a destroy (an intra-node collective in
        // NCCL), so abort instead, within a bounded time.
        abort_nccl(nccl_, std::chrono::seconds(10));
      } else {
        // Waits for this group's outstanding work; watched, since it needs the peers on the node.
        WatchEntry watch(watchdog_, "rank " + std::to_string(world_rank_) + ": destroy on group '" + name_ +
                                        "' (nccl, 0 bytes)");
        cudaSetDevice(device_);  // not a CUDAGuard: nothing in a destructor may throw
        const ncclResult_t rc = ncclCommDestroy(nccl_->comm);
        if (rc != ncclSuccess)
          std::fprintf(stderr, "kiln: warning: rank %d: ncclCommDestroy on group '%s' failed: %s\n", world_rank_,
                       name_.c_str(), ncclGetErrorString(rc));
      }
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&mpi_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  const char* backend() const override { return "nccl"; }
  CommStats stats() const override { return {calls_.load(), bytes_.load()}; }
  uint64_t sequence() const override { return seq_.load(); }

  std::shared_ptr<Work> all_reduce(at::Tensor& t, ReduceOp op) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string what = describe("all_reduce", t.defined() ? 2 * t.nbytes() : 0);
    check_tensor(t, what);
    const ncclDataType_t type = nccl_type(t, what);
    commit(2 * t.nbytes());  // CommStats' ring factor (comm.h)
    return launch(what, {t}, [&](cudaStream_t s) {
      if (t.numel() == 0) return;
      KILN_NCCL_CHECK(ncclAllReduce(t.data_ptr(), t.data_ptr(), n(t), type, nccl_op(op), comm(), s), what);
    });
  }

  std::shared_ptr<Work> reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string what = describe("reduce_scatter", in.defined() ? in.nbytes() : 0);
    check_tensor(in, what);
    check_tensor(out, what);
    check_same_dtype(out, in, what);
    if (in.numel() != out.numel() * size_) {
      throw Error(what + ": input has " + std::to_string(in.numel()) + " elements, need " + std::to_string(size_) +
                  " x output (" + std::to_string(out.numel()) + ")");
    }
    const ncclDataType_t type = nccl_type(in, what);
    commit(in.nbytes());
    return launch(what, {in, out}, [&](cudaStream_t s) {
      if (out.numel() == 0) return;
      KILN_NCCL_CHECK(ncclReduceScatter(in.data_ptr(), out.data_ptr(), n(out), type, nccl_op(op), comm(), s), what);
    });
  }

  std::shared_ptr<Work> all_gather(at::Tensor& out, const at::Tensor& in) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string what = describe("all_gather", out.defined() ? out.nbytes() : 0);
    check_tensor(in, what);
    check_tensor(out, what);
    check_same_dtype(out, in, what);
    if (out.numel() != in.numel() * size_) {
      throw Error(what + ": output has " + std::to_string(out.numel()) + " elements, need " + std::to_string(size_) +
                  " x input (" + std::to_string(in.numel()) + ")");
    }
    const ncclDataType_t type = nccl_type(in, what);
    commit(out.nbytes());
    return launch(what, {in, out}, [&](cudaStream_t s) {
      if (in.numel() == 0) return;
      KILN_NCCL_CHECK(ncclAllGather(in.data_ptr(), out.data_ptr(), n(in), type, comm(), s), what);
    });
  }

  std::shared_ptr<Work> broadcast(at::Tensor& t, int root) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string what = describe("broadcast", t.defined() ? t.nbytes() : 0);
    check_tensor(t, what);
    if (root < 0 || root >= size_) throw Error(what + ": root " + std::to_string(root) + " is not a rank of the group");
    const ncclDataType_t type = nccl_type(t, what);
    commit(t.nbytes());
    return launch(what, {t}, [&](cudaStream_t s) {
      if (t.numel() == 0) return;
      KILN_NCCL_CHECK(ncclBroadcast(t.data_ptr(), t.data_ptr(), n(t), type, root, comm(), s), what);
    });
  }

  std::shared_ptr<Work> send_recv(const std::vector<P2POp>& ops) override {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t bytes = 0;
    for (const auto& op : ops)
      if (op.kind == P2POp::Kind::Send && op.tensor.defined()) bytes += op.tensor.nbytes();
    const std::string what = describe("send_recv", bytes);
    std::vector<at::Tensor> tensors;
    std::vector<ncclDataType_t> types;
    for (const auto& op : ops) {
      check_tensor(op.tensor, what);
      if (op.peer < 0 || op.peer >= size_) throw Error(what + ": peer " + std::to_string(op.peer) + " is not a rank of the group");
      tensors.push_back(op.tensor);
      types.push_back(nccl_type(op.tensor, what));
    }
    commit(bytes);
    return launch(what, tensors, [&](cudaStream_t s) {
      // One group: NCCL posts every send and receive together, so no order of ranks deadlocks.
      KILN_NCCL_CHECK(ncclGroupStart(), what);
      ncclResult_t rc = ncclSuccess;
      const char* failed = nullptr;
      for (size_t i = 0; i < ops.size() && failed == nullptr; ++i) {
        const at::Tensor& t = ops[i].tensor;
        if (t.numel() == 0) continue;
        if (ops[i].kind == P2POp::Kind::Send) {
          rc = ncclSend(t.data_ptr(), n(t), types[i], ops[i].peer, comm(), s);
          if (rc != ncclSuccess) failed = "ncclSend";
        } else {
          rc = ncclRecv(t.data_ptr(), n(t), types[i], ops[i].peer, comm(), s);
          if (rc != ncclSuccess) failed = "ncclRecv";
        }
      }
      const ncclResult_t end = ncclGroupEnd();  // always closes the group, even after a failure
      if (failed != nullptr) throw_nccl(rc, Site{failed, __FILE__, __LINE__}, what);
      KILN_NCCL_CHECK(end, what);
    });
  }

  std::shared_ptr<Work> all_to_all(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits,
                                   const std::vector<int64_t>& in_splits) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string what = describe("all_to_all", in.defined() ? in.nbytes() : 0);
    check_tensor(in, what);
    check_tensor(out, what);
    const AllToAllBlocks blocks = AllToAllBlocks::resolve(out, in, out_splits, in_splits, rank_, size_, what);
    const ncclDataType_t type = nccl_type(in, what);
    commit(in.nbytes());
    return launch(what, {in, out}, [&](cudaStream_t s) {
      // One group: every peer's send and receive (this rank's own block included, a send to
      // itself) posted together, so no order of ranks deadlocks. Empty blocks post nothing.
      const int64_t bytes = static_cast<int64_t>(in.element_size());
      const auto* src = static_cast<const char*>(in.data_ptr());
      auto* dst = static_cast<char*>(out.data_ptr());
      KILN_NCCL_CHECK(ncclGroupStart(), what);
      ncclResult_t rc = ncclSuccess;
      const char* failed = nullptr;
      for (int j = 0; j < size_ && failed == nullptr; ++j) {
        if (blocks.send_count[j] > 0) {
          rc = ncclSend(src + blocks.send_offset[j] * bytes, static_cast<size_t>(blocks.send_count[j]), type, j, comm(), s);
          if (rc != ncclSuccess) failed = "ncclSend";
        }
        if (failed == nullptr && blocks.recv_count[j] > 0) {
          rc = ncclRecv(dst + blocks.recv_offset[j] * bytes, static_cast<size_t>(blocks.recv_count[j]), type, j, comm(), s);
          if (rc != ncclSuccess) failed = "ncclRecv";
        }
      }
      const ncclResult_t end = ncclGroupEnd();  // always closes the group, even after a failure
      if (failed != nullptr) throw_nccl(rc, Site{failed, __FILE__, __LINE__}, what);
      KILN_NCCL_CHECK(end, what);
    });
  }

  void barrier() override {
    std::shared_ptr<Work> work;
    std::string what;
    {
      std::lock_guard<std::mutex> lock(mu_);
      what = describe("barrier", 0);
      commit(0);
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
      at::Tensor one = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, static_cast<c10::DeviceIndex>(device_)));
      work = launch(what, {one}, [&](cudaStream_t s) {
        KILN_NCCL_CHECK(ncclAllReduce(one.data_ptr(), one.data_ptr(), 1, ncclFloat32, ncclSum, comm(), s), what);
      });
    }
    // The host waits here (the one call that blocks it); the watchdog times the wait.
    auto pause = std::chrono::microseconds(10);
    while (!work->is_completed()) {
      check_async(what);
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  std::shared_ptr<Communicator> split(int color, int key, const std::string& name) override {
    std::string what;
    {
      std::lock_guard<std::mutex> lock(mu_);
      what = describe("split", 0);
      if (color < 0) throw Error(what + ": color must be non-negative (got " + std::to_string(color) + ")");
      commit(0);
    }
    WatchEntry watch(watchdog_, what);  // MPI_Comm_split and the sub-group's creation
    MPI_Comm sub = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(mpi_, color, key, &sub), what + ": MPI_Comm_split");
    try {
      const SplitOf origin{comm(), color, key};
      auto c = std::make_shared<NcclCommunicator>(sub, name, device_, watchdog_, &origin);
      c->count_waits_in(wait_clock_);
      MPI_Comm_free(&sub);
      return c;
    } catch (...) {
      MPI_Comm_free(&sub);
      throw;
    }
  }

 private:
  // Rank 0 makes the unique id; MPI_Bcast carries it, with rank 0's result, to every rank, so a
  // failure there fails every rank instead of leaving them in the broadcast.
  void init(const std::string& what) {
    WatchEntry watch(watchdog_, what);
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    struct {
      int result;
      ncclUniqueId id;
    } boot{};
    if (rank_ == 0) boot.result = static_cast<int>(ncclGetUniqueId(&boot.id));
    check_mpi(MPI_Bcast(&boot, sizeof boot, MPI_BYTE, 0, mpi_), what + ": MPI_Bcast of the NCCL unique id");
    if (boot.result != ncclSuccess) {
      if (rank_ == 0) throw_nccl(static_cast<ncclResult_t>(boot.result), Site{"ncclGetUniqueId", __FILE__, __LINE__}, what);
      throw Error(what + ": rank 0 of the group could not make the NCCL unique id: " +
                  ncclGetErrorString(static_cast<ncclResult_t>(boot.result)));
    }
    nccl_->device = device_;
    KILN_NCCL_CHECK(ncclCommInitRank(&nccl_->comm, size_, boot.id, rank_), what);
  }

  // A sub-group by ncclCommSplit (collective over the parent; every rank of it calls split() in
  // the same order): no unique id to make and broadcast, and NCCL reuses the parent's topology
  // detection. Not splitShare: a shared child may not run beside its parent, and kiln's groups
  // each have their own stream (a tp collective runs while dp's buckets are in flight).
  void init_split(const SplitOf& origin, const std::string& what) {
    WatchEntry watch(watchdog_, what);
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    nccl_->device = device_;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    KILN_NCCL_CHECK(ncclCommSplit(origin.parent, origin.color, origin.key, &nccl_->comm, &config), what);
    if (nccl_->comm == nullptr) throw Error(what + ": ncclCommSplit gave this rank no communicator");
  }

  // The collective itself, ordered after the caller's current stream (see comm_nccl.h).
  template <typename Enqueue>
  std::shared_ptr<Work> launch(const std::string& what, const std::vector<at::Tensor>& tensors, Enqueue&& enqueue) {
    check_async(what);
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    auto done = std::make_shared<DoneEvent>(device_, what);
    const int device = device_;
    WatchEntry watch(watchdog_, what, [done, what, device]() {
      // The watchdog thread: make the group's GPU current, so that no context is created on
      // another one, then ask whether the event has fired.
      int current = -1;
      if (cudaGetDevice(&current) != cudaSuccess || current != device) cudaSetDevice(device);
      return done->query(what);
    });
    const cudaStream_t caller = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
    Event ready(what);
    KILN_CUDA_CHECK(cudaEventRecord(ready.get(), caller), what);
    KILN_CUDA_CHECK(cudaStreamWaitEvent(stream_.stream(), ready.get(), 0), what);
    for (const auto& t : tensors) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
    enqueue(stream_.stream());
    KILN_CUDA_CHECK(cudaEventRecord(done->event.get(), stream_.stream()), what);
    done->recorded.store(true);
    return std::make_shared<NcclWork>(done, what, watchdog_, watch.release(), wait_clock_);
  }

  // An asynchronous NCCL error (a peer died, a network failure) makes every later call throw.
  void check_async(const std::string& what) {
    if (nccl_->aborted.load()) throw Error(what + ": the NCCL communicator was aborted after an earlier error");
    ncclResult_t async = ncclSuccess;
    KILN_NCCL_CHECK(ncclCommGetAsyncError(comm(), &async), what);
    if (async != ncclSuccess && async != ncclInProgress)
      throw_nccl(async, Site{"ncclCommGetAsyncError", __FILE__, __LINE__}, what + " (the communicator has failed)");
  }

  // The description errors and the watchdog carry, with the sequence number this call will take.
  std::string describe(const char* op, int64_t bytes) const {
    std::ostringstream s;
    s << "rank " << world_rank_ << ": " << op << " #" << seq_.load() + 1 << " on group '" << name_ << "' (nccl, "
      << bytes << " bytes)";
    return s.str();
  }
  // Advances the sequence number and counters, once a call has passed its checks.
  void commit(int64_t bytes) {
    ++seq_;
    ++calls_;
    bytes_ += bytes;
  }

  void check_tensor(const at::Tensor& t, const std::string& what) const {
    if (!t.defined()) throw Error(what + ": undefined tensor");
    if (!t.is_cuda()) {
      throw Error(what + ": backend nccl does not support " + (t.is_cpu() ? std::string("CPU") : t.device().str()) +
                  " tensors; move the tensor to cuda:" + std::to_string(device_) + ", or use --backend mpi");
    }
    if (t.layout() != at::kStrided) throw Error(what + ": backend nccl does not support sparse tensors");
    if (t.device().index() != device_) {
      throw Error(what + ": tensor is on " + t.device().str() + ", but group '" + name_ + "' runs on cuda:" +
                  std::to_string(device_));
    }
    if (!t.is_contiguous()) throw Error(what + ": tensor must be contiguous");
  }
  static void check_same_dtype(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
    if (a.scalar_type() != b.scalar_type()) throw Error(what + ": input and output dtypes differ");
  }
  static size_t n(const at::Tensor& t) { return static_cast<size_t>(t.numel()); }
  ncclComm_t comm() const { return nccl_->comm; }

  MPI_Comm mpi_ = MPI_COMM_NULL;
  std::string name_;
  int rank_ = 0, size_ = 1, world_rank_ = 0;
  const int device_;
  std::shared_ptr<Watchdog> watchdog_;
  c10::cuda::CUDAStream stream_;
  std::shared_ptr<NcclHandle> nccl_;
  uint64_t health_ = 0;
  std::mutex mu_;  // one launch at a time: NCCL calls on one communicator must not overlap
  std::atomic<uint64_t> seq_{0};
  std::atomic<int64_t> calls_{0}, bytes_{0};
};

}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, const std::string& name, int device_index,
                                                     std::shared_ptr<Watchdog> watchdog) {
  return std::make_shared<NcclCommunicator>(comm, name, device_index, std::move(watchdog));
}

}  // namespace kiln
