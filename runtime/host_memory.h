// runtime/host_memory.h -- host buffers of exactly their size: page-locked where a GPU copies
// to or from them, pageable where only the CPU touches them.
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
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace kiln {

// A 1-D fp32 CPU tensor of n elements, uninitialised.
at::Tensor host_buffer(int64_t n, bool pinned);

}  // namespace kiln
