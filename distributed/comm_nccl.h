// distributed/comm_nccl.h -- the NCCL backend of Communicator (CUDA tensors, one GPU per rank).
//
// Compiled only when kiln is built with CUDA (KILN_WITH_CUDA). The semantics are those of
// distributed/comm.h, for a group of n ranks and x_r the input on rank r:
//   all_reduce(t, op)         t = op_r x_r (ncclAllReduce, in place). Avg is ncclAvg: floating
//                             types multiply each x_r by 1/n (rounded to the dtype) and then sum;
//                             integer types sum, then divide by n truncating toward zero (the MPI
//                             backend floors; the two agree for non-negative values).
//   reduce_scatter(out, in)   out = op_r in_r[rank's chunk] (ncclReduceScatter)
//   all_gather(out, in)       out = [in_0, ..., in_{n-1}] (ncclAllGather)
//   broadcast(t, root)        t = t_root (ncclBroadcast, in place)
//   send_recv(ops)            every send and receive in one ncclGroupStart/ncclGroupEnd
//   all_to_all(out, in, ...)  one ncclGroupStart/ncclGroupEnd of an ncclSend of in's block and an
//                             ncclRecv into out's block per peer (the own block a send to
//                             itself); empty blocks post nothing
//   barrier()                 a one-element all-reduce that the host waits for
// dtypes: fp32, fp64, bf16, fp16, int32, int64, uint8 (Sum, Avg, Max and Min for each). Tensors
// must be contiguous and on the group's GPU; anything else is refused ("backend nccl does not
// support CPU tensors; ...") rather than copied.
//
// Streams and events (the c10d ProcessGroupNCCL model). Each communicator owns a CUDA stream of
// its own (highest priority). A call, on the caller's current stream C of the group's device:
//   1. records a `ready` event on C; the NCCL stream N waits on it, so the collective sees
//      everything queued on C before the call (e.g. the backward pass that wrote the gradient);
//   2. marks every tensor as used on N (CUDACachingAllocator::recordStream), so the caller may
//      drop a tensor at once: its memory is not reused until N is past the collective;
//   3. launches the NCCL kernel on N and records a `done` event on N.
// The call returns at once. Work::wait() makes the *calling thread's current stream* wait on
// `done`; it does not block the host. After wait(), kernels queued on that stream see the result
// and reading the tensor on the host (.item(), .cpu()) is correct, because those synchronise
// the stream. Reading the result on another stream needs a wait() issued on that stream.
// Work::is_completed() asks whether `done` has fired (cudaEventQuery), without blocking.
// barrier() is the exception: it blocks the host until every rank has entered it and the device
// work queued before it on C (and on N) is done.
//
// Watchdog. Every Work is registered with the watchdog, with the MPI backend's description
// ("rank 3: all_reduce #57 on group 'dp' (nccl, 4096 bytes)") and a completion probe on `done`,
// so an operation the host never waits for is still timed; communicator creation (the unique-id
// broadcast and ncclCommInitRank) and destruction are watched the same way. The communicator
// also registers a health check (ncclCommGetAsyncError): on an asynchronous NCCL error the
// watchdog prints one line naming rank, group and error, aborts the NCCL communicator
// (ncclCommAbort, given at most 10 s) and then aborts the job.
//
// Destruction: ncclCommDestroy, which waits for the group's outstanding work and is an
// intra-node collective (every rank of the group on a node destroys it, in the same order
// relative to the other groups; a Mesh destroys its groups in a fixed order), watched like an
// operation. Destroy communicators before main returns (not from static destructors, after CUDA
// is torn down). A communicator destroyed while an exception unwinds, or after an asynchronous
// error, is aborted instead (ncclCommAbort, given at most 10 s), since its peers may never join.
//
// Every NCCL and CUDA call is checked; a failure throws kiln::Error with the call, file, line,
// host, rank, group, NCCL's error string and its last error message (ncclGetLastError).
// NCCL refuses two ranks of one communicator on the same GPU; distributed/backend_choice.h decides
// before a communicator is created whether NCCL can be used at all.
#pragma once

#include <memory>
#include <string>

#include <mpi.h>

#include "distributed/comm.h"

namespace kiln {

class Watchdog;

// Creates the NCCL communicator of the ranks of `comm` (collective over `comm`): rank 0 makes the
// ncclUniqueId, MPI_Bcast hands it to the others, and every rank joins with ncclCommInitRank on
// GPU `device_index`. Keeps a duplicate of `comm` (the caller keeps its own) for split(), which
// makes a sub-group's MPI communicator and its NCCL one by ncclCommSplit of this one (no unique id
// of its own). MPI must be initialised. With a watchdog, creation, every
// operation and the communicator's health are watched (see above); split() passes it on.
std::shared_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, const std::string& name, int device_index,
                                                     std::shared_ptr<Watchdog> watchdog);

}  // namespace kiln
