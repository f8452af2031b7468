// distributed/device.h -- which device this process computes on, and what it is.
//
// --device auto picks CUDA when LibTorch sees a GPU, else the CPU. (Under mpirun, the GPU is
// chosen from the local rank; that arrives with the distributed runtime.)
#pragma once

#include <string>

#include <c10/core/Device.h>

namespace kiln {

struct DeviceInfo {
  c10::Device device{c10::kCPU};
  std::string name;  // "cpu", or the GPU's marketing name ("NVIDIA H100 80GB HBM3")
  int capability = 0;  // a GPU's compute capability, major x 10 + minor (90: Hopper); 0: the CPU, or unknown
};

// Resolves "auto" | "cpu" | "cuda" | "cuda:N". Throws ConfigError for an unknown value, or for
// "cuda" on a machine (or a LibTorch) without a GPU.
DeviceInfo select_device(const std::string& choice, int local_rank = 0);

// Peak bytes held by this process on the device since start: the caching allocator's peak on
// CUDA, the resident-set high-water mark (VmHWM) on the CPU.
double peak_memory_bytes(const c10::Device& device);

// Caps what the CUDA caching allocator may hold for this process at `gb` (1e9 bytes), as a
// fraction of the device's memory (setMemoryFraction): allocations beyond it fail with
// out-of-memory as if the device were that small. Throws ConfigError on the CPU or when the cap
// exceeds the device.
void cap_device_memory(const c10::Device& device, double gb);

// Starts the peak above afresh (CUDA: the allocator's peak statistics; CPU: VmHWM, through
// /proc/self/clear_refs), so that a run measures its own peak in a process that ran others.
void reset_peak_memory(const c10::Device& device);

// Returns the caching allocator's unused blocks to the device (no-op on the CPU): after an
// out-of-memory failure, before the next attempt.
void release_cached_memory(const c10::Device& device);

// --deterministic: LibTorch's deterministic algorithms (not warn-only: an op with no deterministic
// kernel ends the run with LibTorch's error naming it) and cuBLAS's fixed workspace
// (CUBLAS_WORKSPACE_CONFIG=:4096:8 unless the environment sets it; read when the first cuBLAS
// handle is made, so called before the first matrix product). On CUDA the attention backward
// then accumulates without atomics (flash: its deterministic path; memory-efficient: one key
// split; cuDNN's is never chosen), and index_add_ sorts: a replay from a checkpoint is bit-identical
// there as on the CPU, at some cost in speed (docs/checkpoints.md). Process-wide, for the process's life.
void use_deterministic_algorithms();

// Waits for queued device work (no-op on the CPU). Used only where a time is read.
void synchronize(const c10::Device& device);

}  // namespace kiln
