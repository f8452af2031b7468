// distributed/host_memory.h -- host buffers of exactly their size: page-locked where a GPU copies
// to or from them, pageable where only the CPU touches them; and a pool that reuses them.
//
// Why not at::empty(..., pinned_memory(true)): LibTorch's pinned allocator (CachingHostAllocator)
// rounds every allocation up to a power of two and keeps it cached. ZeRO offload holds its host
// state as one buffer per unit and kind; a unit of 805 MB (one block of a d = 4096 model,
// 12 d^2 fp32 elements) would take 1,074 MB of page-locked memory, a third more, and host memory
// is what limits the largest model that `--offload all` trains (docs/zero.md, "Host memory").
// Here each pinned buffer is one cudaHostAlloc of its size (rounded to a page by the driver),
// freed by cudaFreeHost when the last tensor viewing it dies.
//
//   host_buffer(n, pinned = false)   at::empty({n}) fp32 on the CPU: pageable (the CPU AdamW's
//                                    moments: no device copy touches them)
//   host_buffer(n, pinned = true)    page-locked, so copies to and from the GPU are asynchronous
//                                    (a CUDA build with a device present; elsewhere pageable)
//   HostBufferPool::take(...)        a buffer of exactly a tensor's bytes, returned to the pool
//                                    when the last tensor viewing it dies, and handed out again
//                                    for the next request of the same size (the MPI backend's
//                                    staging buffers: the same sizes come back every step)
// In the device-check mode (distributed/device_check.h) all of these are host memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace kiln {

// A 1-D CPU tensor of n elements of `dtype` (fp32 unless said), uninitialised. In the check mode
// `pinned` buffers are pageable, tagged as page-locked (the device check then counts the copies a
// GPU run would wait for, and only those).
at::Tensor host_buffer(int64_t n, bool pinned, at::ScalarType dtype = at::kFloat);

// Whether the host buffers that `device` copies to and from are asked for page-locked: on a GPU,
// and in the check mode (as above).
bool pin_for(c10::Device device);

// An uninitialised CPU tensor shaped like t in page-locked memory from LibTorch's caching host
// allocator (which keeps a buffer from reuse until the copies that read it are done: for buffers
// made every step, as the prefetched batches); in the check mode pageable, tagged page-locked.
at::Tensor pinned_empty_like(const at::Tensor& t);

// Exact-size host buffers, reused. Thread-safe. Free buffers beyond the cap are given back to the
// system (oldest first): the cap is twice the largest buffer handed out plus 64 MiB, so the
// buffers a step uses over and over stay, and a one-off size (a checkpoint's tensors) does not
// pile up.
class HostBufferPool : public std::enable_shared_from_this<HostBufferPool> {
 public:
  static std::shared_ptr<HostBufferPool> make() { return std::shared_ptr<HostBufferPool>(new HostBufferPool()); }
  ~HostBufferPool();
  HostBufferPool(const HostBufferPool&) = delete;
  HostBufferPool& operator=(const HostBufferPool&) = delete;

  // An uninitialised contiguous CPU tensor shaped like `like` (sizes, dtype), page-locked when
  // `pinned` (a CUDA build with a device present).
  at::Tensor take(const at::Tensor& like, bool pinned);
  // Bytes of free buffers held, and of buffers handed out and not yet returned.
  size_t free_bytes() const;
  size_t used_bytes() const;

 private:
  HostBufferPool() = default;
  struct Block {
    void* ptr = nullptr;
    size_t bytes = 0;
    bool pinned = false;
    uint64_t age = 0;  // when it was returned, for eviction
  };
  void give_back(Block b);
  static Block allocate(size_t bytes, bool pinned);
  static void release(const Block& b);

  mutable std::mutex mu_;
  std::multimap<std::pair<size_t, bool>, Block> free_;  // by (bytes, pinned)
  size_t free_bytes_ = 0, used_bytes_ = 0, largest_ = 0;
  uint64_t clock_ = 0;
};

}  // namespace kiln
