// parallel/host_accumulator.h -- host += device without stalling the thread that runs backward.
//
// ZeRO-3 with --offload all keeps each unit's reduced gradient shard on the host (parallel/zero.h).
// Every micro-step each unit's reduce-scatter lands a device shard r (n elements) that must be
// added into the host shard g: g += r. Done in line, that is a blocking copy into a new pageable
// tensor and a host add, once per unit inside backward: the GPU idles meanwhile. Here instead:
//   add(r, g)   r is copied into one of `slots` page-locked buffers on the current stream without
//               blocking, and a CUDA event is recorded after the copy; a worker thread waits for
//               the event and adds the buffer into g (a plain loop, off the backward thread).
//               The caller may drop r at once (the copy is ordered on its stream; LibTorch's
//               caching allocator reuses the memory only after it). Only when every slot is
//               still busy does add() wait, for the oldest.
//   drain()     waits until every add issued has landed in its g: before g is read or zeroed.
// Adds run in the order issued, so several adds into one g (one per micro-step) are safe.
// On the CPU the same path runs with pageable slots and a synchronous copy (no event), so CPU
// tests exercise the slots, the worker and the drain order; KILN_TEST_HOST_ADD_DELAY_MS delays
// every add that long (tests only: a reader that does not drain() then reads early every time).
// Memory: slots x the largest shard of host memory, page-locked on a GPU (2 slots: 2 x 4 n_max
// bytes).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace kiln {

class HostAccumulator {
 public:
  // device: where the sources live; capacity: elements of the largest source; slots >= 1.
  HostAccumulator(c10::Device device, int64_t capacity, int slots = 2);
  ~HostAccumulator();  // drains
  HostAccumulator(const HostAccumulator&) = delete;
  HostAccumulator& operator=(const HostAccumulator&) = delete;

  // dst (fp32, CPU, contiguous) += src (fp32, contiguous, on the device; numel <= capacity),
  // eventually. dst must not be touched until drain() returns.
  void add(const at::Tensor& src, const at::Tensor& dst);
  // Returns once every add issued has landed. Rethrows a failure of the worker.
  void drain();

 private:
  struct Slot;
  struct Task {
    Slot* slot;
    float* dst;
    int64_t n;
  };
  void work();
  void finish(Slot& s);  // waits for the slot's add (caller holds no lock)

  c10::Device device_;
  int64_t capacity_;
  std::vector<std::unique_ptr<Slot>> slots_;
  size_t next_ = 0;  // the slot the next add takes (round robin: the oldest)
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  int64_t issued_ = 0, landed_ = 0;
  std::string error_;
  bool stop_ = false;
  int test_delay_ms_ = 0;  // KILN_TEST_HOST_ADD_DELAY_MS (tests only): the worker sleeps this long before each add
  std::thread worker_;
};

}  // namespace kiln
