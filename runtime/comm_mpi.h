// runtime/comm_mpi.h -- the MPI backend of Communicator.
//
// CPU tensors (and CUDA tensors staged through pinned host memory), through MPI's non-blocking collectives (MPI_Iallreduce, MPI_Ireduce_scatter_block,
// MPI_Iallgather, MPI_Ibcast, MPI_Isend/Irecv); Work wraps the MPI_Requests. fp32, fp64, int32,
// int64 and uint8 map to MPI types; bf16 and fp16 travel as 16-bit words reduced by user-defined
// MPI operations that widen to fp32, add (or compare), and round back, as NCCL does.
// Avg is Sum followed by a division when the Work completes. The group's MPI communicator is
// set to MPI_ERRORS_RETURN, so an MPI error becomes a kiln::Error naming rank, group, sequence
// number and operation, instead of MPI aborting without a word.
#pragma once

#include <memory>
#include <string>

#include <mpi.h>

#include "runtime/comm.h"

namespace kiln {

class Watchdog;

// Wraps a duplicate of `comm` (the caller keeps its own). MPI must be initialised. With a
// watchdog, every operation of this group and of the groups split from it is watched.
std::shared_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, const std::string& name,
                                                    std::shared_ptr<Watchdog> watchdog = nullptr);

}  // namespace kiln
