// runtime/env.h -- process bootstrap: MPI under mpirun, a world of one without it.
//
// Under mpirun (Open MPI sets OMPI_COMM_WORLD_SIZE; Slurm's PMIx launch sets PMIX_RANK) MPI is
// initialised with MPI_THREAD_MULTIPLE (the communicators' progress and the watchdog run on
// threads of their own), and each process learns its global rank and its local rank among the
// processes of its node (MPI_Comm_split_type SHARED), which picks its GPU. Without a launcher
// MPI is not touched: one process is a world of one, and single-GPU debugging needs no mpirun.
#pragma once

namespace kiln {

struct ProcessInfo {
  int rank = 0;          // global rank
  int world_size = 1;    // processes in the job
  int local_rank = 0;    // rank among the processes on this node
  int local_size = 1;    // processes on this node
  bool mpi = false;      // MPI was initialised (launched by mpirun / srun)
};

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

 private:
  ProcessInfo info_;
};

}  // namespace kiln
