// runtime/observe/energy.cpp -- NVML by dlopen: the handful of entry points kiln uses, declared here
// (their C ABI has been stable since NVML 1; the header is not part of every CUDA install).
#include "runtime/observe/energy.h"

#include <dlfcn.h>

#if defined(KILN_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace kiln {

namespace {
using nvmlReturn = int;  // NVML_SUCCESS = 0
using nvmlDevice = void*;
using InitFn = nvmlReturn (*)();
using ByPciFn = nvmlReturn (*)(const char*, nvmlDevice*);
using EnergyFn = nvmlReturn (*)(nvmlDevice, unsigned long long*);
}  // namespace

struct EnergyMeter::Impl {
  void* lib = nullptr;
  nvmlDevice device = nullptr;
  EnergyFn energy = nullptr;
  InitFn shutdown = nullptr;
  ~Impl() {
    if (shutdown) shutdown();
    if (lib) dlclose(lib);
  }
};

EnergyMeter::EnergyMeter(c10::Device device) {
#if defined(KILN_WITH_CUDA)
  if (!device.is_cuda()) return;
  auto impl = std::make_unique<Impl>();
  impl->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!impl->lib) return;
  auto init = reinterpret_cast<InitFn>(dlsym(impl->lib, "nvmlInit_v2"));
  auto by_pci = reinterpret_cast<ByPciFn>(dlsym(impl->lib, "nvmlDeviceGetHandleByPciBusId_v2"));
  impl->energy = reinterpret_cast<EnergyFn>(dlsym(impl->lib, "nvmlDeviceGetTotalEnergyConsumption"));
  auto shutdown = reinterpret_cast<InitFn>(dlsym(impl->lib, "nvmlShutdown"));
  if (!init || !by_pci || !impl->energy || !shutdown || init() != 0) return;
  impl->shutdown = shutdown;
  // NVML numbers devices its own way; the PCI bus id names the same GPU for both.
  char bus[32] = {0};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, device.index() < 0 ? 0 : device.index()) != cudaSuccess) return;
  if (by_pci(bus, &impl->device) != 0) return;
  unsigned long long mj = 0;
  if (impl->energy(impl->device, &mj) != 0) return;  // no energy counter on this GPU
  impl_ = std::move(impl);
#else
  (void)device;
#endif
}

EnergyMeter::~EnergyMeter() = default;

std::optional<double> EnergyMeter::joules() const {
  if (!impl_) return std::nullopt;
  unsigned long long mj = 0;
  if (impl_->energy(impl_->device, &mj) != 0) return std::nullopt;
  return static_cast<double>(mj) / 1e3;
}

}  // namespace kiln
