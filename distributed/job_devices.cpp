// distributed/job_devices.cpp -- device identities, their all-gather at set-up, the energy sum.
#include "distributed/job_devices.h"

#include <unistd.h>

#include <cmath>
#include <cstring>

#include <ATen/ATen.h>
#if defined(KILN_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace kiln {

namespace {

// One rank's record in the all-gather: its identity, NUL-padded, then its meter's flag.
constexpr int64_t kRecordBytes = 256;
constexpr int64_t kIdentityBytes = kRecordBytes - 1;

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

}  // namespace

std::string device_identity(const c10::Device& device, int world_rank) {
  const std::string host = host_name();
  if (!device.is_cuda()) return host + "/cpu/rank " + std::to_string(world_rank);
  int index = device.has_index() ? static_cast<int>(device.index()) : 0;
#if defined(KILN_WITH_CUDA)
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, index) == cudaSuccess) return host + "/" + bus;
#endif
  // No bus id (no CUDA runtime in this build, or the call failed): the index stands in, which
  // only tells apart GPUs that every rank of the host numbers alike.
  return host + "/cuda:" + std::to_string(index);
}

DeviceRoles device_roles(const std::vector<std::string>& identities, int rank) {
  DeviceRoles roles;
  roles.count = 0;
  for (size_t r = 0; r < identities.size(); ++r) {
    bool first = true;
    for (size_t q = 0; q < r && first; ++q) first = identities[q] != identities[r];
    if (first) ++roles.count;
    if (static_cast<int>(r) == rank) roles.reads_energy = first;
  }
  return roles;
}

JobDevices::JobDevices(const c10::Device& device, bool meter_available, std::shared_ptr<Communicator> world)
    : world_(std::move(world)) {
  if (!world_) {
    energy_known_ = meter_available;
    return;
  }
  const int n = world_->size();
  const std::string mine = device_identity(device, world_->rank()).substr(0, kIdentityBytes - 1);
  at::Tensor row = at::zeros({kRecordBytes}, at::kByte);
  uint8_t* bytes = row.data_ptr<uint8_t>();
  std::memcpy(bytes, mine.data(), mine.size());
  bytes[kIdentityBytes] = meter_available ? 1 : 0;
  at::Tensor all = at::empty({n * kRecordBytes}, at::kByte);
  world_->all_gather(all, row)->wait();

  std::vector<std::string> identities;
  energy_known_ = true;
  const auto* a = reinterpret_cast<const char*>(all.data_ptr<uint8_t>());
  for (int r = 0; r < n; ++r) {
    const char* rec = a + r * kRecordBytes;
    identities.emplace_back(rec, strnlen(rec, kIdentityBytes));
    energy_known_ = energy_known_ && rec[kIdentityBytes] != 0;
  }
  const DeviceRoles roles = device_roles(identities, world_->rank());
  count_ = roles.count;
  reads_energy_ = roles.reads_energy;
}

std::optional<double> JobDevices::job_joules(std::optional<double> before, std::optional<double> after) {
  if (!energy_known_) return std::nullopt;
  // A rank that does not read its device adds 0; a failed read adds NaN, so the sum says unknown.
  double joules = !reads_energy_ ? 0.0 : (before && after) ? *after - *before : NAN;
  if (world_ && world_->size() > 1) {
    at::Tensor sum = at::full({1}, joules, at::kDouble);
    world_->all_reduce(sum, ReduceOp::Sum)->wait();
    joules = sum.item<double>();
  }
  if (!std::isfinite(joules)) return std::nullopt;
  return joules;
}

}  // namespace kiln
