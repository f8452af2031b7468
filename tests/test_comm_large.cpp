// tests/test_comm_large.cpp -- messages over 2^31 - 1 elements through the MPI backend, at 2
// ranks (label mpi). MPI counts elements in an int: the backend used to refuse such a tensor
// ("tensors over 2^31 elements are not supported"), and a pipeline stage's checkpoint or a ZeRO-3
// unit of a large model is one. It now splits them (distributed/comm_mpi.h). uint8 keeps the memory
// at 2 GiB per tensor: a broadcast and an all-reduce (max) of 2^31 + 64 elements, and an
// all-gather whose output is 2^31 + 64 elements, each checked at both ends and across the first
// piece boundary. The smaller-scale checks of every split path are in test_comm_mpi
// (SplitAndStagedPathsAgree, and the whole suite with KILN_MPI_MAX_COUNT=5).
#include <cstdio>
#include <cstdint>

#include <ATen/ATen.h>
#include <mpi.h>

#include "distributed/comm_mpi.h"
#include "distributed/env.h"
#include "distributed/error.h"

namespace {

constexpr int64_t kN = (int64_t{1} << 31) + 64;  // elements: over INT32_MAX
constexpr int64_t kBoundary = INT32_MAX;         // the first piece ends here

int failures = 0;
void check(bool ok, const char* what, int rank) {
  if (!ok) {
    std::fprintf(stderr, "test_comm_large: rank %d: %s failed\n", rank, what);
    ++failures;
  }
}

uint8_t at_u8(const at::Tensor& t, int64_t i) { return t.data_ptr<uint8_t>()[i]; }

}  // namespace

int main(int argc, char** argv) {
  kiln::Environment env(&argc, &argv);
  if (!env.info().mpi || env.info().world_size != 2) {
    std::fprintf(stderr, "test_comm_large: run under mpirun -np 2\n");
    return 2;
  }
  const int r = env.info().rank;
  auto world = kiln::make_mpi_communicator(MPI_COMM_WORLD, "world");
  try {
    {
      // Broadcast from rank 1: every element, the ends and both sides of the boundary, arrives.
      at::Tensor t = at::full({kN}, r == 1 ? 7 : 0, at::kByte);
      if (r == 1) {
        t.data_ptr<uint8_t>()[0] = 1;
        t.data_ptr<uint8_t>()[kBoundary - 1] = 2;
        t.data_ptr<uint8_t>()[kBoundary] = 3;
        t.data_ptr<uint8_t>()[kN - 1] = 4;
      }
      world->broadcast(t, 1)->wait();
      check(at_u8(t, 0) == 1 && at_u8(t, kBoundary - 1) == 2 && at_u8(t, kBoundary) == 3 && at_u8(t, kN - 1) == 4,
            "broadcast ends", r);
      check(at_u8(t, 12345) == 7 && at_u8(t, kN - 2) == 7, "broadcast body", r);
      // All-reduce max: rank 0 contributes 9 at the last element, rank 1 keeps its values.
      if (r == 0) t.data_ptr<uint8_t>()[kN - 1] = 9;
      world->all_reduce(t, kiln::ReduceOp::Max)->wait();
      check(at_u8(t, kN - 1) == 9 && at_u8(t, kBoundary) == 3 && at_u8(t, 0) == 1, "all_reduce max", r);
    }
    {
      // All-gather: each rank's half of an output of kN elements.
      const int64_t half = kN / 2;
      at::Tensor mine = at::full({half}, 10 + r, at::kByte);
      mine.data_ptr<uint8_t>()[half - 1] = static_cast<uint8_t>(20 + r);
      at::Tensor all = at::empty({kN}, at::kByte);
      world->all_gather(all, mine)->wait();
      check(at_u8(all, 0) == 10 && at_u8(all, half - 1) == 20 && at_u8(all, half) == 11 && at_u8(all, kN - 1) == 21,
            "all_gather", r);
    }
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "test_comm_large: rank %d: %s\n", r, e.what());
    ++failures;
  }
  int any = 0;
  MPI_Allreduce(&failures, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (r == 0) std::printf("test_comm_large: %s\n", any ? "FAILED" : "2^31 + 64 elements broadcast, all-reduced and all-gathered");
  world.reset();
  return any ? 1 : 0;
}
