// distributed/env.cpp -- MPI initialisation and rank discovery.
#include "distributed/env.h"

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include <mpi.h>

#include "distributed/error.h"

namespace kiln {

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr ||
         std::getenv("PMI_RANK") != nullptr;
}

Environment::Environment(int* argc, char*** argv) {
  if (!launched_by_mpi()) return;
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    throw Error("MPI_Init_thread failed (is this process started by a matching mpirun?)");
  }
  info_.mpi = true;
  if (provided < MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    throw Error("this MPI provides thread level " + std::to_string(provided) +
                ", kiln needs MPI_THREAD_MULTIPLE (Open MPI built with --enable-mpi-thread-multiple)");
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &info_.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &info_.world_size);
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, info_.rank, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &info_.local_rank);
  MPI_Comm_size(local, &info_.local_size);
  // The nodes: their leaders (local rank 0) in a group of their own, numbered by global rank; each
  // leader tells its node its index and the count.
  MPI_Comm leaders;
  MPI_Comm_split(MPI_COMM_WORLD, info_.local_rank == 0 ? 0 : MPI_UNDEFINED, info_.rank, &leaders);
  int topo[2] = {0, 1};
  if (leaders != MPI_COMM_NULL) {
    MPI_Comm_rank(leaders, &topo[0]);
    MPI_Comm_size(leaders, &topo[1]);
    MPI_Comm_free(&leaders);
  }
  MPI_Bcast(topo, 2, MPI_INT, 0, local);
  info_.node = topo[0];
  info_.nodes = topo[1];
  MPI_Comm_free(&local);
  MPI_Comm_dup(MPI_COMM_WORLD, &errors_);
}

Environment::~Environment() {
  if (!info_.mpi) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (errors_ != MPI_COMM_NULL) MPI_Comm_free(&errors_);
  MPI_Finalize();
}

void abort_job(int code) {
  std::thread([code] {
    std::this_thread::sleep_for(std::chrono::duration<double>(kAbortGraceSeconds));
    std::_Exit(code);
  }).detach();
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

bool Environment::all_ranks_failing(double seconds) {
  if (!info_.mpi || errors_ == MPI_COMM_NULL) return true;
  MPI_Request req;
  if (MPI_Ibarrier(errors_, &req) != MPI_SUCCESS) return false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    int done = 0;
    if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    if (done) return true;
    if (std::chrono::steady_clock::now() > until) return false;  // the request is left behind: the job aborts
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace kiln
