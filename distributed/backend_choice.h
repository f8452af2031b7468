// distributed/backend_choice.h -- which Communicator backend a job uses: --backend auto | nccl | mpi.
//
// The rule:
//   mpi   always possible (CPU tensors, or CUDA tensors staged through host memory).
//   nccl  needs a CUDA device on every rank, a build with NCCL (a CUDA LibTorch), and one GPU per
//         rank: NCCL refuses two ranks of a communicator on one GPU. Two ranks share a GPU when
//         they run on the same node (MPI_COMM_TYPE_SHARED) and their devices have the same UUID
//         (so CUDA_VISIBLE_DEVICES remapping per rank is seen through). Asked for and impossible:
//         ConfigError, one line saying why and suggesting --backend mpi.
//   auto  nccl where nccl is possible, else mpi.
// A world of one follows the same rule (nccl on a GPU), so a single-GPU run can exercise NCCL.
//
// The decision is collective: every rank contributes what it computes on, the facts are gathered
// with MPI_Allgather, and every rank applies the rule to the same facts, so all ranks return the
// same backend or all throw the same error. Without MPI (no mpirun) the process is a world of
// one and nothing is communicated.
#pragma once

#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <mpi.h>

namespace kiln {

// Collective over `world` when MPI is initialised: every rank must call it with the same
// `requested`. Returns "nccl" or "mpi"; throws ConfigError as described above.
std::string choose_backend(const std::string& requested, const c10::Device& device, MPI_Comm world);

// True when this build has the NCCL backend (distributed/comm_nccl.h).
bool build_has_nccl();

// What one rank computes on, as the rule sees it.
struct RankDevice {
  bool cuda = false;   // computes on a GPU
  int node = 0;        // ranks with the same value share a node (memory)
  std::string gpu;     // the GPU's identity (UUID); equal on one node = the same physical GPU
  std::string label;   // "cuda:0 on host gpu-7", for messages
};

// The rule itself, applied to facts already gathered (ranks[r] is world rank r). Pure: the same
// input gives the same answer on every rank. Exposed for tests.
std::string decide_backend(const std::string& requested, bool have_nccl, const std::vector<RankDevice>& ranks);

}  // namespace kiln
