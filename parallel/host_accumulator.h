// parallel/host_accumulator.h -- host += device (or host = device) without stalling the thread
// that runs backward.
//
// ZeRO-3 with --offload all keeps each unit's reduced gradient shard on the host (parallel/zero.h).
// Every micro-step each unit's reduce-scatter lands a device shard r (n elements) that must reach
// the host shard g: g = r on the step's first micro-step, g += r after it. Done in line, that is a
// blocking copy into a new pageable tensor and a host add, once per unit inside backward, the GPU
// idle meanwhile. Here instead, on the engine's HostWorker (parallel/host_worker.h):
//   add(r, g)          r is copied into one of `slots` page-locked buffers without blocking, on a
//                      copy stream of the accumulator's own that waits for the current (compute)
//                      stream, so the copy overlaps the backward's next kernels; a CUDA event is
//                      recorded after the copy (r is recorded as in use on the copy stream, so the
//                      caching allocator does not hand its memory out before); a worker task
//                      waits for the event and adds the buffer into g, over the host's cores
//                      (at::parallel_for: each element is one fp32 addition, so the split changes
//                      no bit). Only when every slot is still busy does add() wait, for the oldest.
//   add(r, g, assign)  the step's first: r is copied straight into g (page-locked) and the task
//                      only waits for the copy's event -- no slot, no host pass, and no zeroing of
//                      g beforehand (at grad_accum 1 the shard is written once: 4 bytes an element
//                      instead of a memset and an add's 12).
//   drain()            every task issued has run: before g is read.
// The caller may drop r at once (its copy is ordered on its stream; LibTorch's caching allocator
// reuses the memory only after it). Tasks run in the order issued, so several adds into one g (one
// per micro-step) are safe. An assign's copy lands on the stream's time, not the worker's: g must
// have no task still queued that reads it (the engine waits for the unit's update first).
// On the CPU the same path runs with pageable slots and the copy made in line (no event), so CPU
// tests exercise the slots, the worker and the drain order; KILN_TEST_HOST_ADD_DELAY_MS delays
// every task that long and KILN_TEST_HOST_ADD_SLOTS=N gives it N slots (tests only: a reader that
// does not drain() then reads early every time, several adds short).
// Memory: slots x the largest shard of host memory, page-locked on a GPU (2 slots: 2 x 4 n_max bytes).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace kiln {

class HostWorker;

class HostAccumulator {
 public:
  // worker: runs the adds (outlives this); device: where the sources live (it decides whether the
  // slots are page-locked); capacity: elements of the largest source; slots >= 1.
  HostAccumulator(HostWorker& worker, c10::Device device, int64_t capacity, int slots = 2);
  ~HostAccumulator();  // drains
  HostAccumulator(const HostAccumulator&) = delete;
  HostAccumulator& operator=(const HostAccumulator&) = delete;

  // dst (fp32, CPU, contiguous) += src (fp32, contiguous, on the device; numel <= capacity), or
  // dst = src with assign, eventually. dst must not be touched until drain() returns.
  void add(const at::Tensor& src, const at::Tensor& dst, bool assign = false);
  // Returns once every add issued has landed. Rethrows a failure of the worker.
  void drain();

 private:
  struct Slot;
  HostWorker& worker_;
  int64_t capacity_;
  std::vector<std::unique_ptr<Slot>> slots_;
  size_t next_ = 0;        // the slot the next add takes (round robin: the oldest)
  int64_t last_ = 0;       // the last task's ticket
  int test_delay_ms_ = 0;  // KILN_TEST_HOST_ADD_DELAY_MS (tests only): each task sleeps this long first
  struct CopyStream;                          // the device-to-host copies' stream (CUDA builds)
  std::unique_ptr<CopyStream> copy_stream_;   // made on the first copy from a GPU
};

}  // namespace kiln
