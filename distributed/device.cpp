// distributed/device.cpp -- device choice, name, peak memory and synchronisation.
#include "distributed/device.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <ATen/Context.h>
#include <torch/cuda.h>
#if defined(KILN_WITH_CUDA)
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

#include "distributed/cuda_backend.h"
#include "distributed/device_check.h"
#include "distributed/error.h"

namespace kiln {

DeviceInfo select_device(const std::string& choice, int local_rank) {
  DeviceInfo info;
  // --device cpu asks nothing of CUDA (its LibTorch half stays unloaded: distributed/cuda_backend.h);
  // otherwise the half is loaded first (main() did, for the kiln commands), then asked.
  const bool have_gpu = choice != "cpu" && load_cuda_backend() && torch::cuda::is_available();
  if (choice == "cpu" || (choice == "auto" && !have_gpu)) {
    // The test suite's check that every collective's tensor is on the run's device (a no-op
    // distinction on a CPU otherwise): distributed/device_check.h.
    if (device_check_requested()) enable_device_check();
    info.device = c10::Device(c10::kCPU);
    info.name = "cpu";
    return info;
  }
  if (choice != "auto" && choice.rfind("cuda", 0) != 0) {
    throw ConfigError("--device must be auto, cpu, cuda or cuda:N (got '" + choice + "')");
  }
  if (!have_gpu) {
    const std::string why = cuda_backend_error();
    throw ConfigError("--device " + choice + ": no CUDA GPU is visible to LibTorch" +
                      (why.empty() ? (cuda_backend_built() ? "" : " (this kiln was built without CUDA)") : " (" + why + ")"));
  }
  int index = local_rank % static_cast<int>(torch::cuda::device_count());
  if (choice.size() > 4 && choice[4] == ':') {
    const std::string n = choice.substr(5);
    if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos || std::stoi(n) >= torch::cuda::device_count())
      throw ConfigError("--device " + choice + ": no such GPU (" + std::to_string(torch::cuda::device_count()) + " visible)");
    index = std::stoi(n);
  }
  info.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
  // The device check's GPU half: LibTorch's own account of where the host waits.
  if (device_check_requested()) enable_cuda_sync_count();
#if defined(KILN_WITH_CUDA)
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) == cudaSuccess) {
    info.name = prop.name;
    info.capability = prop.major * 10 + prop.minor;
  }
  cudaSetDevice(index);
#endif
  if (info.name.empty()) info.name = "cuda";
  return info;
}

double peak_memory_bytes(const c10::Device& device) {
#if defined(KILN_WITH_CUDA)
  if (device.is_cuda()) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return static_cast<double>(
        stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak);
  }
#endif
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream in(line.substr(6));
      double kb = 0;
      in >> kb;
      return kb * 1024.0;
    }
  }
  return 0.0;
}

void cap_device_memory(const c10::Device& device, double gb) {
#if defined(KILN_WITH_CUDA)
  if (device.is_cuda()) {
    size_t free_bytes = 0, total_bytes = 0;
    cudaSetDevice(device.index());
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) throw Error("cudaMemGetInfo failed");
    const double fraction = gb * 1e9 / static_cast<double>(total_bytes);
    if (fraction > 1.0) {
      throw ConfigError("--device-memory-cap-gb " + std::to_string(gb) + " exceeds the device's " +
                        std::to_string(static_cast<double>(total_bytes) / 1e9) + " GB");
    }
    // LibTorch creates the caching allocator's per-device state lazily, at the first CUDA
    // allocation; before it setMemoryFraction throws "Allocator not initialized for device" (seen
    // on the first GPU run: the cap is set before anything is allocated). One small allocation
    // initialises it; the block stays in the cache and is counted within the cap.
    (void)at::empty({1}, at::TensorOptions().device(device));
    c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, device.index());
    return;
  }
#endif
  throw ConfigError("--device-memory-cap-gb needs a CUDA device (got " + device.str() + ")");
}

void reset_peak_memory(const c10::Device& device) {
#if defined(KILN_WITH_CUDA)
  if (device.is_cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
    return;
  }
#endif
  std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM to the current RSS
}

void release_cached_memory(const c10::Device& device) {
#if defined(KILN_WITH_CUDA)
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
  (void)device;
}

void synchronize(const c10::Device& device) {
#if defined(KILN_WITH_CUDA)
  if (device.is_cuda()) cudaDeviceSynchronize();
#endif
}

void use_deterministic_algorithms() {
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
}

}  // namespace kiln
