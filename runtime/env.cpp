// runtime/env.cpp -- MPI initialisation and rank discovery.
#include "runtime/env.h"

#include <cstdlib>
#include <string>

#include <mpi.h>

#include "runtime/error.h"

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
  MPI_Comm_free(&local);
}

Environment::~Environment() {
  if (!info_.mpi) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace kiln
