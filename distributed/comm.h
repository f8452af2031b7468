// distributed/comm.h -- the Communicator interface: one instance per process group.
//
// Every rank of a group issues the same collectives in the same order (c10d's contract); each
// call gets the group's next sequence number, which error messages carry. Calls return a Work
// handle at once; the operation may still be running. wait() makes the result usable by what
// the caller does next: the MPI backend blocks the host until the output tensor holds it; the
// NCCL backend (CUDA tensors) makes the caller's current CUDA stream wait for it, c10d's
// semantics, without blocking the host -- anything queued on that stream after wait() (a copy to
// the host included) sees the result. is_completed() polls. Backends: distributed/comm_mpi.h (CPU
// tensors, and CUDA tensors staged through pinned host memory), distributed/comm_nccl.h (CUDA). A backend that cannot do an operation
// throws "backend X does not support Y" rather than doing something else.
//
// Semantics, for a group of n ranks, x_r the input on rank r:
//   all_reduce(t, op)          t = op_r x_r on every rank (Avg = Sum / n)
//   reduce_scatter(out, in)    in is n equal chunks; out = op_r in_r[rank's chunk]
//                              (in place when out is exactly this rank's chunk of in)
//   all_gather(out, in)        out = [in_0, in_1, ..., in_{n-1}] (concatenated, flat)
//                              (in place when in is exactly this rank's chunk of out)
//   broadcast(t, root)         t = t_root on every rank
//   send_recv(ops)             the sends and receives of one step, posted together, so no order
//                              of ranks can deadlock
//   all_to_all(out, in,        in and out split along dim 0 into n row blocks (a row: everything
//              out_splits,     after dim 0): block j of in, in_splits[j] rows, goes to rank j;
//              in_splits)      out = [block r of in_0, block r of in_1, ..., block r of in_{n-1}],
//                              the block from rank j out_splits[j] rows (MPI_Alltoallv; c10d's
//                              alltoall_base; the token dispatch of Mixture-of-Experts)
//   barrier()                  returns once every rank has entered it
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace kiln {

class WaitClock;  // distributed/wait_clock.h

enum class ReduceOp { Sum, Avg, Max, Min };

class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation is complete and its output is valid. Throws on failure.
  virtual void wait() = 0;
  // True once the operation is complete (wait() then returns at once).
  virtual bool is_completed() = 0;
};

struct P2POp {
  enum class Kind { Send, Recv };
  Kind kind;
  at::Tensor tensor;  // sent from, or received into (contiguous)
  int peer;           // rank within the group
};

// Traffic of this rank, in "algorithm bytes": each call counts its full buffer's bytes times the
// ring factor of its kind -- all_reduce 2x the tensor (it is a reduce-scatter plus an all-gather),
// reduce_scatter 1x the whole input, all_gather 1x the whole output, broadcast 1x, send_recv the
// bytes sent, all_to_all 1x the whole input (everything this rank hands to the call, its own
// block included, which never leaves the rank). On a ring of n ranks the bytes a rank really
// sends are bytes x (n-1)/n (NCCL-tests' bus bandwidth rule); for an all_to_all of equal splits
// that is exact too. In this unit data parallelism costs 2 psi per step (psi = gradient bytes),
// ZeRO-1/2 2 psi and ZeRO-3 3 psi, the ZeRO paper's figures.
struct CommStats {
  int64_t calls = 0;
  int64_t bytes = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // "world", "dp", "tp", ... for messages
  virtual const char* backend() const = 0;

  virtual std::shared_ptr<Work> all_reduce(at::Tensor& tensor, ReduceOp op) = 0;
  virtual std::shared_ptr<Work> reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op) = 0;
  virtual std::shared_ptr<Work> all_gather(at::Tensor& out, const at::Tensor& in) = 0;
  virtual std::shared_ptr<Work> broadcast(at::Tensor& tensor, int root) = 0;
  virtual std::shared_ptr<Work> send_recv(const std::vector<P2POp>& ops) = 0;
  // Variable-count all-to-all (semantics above). in and out: contiguous, same dtype and device,
  // at least one dimension, rows of the same number of elements, not overlapping. in_splits and
  // out_splits: one non-negative row count per rank, summing to in.size(0) and out.size(0); an
  // empty vector means equal splits (dim 0 divided by size(), which must divide it). Zero-row
  // blocks and tensors are fine. The caller makes out_splits[j] equal to what rank j sends this
  // rank (its in_splits[rank]) -- only the own block's pair is checked here; a mismatch elsewhere
  // is undefined (an MPI truncation error, a hang, or garbage). The usual way to learn the counts
  // is an all_to_all of an int64 tensor of the n counts with equal splits (one each) first.
  virtual std::shared_ptr<Work> all_to_all(at::Tensor& out, const at::Tensor& in,
                                           const std::vector<int64_t>& out_splits,
                                           const std::vector<int64_t>& in_splits) = 0;
  virtual void barrier() = 0;

  // A sub-group of the ranks that pass the same color, ordered by key (MPI_Comm_split).
  // Collective over this group.
  virtual std::shared_ptr<Communicator> split(int color, int key, const std::string& name) = 0;

  virtual CommStats stats() const = 0;
  // Sequence number of the last call issued (0 before the first).
  virtual uint64_t sequence() const = 0;

  // The clock this group's wait()s count the caller's standstill into (distributed/wait_clock.h);
  // split() hands it to the sub-group. Null (the default): not counted.
  void count_waits_in(std::shared_ptr<WaitClock> clock) { wait_clock_ = std::move(clock); }
  const std::shared_ptr<WaitClock>& wait_clock() const { return wait_clock_; }

 protected:
  std::shared_ptr<WaitClock> wait_clock_;
};

}  // namespace kiln
