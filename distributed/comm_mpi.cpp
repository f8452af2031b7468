// distributed/comm_mpi.cpp -- Communicator over MPI non-blocking collectives (CPU tensors; CUDA ones staged).
#include "distributed/all_to_all_blocks.h"
#include "distributed/comm_mpi.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <sstream>

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "distributed/device_check.h"
#include "distributed/error.h"
#include "distributed/host_memory.h"
#include "distributed/wait_clock.h"
#include "distributed/watchdog.h"

namespace kiln {

namespace {

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

// Element-wise reductions of 16-bit floats for MPI_Op_create: widen, combine, round back.
template <typename T, int Kind>  // Kind: 0 sum, 1 max, 2 min
void reduce16(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const T*>(in);
  auto* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = static_cast<float>(a[i]), y = static_cast<float>(b[i]);
    b[i] = static_cast<T>(Kind == 0 ? x + y : Kind == 1 ? std::max(x, y) : std::min(x, y));
  }
}

// Throws kiln::Error "<what> failed: <MPI's message>" unless rc is MPI_SUCCESS.
void check_mpi(int rc, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(what + " failed: " + std::string(msg, len));
}

// Staged tensors travel through host buffers of the communicator's pool (distributed/host_memory.h:
// exact size, page-locked for CUDA tensors, reused across calls): copied to the host before the
// MPI call (a synchronous copy, so whatever the compute stream wrote is complete) and copied
// back when the Work completes, after the completion step has worked on the host buffer (Avg's
// division). CUDA tensors are always staged; this is also how several ranks share one GPU, which
// NCCL refuses. CPU tensors are used in place, unless the test-only setting stages them too
// (MpiOptions::stage_cpu), so that the staged path and its completion order run in CPU tests.
class Staging {
 public:
  Staging(HostBufferPool& pool, bool stage_cpu) : pool_(pool), stage_cpu_(stage_cpu) {}
  bool staged(const at::Tensor& t) const { return t.is_cuda() || stage_cpu_; }
  // A tensor MPI only reads.
  at::Tensor in(const at::Tensor& t) {
    if (!staged(t)) return t;
    auto h = pool_.take(t, t.is_cuda());
    h.copy_(t);
    keep_.push_back(h);
    return h;
  }
  // A tensor MPI writes (copy_in: and reads first).
  at::Tensor out(const at::Tensor& t, bool copy_in) {
    if (!staged(t)) return t;
    auto h = pool_.take(t, t.is_cuda());
    if (copy_in) h.copy_(t);
    back_.emplace_back(t, h);
    return h;
  }
  // The completion step: `first` (on the host buffers MPI wrote), then the copies back.
  std::function<void()> then(std::function<void()> first) const {
    if (back_.empty() && keep_.empty()) return first;
    return [first, back = back_, keep = keep_]() mutable {
      if (first) first();
      for (auto& [target, host] : back) target.copy_(host);
    };
  }

 private:
  HostBufferPool& pool_;
  bool stage_cpu_;
  std::vector<std::pair<at::Tensor, at::Tensor>> back_;
  std::vector<at::Tensor> keep_;
};

// [offset, length) pieces of n elements, none longer than max (one empty piece when n is 0).
std::vector<std::pair<int64_t, int64_t>> pieces_of(int64_t n, int64_t max) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t off = 0; off < n; off += max) out.emplace_back(off, std::min(max, n - off));
  if (out.empty()) out.emplace_back(0, 0);
  return out;
}

// The address of element `offset` of t (contiguous).
void* at_element(const at::Tensor& t, int64_t offset) {
  return static_cast<char*>(t.data_ptr()) + offset * static_cast<int64_t>(t.element_size());
}

// A datatype of n elements of `type` (each `bytes` long), back to back, in which no count exceeds
// max (MPI counts are ints): n = q max + r is q elements of "max elements of type" (built the same
// way when q exceeds max) followed by r elements of type. Returns a type the caller frees.
MPI_Datatype run_of(int64_t n, MPI_Datatype type, int64_t bytes, int64_t max, const std::string& what) {
  MPI_Datatype out = MPI_DATATYPE_NULL;
  if (n <= max) {
    check_mpi(MPI_Type_contiguous(static_cast<int>(n), type, &out), what + ": MPI_Type_contiguous");
    return out;
  }
  MPI_Datatype piece = MPI_DATATYPE_NULL;
  check_mpi(MPI_Type_contiguous(static_cast<int>(max), type, &piece), what + ": MPI_Type_contiguous");
  MPI_Datatype head = run_of(n / max, piece, bytes * max, max, what);
  MPI_Type_free(&piece);  // head keeps what it needs
  const int64_t r = n % max;
  if (r == 0) return head;
  int lengths[2] = {1, static_cast<int>(r)};
  MPI_Aint displacements[2] = {0, static_cast<MPI_Aint>((n - r) * bytes)};
  MPI_Datatype types[2] = {head, type};
  const int rc = MPI_Type_create_struct(2, lengths, displacements, types, &out);
  MPI_Type_free(&head);
  check_mpi(rc, what + ": MPI_Type_create_struct");
  return out;
}

// The per-peer arguments of one MPI_Ialltoallw, kept alive until its Work is gone (MPI reads
// them until the call completes), with the derived datatypes it made. Block j of a side is
// `count` elements at element `offset`: while both fit the piece size (and the offset in bytes an
// int), it is (count, base type, byte displacement), the MPI_Alltoallv form; otherwise one
// element of a derived type that holds the offset (an MPI_Aint) and a run_of of the count, with
// displacement 0. The peers need not agree on the form: MPI matches the type signatures (so many
// elements of the base type), not the types. This rank's own block is not in it (counts 0): it is
// copied by the caller, which also keeps MPI from packing it through an int-sized buffer.
class AllToAllArgs {
 public:
  AllToAllArgs(const AllToAllBlocks& blocks, int rank, MPI_Datatype base, int64_t bytes, int64_t max, const std::string& what) {
    const size_t n = blocks.send_count.size();
    for (auto* side : {&send_, &recv_}) {
      side->counts.assign(n, 0);
      side->displs.assign(n, 0);
      side->types.assign(n, base);
    }
    for (size_t j = 0; j < n; ++j) {
      if (static_cast<int>(j) == rank) continue;
      place(send_, j, blocks.send_count[j], blocks.send_offset[j], base, bytes, max, what);
      place(recv_, j, blocks.recv_count[j], blocks.recv_offset[j], base, bytes, max, what);
    }
  }
  ~AllToAllArgs() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (auto& t : made_) MPI_Type_free(&t);  // fine while a call still uses them (MPI keeps them)
  }
  AllToAllArgs(const AllToAllArgs&) = delete;
  AllToAllArgs& operator=(const AllToAllArgs&) = delete;

  struct Side {
    std::vector<int> counts, displs;
    std::vector<MPI_Datatype> types;
  };
  const Side& send() const { return send_; }
  const Side& recv() const { return recv_; }

 private:
  void place(Side& side, size_t j, int64_t count, int64_t offset, MPI_Datatype base, int64_t bytes, int64_t max,
             const std::string& what) {
    if (count == 0) return;
    if (count <= max && offset <= max && offset * bytes <= INT32_MAX) {
      side.counts[j] = static_cast<int>(count);
      side.displs[j] = static_cast<int>(offset * bytes);
      return;
    }
    MPI_Datatype run = run_of(count, base, bytes, max, what);
    int one = 1;
    MPI_Aint at = static_cast<MPI_Aint>(offset * bytes);
    MPI_Datatype placed = MPI_DATATYPE_NULL;
    const int rc = MPI_Type_create_struct(1, &one, &at, &run, &placed);
    MPI_Type_free(&run);
    check_mpi(rc, what + ": MPI_Type_create_struct");
    made_.push_back(placed);
    check_mpi(MPI_Type_commit(&placed), what + ": MPI_Type_commit");
    side.counts[j] = 1;
    side.types[j] = placed;
  }

  Side send_, recv_;
  std::vector<MPI_Datatype> made_;
};

class MpiWork final : public Work {
 public:
  MpiWork(std::vector<MPI_Request> requests, std::function<void()> finish, std::string what,
          std::shared_ptr<Watchdog> watchdog, std::shared_ptr<WaitClock> clock = nullptr)
      : requests_(std::move(requests)), finish_(std::move(finish)), what_(std::move(what)),
        watchdog_(std::move(watchdog)), clock_(std::move(clock)), token_(watchdog_ ? watchdog_->start(what_) : 0) {}
  ~MpiWork() override {
    if (watchdog_ && !done_) watchdog_->complete(token_);
  }

  void wait() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    const bool timed = clock_ != nullptr;  // distributed/wait_clock.h: the host stood still here
    const auto t0 = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    check_mpi(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE), what_);
    complete();
    if (timed) clock_->add_ms(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }

  bool is_completed() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return true;
    int flag = 0;
    check_mpi(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag, MPI_STATUSES_IGNORE), what_);
    if (flag) complete();
    return done_;
  }

 private:
  void complete() {
    if (watchdog_) watchdog_->complete(token_);
    if (finish_) finish_();
    done_ = true;
  }
  std::mutex mu_;
  std::vector<MPI_Request> requests_;
  std::function<void()> finish_;
  std::string what_;
  std::shared_ptr<Watchdog> watchdog_;
  std::shared_ptr<WaitClock> clock_;
  uint64_t token_;
  bool done_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::string name, std::shared_ptr<Watchdog> watchdog, MpiOptions options)
      : name_(std::move(name)), watchdog_(std::move(watchdog)), options_(std::move(options)), pool_(HostBufferPool::make()) {
    if (options_.max_count < 1 || options_.max_count > INT32_MAX)
      throw Error("backend mpi: the piece size must be in [1, 2^31 - 1] elements (got " + std::to_string(options_.max_count) + ")");
    MPI_Comm_dup(comm, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
    MPI_Op_create(&reduce16<c10::BFloat16, 0>, 1, &bf16_ops_[0]);
    MPI_Op_create(&reduce16<c10::BFloat16, 1>, 1, &bf16_ops_[1]);
    MPI_Op_create(&reduce16<c10::BFloat16, 2>, 1, &bf16_ops_[2]);
    MPI_Op_create(&reduce16<c10::Half, 0>, 1, &fp16_ops_[0]);
    MPI_Op_create(&reduce16<c10::Half, 1>, 1, &fp16_ops_[1]);
    MPI_Op_create(&reduce16<c10::Half, 2>, 1, &fp16_ops_[2]);
  }

  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (auto* ops : {bf16_ops_, fp16_ops_})
      for (int i = 0; i < 3; ++i) MPI_Op_free(&ops[i]);
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  const char* backend() const override { return "mpi"; }
  CommStats stats() const override { return {calls_.load(), bytes_.load()}; }
  uint64_t sequence() const override { return seq_.load(); }

  std::shared_ptr<Work> all_reduce(at::Tensor& t, ReduceOp op) override {
    const std::string what = begin("all_reduce", t, 2);
    Staging stage(*pool_, options_.stage_cpu);
    at::Tensor h = stage.out(t, /*copy_in=*/true);
    const MPI_Datatype type = type_of(h, what);
    const MPI_Op mop = mpi_op(h, op, what);
    std::vector<MPI_Request> reqs;
    for (const auto& [off, len] : pieces_of(h.numel(), options_.max_count)) {
      reqs.emplace_back();
      call(what, MPI_Iallreduce(MPI_IN_PLACE, at_element(h, off), static_cast<int>(len), type, mop, comm_, &reqs.back()));
    }
    return std::make_shared<MpiWork>(std::move(reqs), stage.then(averager(h, op)), what, watchdog_, wait_clock_);
  }

  std::shared_ptr<Work> reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op) override {
    const std::string what = begin("reduce_scatter", in);
    check_same_dtype(out, in, what);
    if (in.numel() != out.numel() * size_) {
      throw Error(what + ": input has " + std::to_string(in.numel()) + " elements, need " +
                  std::to_string(size_) + " x output (" + std::to_string(out.numel()) + ")");
    }
    check_tensor(out, what);
    Staging stage(*pool_, options_.stage_cpu);
    // In place (out is this rank's chunk of in, NCCL's in-place form): MPI's own in-place form
    // puts the result at the start of the buffer instead, so an unstaged result goes to a scratch
    // tensor and is copied into out when the call completes (a staged one has its own buffer).
    const bool scratch = is_chunk_of(out, in, rank_) && !stage.staged(out);
    at::Tensor target = scratch ? at::empty_like(out) : out;
    at::Tensor hin = stage.in(in), hout = stage.out(target, /*copy_in=*/false);
    const MPI_Datatype type = type_of(hin, what);
    const MPI_Op mop = mpi_op(hin, op, what);
    const int64_t chunk = out.numel();
    std::vector<MPI_Request> reqs;
    if (in.numel() <= options_.max_count) {
      reqs.emplace_back();
      call(what, MPI_Ireduce_scatter_block(hin.data_ptr(), hout.data_ptr(), static_cast<int>(chunk), type, mop, comm_, &reqs.back()));
    } else {
      // Too large for one call: chunk r is reduced onto rank r, piece by piece.
      for (int r = 0; r < size_; ++r) {
        for (const auto& [off, len] : pieces_of(chunk, options_.max_count)) {
          reqs.emplace_back();
          call(what, MPI_Ireduce(at_element(hin, r * chunk + off), r == rank_ ? at_element(hout, off) : nullptr,
                                 static_cast<int>(len), type, mop, r, comm_, &reqs.back()));
        }
      }
    }
    // The average is taken on the buffer MPI wrote, before any copy back.
    auto finish = stage.then(averager(hout, op));
    if (scratch) {
      finish = [finish, target, out]() mutable {
        if (finish) finish();
        out.copy_(target);
      };
    }
    return std::make_shared<MpiWork>(std::move(reqs), std::move(finish), what, watchdog_, wait_clock_);
  }

  std::shared_ptr<Work> all_gather(at::Tensor& out, const at::Tensor& in) override {
    const std::string what = begin("all_gather", out);
    check_same_dtype(out, in, what);
    check_tensor(in, what);
    if (out.numel() != in.numel() * size_) {
      throw Error(what + ": output has " + std::to_string(out.numel()) + " elements, need " +
                  std::to_string(size_) + " x input (" + std::to_string(in.numel()) + ")");
    }
    // In place (in is this rank's chunk of out): this rank's contribution is already in place.
    const bool in_place = is_chunk_of(in, out, rank_);
    Staging stage(*pool_, options_.stage_cpu);
    at::Tensor hout = stage.out(out, /*copy_in=*/in_place);
    const MPI_Datatype type = type_of(hout, what);
    const int64_t chunk = in.numel();
    std::vector<MPI_Request> reqs;
    if (out.numel() <= options_.max_count) {
      at::Tensor hin = in_place ? at::Tensor() : stage.in(in);
      const int n = static_cast<int>(chunk);
      reqs.emplace_back();
      call(what, MPI_Iallgather(in_place ? MPI_IN_PLACE : hin.data_ptr(), in_place ? 0 : n, in_place ? MPI_DATATYPE_NULL : type,
                                hout.data_ptr(), n, type, comm_, &reqs.back()));
    } else {
      // Too large for one call: each rank's chunk is broadcast from it, piece by piece.
      if (!in_place) hout.view({-1}).narrow(0, rank_ * chunk, chunk).copy_(in.reshape({-1}));
      for (int r = 0; r < size_; ++r) {
        for (const auto& [off, len] : pieces_of(chunk, options_.max_count)) {
          reqs.emplace_back();
          call(what, MPI_Ibcast(at_element(hout, r * chunk + off), static_cast<int>(len), type, r, comm_, &reqs.back()));
        }
      }
    }
    return std::make_shared<MpiWork>(std::move(reqs), stage.then(nullptr), what, watchdog_, wait_clock_);
  }

  std::shared_ptr<Work> broadcast(at::Tensor& t, int root) override {
    const std::string what = begin("broadcast", t);
    if (root < 0 || root >= size_) throw Error(what + ": root " + std::to_string(root) + " is not a rank of the group");
    Staging stage(*pool_, options_.stage_cpu);
    at::Tensor h = stage.out(t, /*copy_in=*/rank_ == root);
    const MPI_Datatype type = type_of(h, what);
    std::vector<MPI_Request> reqs;
    for (const auto& [off, len] : pieces_of(h.numel(), options_.max_count)) {
      reqs.emplace_back();
      call(what, MPI_Ibcast(at_element(h, off), static_cast<int>(len), type, root, comm_, &reqs.back()));
    }
    return std::make_shared<MpiWork>(std::move(reqs), stage.then(nullptr), what, watchdog_, wait_clock_);
  }

  std::shared_ptr<Work> send_recv(const std::vector<P2POp>& ops) override {
    int64_t bytes = 0;
    for (const auto& op : ops)
      if (op.kind == P2POp::Kind::Send) bytes += op.tensor.nbytes();
    const std::string what = begin_bytes("send_recv", bytes);
    std::vector<MPI_Request> reqs;
    Staging stage(*pool_, options_.stage_cpu);
    // Receives first, then sends: with every request non-blocking, no pairing order can deadlock.
    // A message over the piece size travels as several, which MPI matches in order (same peer,
    // same tag, same communicator).
    for (int pass = 0; pass < 2; ++pass) {
      for (const auto& op : ops) {
        const bool recv = op.kind == P2POp::Kind::Recv;
        if (recv != (pass == 0)) continue;
        check_tensor(op.tensor, what);
        if (op.peer < 0 || op.peer >= size_) throw Error(what + ": peer " + std::to_string(op.peer) + " is not a rank of the group");
        const at::Tensor h = recv ? stage.out(op.tensor, /*copy_in=*/false) : stage.in(op.tensor);
        const MPI_Datatype type = type_of(h, what);
        for (const auto& [off, len] : pieces_of(h.numel(), options_.max_count)) {
          reqs.emplace_back();
          const int n = static_cast<int>(len);
          call(what, recv ? MPI_Irecv(at_element(h, off), n, type, op.peer, kP2PTag, comm_, &reqs.back())
                          : MPI_Isend(at_element(h, off), n, type, op.peer, kP2PTag, comm_, &reqs.back()));
        }
      }
    }
    return std::make_shared<MpiWork>(std::move(reqs), stage.then(nullptr), what, watchdog_, wait_clock_);
  }

  std::shared_ptr<Work> all_to_all(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits,
                                   const std::vector<int64_t>& in_splits) override {
    const std::string what = begin("all_to_all", in);
    check_tensor(out, what);
    const AllToAllBlocks blocks = AllToAllBlocks::resolve(out, in, out_splits, in_splits, rank_, size_, what);
    Staging stage(*pool_, options_.stage_cpu);
    at::Tensor hin = stage.in(in), hout = stage.out(out, /*copy_in=*/false);
    const MPI_Datatype type = type_of(hin, what);
    // This rank's own block, a copy on the host buffers (MPI is given none of it).
    hout.reshape({-1}).narrow(0, blocks.recv_offset[rank_], blocks.recv_count[rank_])
        .copy_(hin.reshape({-1}).narrow(0, blocks.send_offset[rank_], blocks.send_count[rank_]));
    auto args = std::make_shared<AllToAllArgs>(blocks, rank_, type, static_cast<int64_t>(hin.element_size()),
                                               options_.max_count, what);
    const auto& snd = args->send();
    const auto& rcv = args->recv();
    MPI_Request req;
    call(what, MPI_Ialltoallw(hin.data_ptr(), snd.counts.data(), snd.displs.data(), snd.types.data(), hout.data_ptr(),
                              rcv.counts.data(), rcv.displs.data(), rcv.types.data(), comm_, &req));
    // The arguments and types live as long as the Work (MPI reads them until the call completes).
    auto finish = [then = stage.then(nullptr), args]() {
      if (then) then();
    };
    return std::make_shared<MpiWork>(std::vector<MPI_Request>{req}, std::move(finish), what, watchdog_, wait_clock_);
  }

  void barrier() override {
    const std::string what = begin_bytes("barrier", 0);
    MPI_Request req;
    call(what, MPI_Ibarrier(comm_, &req));
    MpiWork(std::vector<MPI_Request>{req}, nullptr, what, watchdog_).wait();
  }

  std::shared_ptr<Communicator> split(int color, int key, const std::string& name) override {
    begin_bytes("split", 0);
    MPI_Comm sub;
    call("split", MPI_Comm_split(comm_, color, key, &sub));
    auto c = std::make_shared<MpiCommunicator>(sub, name, watchdog_, options_);
    c->count_waits_in(wait_clock_);
    MPI_Comm_free(&sub);
    return c;
  }

 private:
  static constexpr int kP2PTag = 7;

  // Advances the sequence number and counters; returns the description errors carry.
  // factor: the ring factor CommStats counts (2 for all_reduce).
  std::string begin(const char* op, const at::Tensor& t, int factor = 1) {
    const std::string what = begin_bytes(op, t.defined() ? factor * static_cast<int64_t>(t.nbytes()) : 0);
    check_tensor(t, what);
    return what;
  }
  // Whether `part` is exactly chunk `index` of `whole` (same storage, contiguous).
  static bool is_chunk_of(const at::Tensor& part, const at::Tensor& whole, int index) {
    if (!part.defined() || !whole.defined() || part.numel() == 0) return false;
    const auto* base = static_cast<const char*>(whole.data_ptr());
    return part.data_ptr() == base + static_cast<int64_t>(index) * static_cast<int64_t>(part.nbytes());
  }
  std::string begin_bytes(const char* op, int64_t bytes) {
    const uint64_t seq = ++seq_;
    ++calls_;
    bytes_ += bytes;
    std::ostringstream s;
    s << "rank " << world_rank_ << ": " << op << " #" << seq << " on group '" << name_ << "' (mpi, " << bytes << " bytes)";
    return s.str();
  }
  // The tensor rules: defined, contiguous, on the CPU or a GPU; and, for a group of the run (with
  // a device), on the run's device -- in device memory under the check mode (device_check.h).
  void check_tensor(const at::Tensor& t, const std::string& what) const {
    if (!t.defined()) throw Error(what + ": undefined tensor");
    if (!t.device().is_cpu() && !t.device().is_cuda())
      throw Error(what + ": backend mpi does not support " + t.device().str() + " tensors");
    if (!t.is_contiguous()) throw Error(what + ": tensor must be contiguous");
    if (!options_.device) return;
    const c10::Device& d = *options_.device;
    if (d.is_cuda() && (!t.is_cuda() || t.device().index() != d.index())) {
      throw Error(what + ": a " + t.device().str() + " tensor, but the group runs on " + d.str() +
                  ", the run's device (NCCL would refuse it): make it there (kiln::to_device)");
    }
    if (d.is_cpu() && !t.is_cpu()) throw Error(what + ": a " + t.device().str() + " tensor, but the group runs on the CPU");
    if (is_host_memory(t)) {
      throw Error(what + ": a tensor in host memory, where the run's device is required (KILN_DEVICE_CHECK: on a GPU, "
                  "NCCL would refuse it); make it on the run's device (kiln::to_device, or options naming the device)");
    }
  }
  static void check_same_dtype(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
    if (a.scalar_type() != b.scalar_type()) throw Error(what + ": input and output dtypes differ");
  }
  static MPI_Datatype type_of(const at::Tensor& t, const std::string& what) {
    switch (t.scalar_type()) {
      case at::kFloat: return MPI_FLOAT;
      case at::kDouble: return MPI_DOUBLE;
      case at::kInt: return MPI_INT32_T;
      case at::kLong: return MPI_INT64_T;
      case at::kByte: return MPI_UINT8_T;
      case at::kBFloat16:
      case at::kHalf: return MPI_UINT16_T;
      default: throw Error(what + ": backend mpi does not support dtype " + std::string(c10::toString(t.scalar_type())));
    }
  }
  MPI_Op mpi_op(const at::Tensor& t, ReduceOp op, const std::string& what) const {
    const int k = op == ReduceOp::Max ? 1 : op == ReduceOp::Min ? 2 : 0;
    if (t.scalar_type() == at::kBFloat16) return bf16_ops_[k];
    if (t.scalar_type() == at::kHalf) return fp16_ops_[k];
    if (t.scalar_type() == at::kByte && op != ReduceOp::Max && op != ReduceOp::Min)
      throw Error(what + ": backend mpi does not support " + op_name(op) + " of uint8");
    return k == 0 ? MPI_SUM : k == 1 ? MPI_MAX : MPI_MIN;
  }
  // Avg: the sum divided by the group size once the data has arrived (integer tensors floor).
  std::function<void()> averager(at::Tensor t, ReduceOp op) const {
    if (op != ReduceOp::Avg) return nullptr;
    const int n = size_;
    return [t, n]() mutable {
      if (at::isIntegralType(t.scalar_type(), false)) t.div_(n, "floor");
      else t.div_(n);
    };
  }
  static void call(const std::string& what, int rc) { check_mpi(rc, what); }

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string name_;
  int rank_ = 0, size_ = 1, world_rank_ = 0;
  MPI_Op bf16_ops_[3]{}, fp16_ops_[3]{};
  std::shared_ptr<Watchdog> watchdog_;
  MpiOptions options_;
  std::shared_ptr<HostBufferPool> pool_;  // staging buffers
  std::atomic<uint64_t> seq_{0};
  std::atomic<int64_t> calls_{0}, bytes_{0};
};

}  // namespace

MpiOptions MpiOptions::from_env(std::optional<c10::Device> device) {
  MpiOptions o;
  o.device = device;
  const char* stage = std::getenv("KILN_MPI_STAGE_ALL");
  o.stage_cpu = stage != nullptr && std::string(stage) == "1";
  if (const char* max = std::getenv("KILN_MPI_MAX_COUNT")) {
    char* end = nullptr;
    const long long v = std::strtoll(max, &end, 10);
    if (end == max || *end != '\0' || v < 1 || v > INT32_MAX)
      throw ConfigError(std::string("KILN_MPI_MAX_COUNT must be an integer in [1, 2147483647] (got '") + max + "')");
    o.max_count = v;
  }
  return o;
}

std::shared_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, const std::string& name,
                                                    std::shared_ptr<Watchdog> watchdog, std::optional<c10::Device> device) {
  return std::make_shared<MpiCommunicator>(comm, name, std::move(watchdog), MpiOptions::from_env(device));
}

std::shared_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, const std::string& name,
                                                    std::shared_ptr<Watchdog> watchdog, MpiOptions options) {
  return std::make_shared<MpiCommunicator>(comm, name, std::move(watchdog), std::move(options));
}

}  // namespace kiln
