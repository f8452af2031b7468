// distributed/backend_choice.cpp -- the backend rule, and the facts it needs from every rank.
#include "distributed/backend_choice.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <utility>

#if defined(KILN_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

#include "distributed/error.h"

namespace kiln {

bool build_has_nccl() {
#if defined(KILN_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

namespace {

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

// What this rank computes on. The GPU is named by its UUID, so two ranks that see one physical
// GPU under different indices (CUDA_VISIBLE_DEVICES) are still recognised as sharing it.
RankDevice this_rank(const c10::Device& device) {
  RankDevice d;
  const std::string host = host_name();
  d.cuda = device.is_cuda();
  if (!d.cuda) {
    d.label = device.str() + " on host " + host;
    return d;
  }
  int index = device.has_index() ? static_cast<int>(device.index()) : -1;
#if defined(KILN_WITH_CUDA)
  if (index < 0 && cudaGetDevice(&index) != cudaSuccess) index = 0;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) == cudaSuccess) {
    char hex[33] = {};
    for (int i = 0; i < 16; ++i)
      std::snprintf(hex + 2 * i, 3, "%02x", static_cast<unsigned>(static_cast<unsigned char>(prop.uuid.bytes[i])));
    d.gpu = std::string("GPU-") + hex;
  }
#endif
  if (index < 0) index = 0;
  if (d.gpu.empty()) d.gpu = "index-" + std::to_string(index);  // UUID unknown: the index stands in
  d.label = "cuda:" + std::to_string(index) + " on host " + host;
  return d;
}

// One rank's facts, as MPI_Allgather carries them (MPI_BYTE; every rank runs the same binary).
struct Record {
  int32_t cuda;
  int32_t node;
  char gpu[48];
  char label[128];
};

void copy_str(char* dst, size_t size, const std::string& src) {
  std::snprintf(dst, size, "%s", src.c_str());
}

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(std::string("choosing the backend: ") + what + " failed: " + std::string(msg, len));
}

}  // namespace

std::string decide_backend(const std::string& requested, bool have_nccl, const std::vector<RankDevice>& ranks) {
  if (requested != "auto" && requested != "nccl" && requested != "mpi")
    throw ConfigError("--backend must be auto, nccl or mpi (got '" + requested + "')");
  if (requested == "mpi") return "mpi";
  std::string why;  // why NCCL cannot be used; empty when it can
  if (!have_nccl) why = "this build of kiln has no NCCL (its LibTorch has no CUDA)";
  for (size_t r = 0; why.empty() && r < ranks.size(); ++r) {
    if (ranks[r].cuda) continue;
    why = ranks.size() == 1 ? "the device is " + ranks[r].label + ", and NCCL needs a CUDA device"
                            : "rank " + std::to_string(r) + " computes on " + ranks[r].label +
                                  ", and NCCL needs a CUDA device on every rank";
  }
  std::map<std::pair<int, std::string>, size_t> first_on_gpu;  // (node, GPU) -> lowest rank there
  for (size_t r = 0; why.empty() && r < ranks.size(); ++r) {
    const auto [it, fresh] = first_on_gpu.emplace(std::make_pair(ranks[r].node, ranks[r].gpu), r);
    if (fresh) continue;
    why = "ranks " + std::to_string(it->second) + " and " + std::to_string(r) + " share one GPU (" +
          ranks[it->second].label + "), and NCCL needs a GPU of its own for every rank";
  }
  if (why.empty()) return "nccl";
  if (requested == "auto") return "mpi";
  throw ConfigError("--backend nccl: " + why + "; use --backend mpi");
}

std::string choose_backend(const std::string& requested, const c10::Device& device, MPI_Comm world) {
  if (requested == "mpi") return "mpi";  // nothing to agree on: every rank passes the same value
  const RankDevice mine = this_rank(device);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized || world == MPI_COMM_NULL) return decide_backend(requested, build_has_nccl(), {mine});

  int rank = 0, size = 1;
  check(MPI_Comm_rank(world, &rank), "MPI_Comm_rank");
  check(MPI_Comm_size(world, &size), "MPI_Comm_size");
  // The node: the lowest rank of `world` among the ranks that share memory with this one.
  MPI_Comm local = MPI_COMM_NULL;
  check(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local), "MPI_Comm_split_type");
  int node = rank;
  const int rc = MPI_Allreduce(MPI_IN_PLACE, &node, 1, MPI_INT, MPI_MIN, local);
  MPI_Comm_free(&local);
  check(rc, "MPI_Allreduce");

  Record record{};
  record.cuda = mine.cuda ? 1 : 0;
  record.node = node;
  copy_str(record.gpu, sizeof record.gpu, mine.gpu);
  copy_str(record.label, sizeof record.label, mine.label);
  std::vector<Record> all(static_cast<size_t>(size));
  check(MPI_Allgather(&record, sizeof(Record), MPI_BYTE, all.data(), sizeof(Record), MPI_BYTE, world),
        "MPI_Allgather");
  std::vector<RankDevice> ranks(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    ranks[r].cuda = all[r].cuda != 0;
    ranks[r].node = all[r].node;
    ranks[r].gpu.assign(all[r].gpu, strnlen(all[r].gpu, sizeof all[r].gpu));
    ranks[r].label.assign(all[r].label, strnlen(all[r].label, sizeof all[r].label));
  }
  return decide_backend(requested, build_has_nccl(), ranks);
}

}  // namespace kiln
