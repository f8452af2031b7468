// distributed/device_check.h -- the device rule made checkable on a CPU: every tensor a collective of
// the run touches lives on the run's device.
//
// On a GPU, NCCL enforces the rule itself: a host tensor handed to it fails the job (often hours
// in, at the first checkpoint). On a CPU run host memory and "device" memory are the same thing,
// so the same mistake passes every CPU test. The check mode (KILN_DEVICE_CHECK=1 in the
// environment, set for every test of the suite; distributed/device.h's select_device turns it on for
// a CPU run) gives every CPU allocation a side, host or device, as a GPU run would:
//
//   factory without a device     at::zeros({n}), at::tensor({...}), at::TensorOptions()  -> host
//   factory naming a device      at::zeros({n}, x.options()), .device(run device)         -> device
//   any other op                 device if any tensor input is device memory, else host
//   to_device(t, device)         a device copy of a host tensor (what .to(cuda) makes)
//   host_buffer(), from_blob     host (deliberate host buffers; mmapped data)
//
// and the run's communicators (distributed/comm_mpi.h with a device) refuse host memory with one line
// naming the call, where NCCL would refuse it on a GPU. How: a CPU allocator that tags each
// allocation, and a dispatcher fallback on LibTorch's TESTING_ONLY_GenericMode key (a mode key,
// included for the thread that enables the check) that decides the side of each op from its
// arguments before passing it on unchanged. Numerics are untouched: only where memory is
// recorded changes.
//
// What it catches: a tensor made without a device (the usual way code makes host tensors), any
// result computed from host tensors alone, its views, and mmapped or from_blob memory, handed to
// a collective of the run. What it cannot catch: `.cpu()` / `.to(at::kCPU)` of a device tensor
// (a no-op on a CPU run: the same memory comes back), a host tensor mixed with device memory in
// one op (the result counts as device memory; on a GPU the op itself would fail unless the host
// tensor is a 0-dim scalar), allocations on threads that never enabled the mode (they count as
// device memory), and anything on a GPU run (there NCCL is the check) but its syncs (below).
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace torch::nn {
class Module;
}

namespace kiln {

// Turns the check on for this process and the calling thread (idempotent). Tensors allocated
// before count as host memory.
void enable_device_check();
// Whether the check is on in this process.
bool device_check_enabled();
// Whether KILN_DEVICE_CHECK=1 asks for it.
bool device_check_requested();

// Check mode: how many times, so far in this process, the host has read device memory on a
// thread with the mode -- what on a GPU waits for the device: .item() (and truth values,
// at::equal) of device memory, and copies of device memory into host memory (copy_, and what
// calls it: to_host below). Not seen: .cpu() / .to(at::kCPU) of a device tensor
// (a no-op on a CPU run) and raw data_ptr() reads. 0 outside the check mode. The trainer's
// sync-free step is tested with it (tests/cli/sync_free.sh).
int64_t device_to_host_reads();
// Check mode: how many copies of host memory into device memory, so far in this process, would
// make the host wait on a GPU: blocking ones (copy_ without non_blocking, to_device without it),
// and non-blocking ones from pageable memory (CUDA stages those through a bounce buffer and returns
// only when the stream has reached the copy). Only host_buffer(n, true)'s memory counts as
// page-locked here (a GPU run's LibTorch pinned tensors do not exist on a CPU).
int64_t waiting_host_to_device_copies();
// Both, and on a GPU the syncs LibTorch flags (enable_cuda_sync_count): every place the host waits
// for the device (the step record's host_syncs_before_update).
int64_t host_syncs();

// The GPU half, for a CUDA run with KILN_DEVICE_CHECK=1 (distributed/device.cpp's select_device): a
// GPU needs no stand-in, LibTorch knows where it waits. Its sync-debug mode (what PyTorch's
// torch.cuda.set_sync_debug_mode("warn") turns on) flags each synchronizing CUDA call it makes --
// .item() and truth values of CUDA tensors, copies between host and device that block (either
// way), stream and device synchronisations, nonzero -- with a warning, and a warning handler on
// the calling thread counts those into host_syncs() instead of printing them (other warnings pass
// on to the handler it replaced). Not seen: a non-blocking copy from pageable memory (the driver
// waits inside cudaMemcpyAsync, unknown to LibTorch), CUDA runtime calls kiln makes directly
// (an event's synchronize), and other threads' syncs (LibTorch's own handler prints those, each
// time). Idempotent, for the process's life; a no-op in a build without CUDA.
void enable_cuda_sync_count();
// Whether host_syncs() counts anything: the CPU check mode or the GPU count is on.
bool host_sync_count_enabled();

// Check mode: whether the CPU tensor t is host memory (made without a device, by ops on host
// tensors only, through from_blob or host_buffer). False outside the check mode, for CUDA tensors
// and for undefined tensors.
bool is_host_memory(const at::Tensor& t);

// Allocations made while one lives are host memory (check mode; no effect otherwise): for the
// deliberate host buffers of distributed/host_memory.h; `pinned`: the page-locked ones.
class HostAllocationScope {
 public:
  explicit HostAllocationScope(bool pinned = false);
  ~HostAllocationScope();
  HostAllocationScope(const HostAllocationScope&) = delete;
  HostAllocationScope& operator=(const HostAllocationScope&) = delete;

 private:
  int saved_side_;
  bool saved_pinned_;
  bool saved_mode_ = false;
};

// t on `device`, the run's device: t.to(device, non_blocking), except that in check mode a CPU
// tensor in host memory is copied into device memory (on a CPU run .to() returns t itself). The
// one way kiln moves a host tensor to the run's device.
at::Tensor to_device(const at::Tensor& t, c10::Device device, bool non_blocking = false);
// t's values in host memory: a fresh CPU tensor (in check mode a host allocation, the copy into
// it a counted device-to-host read; on a GPU the copy waits for the device).
at::Tensor to_host(const at::Tensor& t);
// Every parameter and buffer of m onto `device` (Module::to, with to_device's check-mode copy).
void module_to_device(torch::nn::Module& m, c10::Device device);

}  // namespace kiln
