// distributed/comm_mpi.h -- the MPI backend of Communicator.
//
// CPU tensors (and CUDA tensors staged through exact-size pinned host buffers, reused), through MPI's non-blocking collectives (MPI_Iallreduce, MPI_Ireduce_scatter_block,
// MPI_Iallgather, MPI_Ibcast, MPI_Isend/Irecv, MPI_Ialltoallw for all_to_all); Work wraps the
// MPI_Requests. fp32, fp64, int32, int64 and uint8 map to MPI types; bf16 and fp16 travel as
// 16-bit words reduced by user-defined MPI operations that widen to fp32, add (or compare), and
// round back, as NCCL does.
// Avg is Sum followed by a division when the Work completes, on the host buffer MPI wrote (before
// a staged result is copied back). The group's MPI communicator is set to MPI_ERRORS_RETURN, so an
// MPI error becomes a kiln::Error naming rank, group, sequence number and operation, instead of
// MPI aborting without a word.
//
// Large messages. MPI counts elements in an int: a call over more than max_count elements (2^31 -
// 1) is split into pieces -- all_reduce, broadcast and send / receive piece by piece,
// reduce_scatter as one reduce per rank's chunk and piece, all_gather as one broadcast per rank's
// chunk and piece -- whose requests one Work waits for; the semantics and CommStats are those of
// the single call. (MPI-4's large-count calls would do, but Open MPI 4.1 has none.) all_to_all
// cannot be cut into rounds that way (a rank knows only its own blocks' sizes, so the ranks could
// not agree on how many), so it stays one MPI_Ialltoallw, the per-peer-datatype form of
// MPI_Ialltoallv: a block whose count or offset is over max_count elements travels as one element
// of a derived datatype that holds the offset (as an MPI_Aint) and the elements in runs of at
// most max_count; a smaller one as (count, dtype, byte offset), as MPI_Ialltoallv would. MPI
// matches type signatures, so the two ends of a block need not pick the same form. A rank's own
// block is copied, not handed to MPI.
//
// The device of a group. A group of the run (made with the run's device) accepts only tensors on
// that device: on a GPU run, CUDA tensors of that GPU (a host tensor, which MPI would take but
// NCCL refuses, fails here too); on a CPU run under the device-check mode (distributed/device_check.h),
// tensors in device memory. A group without a device (the host groups checkpoints use, the tests')
// takes CPU tensors and stages CUDA ones.
//
// Test-only settings, read from the environment when a group is made (never set in a real run):
//   KILN_MPI_STAGE_ALL=1   stage CPU tensors through separate host buffers exactly as CUDA ones
//                          (same copies, same completion order), so the staged path runs on a CPU
//   KILN_MPI_MAX_COUNT=N   split messages above N elements instead of 2^31 - 1 (all_to_all:
//                          derived datatypes for blocks or offsets above N), so the split path
//                          runs with small tensors
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <c10/core/Device.h>
#include <mpi.h>

#include "distributed/comm.h"

namespace kiln {

class Watchdog;

struct MpiOptions {
  std::optional<c10::Device> device;  // the run's device: every tensor must be on it; none: host group
  bool stage_cpu = false;             // stage CPU tensors too (test-only: KILN_MPI_STAGE_ALL=1)
  int64_t max_count = INT32_MAX;      // elements per MPI call (test-only override: KILN_MPI_MAX_COUNT)
  // The options for `device`, with the test-only settings from the environment (ConfigError when
  // one is malformed).
  static MpiOptions from_env(std::optional<c10::Device> device);
};

// Wraps a duplicate of `comm` (the caller keeps its own). MPI must be initialised. With a
// watchdog, every operation of this group and of the groups split from it is watched. `device`:
// the run's device, for the groups of a run (the groups split from it inherit it).
std::shared_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, const std::string& name,
                                                    std::shared_ptr<Watchdog> watchdog = nullptr,
                                                    std::optional<c10::Device> device = std::nullopt);
// The same with the options spelled out (tests: the staged and split paths without the environment).
std::shared_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, const std::string& name,
                                                    std::shared_ptr<Watchdog> watchdog, MpiOptions options);

}  // namespace kiln
