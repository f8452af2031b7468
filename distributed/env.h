// distributed/env.h -- process bootstrap: MPI under mpirun, a world of one without it.
//
// Under mpirun (Open MPI sets OMPI_COMM_WORLD_SIZE; Slurm's PMIx launch sets PMIX_RANK) MPI is
// initialised with MPI_THREAD_MULTIPLE (the communicators' progress and the watchdog run on
// threads of their own), and each process learns its global rank and its local rank among the
// processes of its node (MPI_Comm_split_type SHARED), which picks its GPU, and the node's index
// among the job's nodes (the node leaders -- local rank 0 -- numbered by their global rank). Without a launcher
// MPI is not touched: one process is a world of one, and single-GPU debugging needs no mpirun.
#pragma once

#include <mpi.h>

namespace kiln {

struct ProcessInfo {
  int rank = 0;          // global rank
  int world_size = 1;    // processes in the job
  int local_rank = 0;    // rank among the processes on this node
  int local_size = 1;    // processes on this node
  int node = 0;          // this node's index among the job's nodes (ordered by their lowest rank)
  int nodes = 1;         // nodes the job spans
  bool mpi = false;      // MPI was initialised (launched by mpirun / srun)
};

// Ends the whole job with `code`: MPI_Abort when MPI is up, and, whatever MPI_Abort manages, this
// process ends by itself kAbortGraceSeconds later. Across a network partition MPI_Abort cannot
// reach the launcher and may never return; a rank must still not outlive its job.
constexpr double kAbortGraceSeconds = 5.0;
[[noreturn]] void abort_job(int code);

// True when a process manager (mpirun, srun with PMIx) started this process.
bool launched_by_mpi();

// Owns MPI for the life of the process: initialises it in the constructor when launched by a
// process manager, finalises it in the destructor. One instance, created by main().
class Environment {
 public:
  Environment(int* argc, char*** argv);
  ~Environment();
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;
  const ProcessInfo& info() const { return info_; }

  // Whether every rank is failing too: this rank enters a barrier on a communicator of its own
  // (no other call can match it) and waits up to `seconds` for the others. True when all arrived:
  // every rank failed before it could wait on another in a collective (a configuration or data
  // error found by every rank alike), so the job can end with one line from rank 0 and a clean
  // MPI_Finalize instead of MPI_Abort's banner. False (a rank is elsewhere, or lost): abort.
  bool all_ranks_failing(double seconds);

 private:
  ProcessInfo info_;
  MPI_Comm errors_ = MPI_COMM_NULL;  // a duplicate of the world, for all_ranks_failing only
};

}  // namespace kiln
