// distributed/host_memory.cpp -- exact-size pinned host buffers (cudaHostAlloc), pageable otherwise,
// and the pool that reuses them.
#include "distributed/host_memory.h"

#include <cstdlib>
#include <string>

#include <ATen/ATen.h>
#if defined(KILN_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

#include "distributed/device_check.h"
#include "distributed/error.h"

namespace kiln {

namespace {

#if defined(KILN_WITH_CUDA)
void* pinned_alloc(size_t bytes) {
  void* ptr = nullptr;
  const cudaError_t rc = cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();  // clear the runtime's last error: the caller reports and stops
    throw Error("host memory: cudaHostAlloc of " + std::to_string(bytes) + " bytes failed (" +
                cudaGetErrorString(rc) + "): not enough page-locked host memory");
  }
  return ptr;
}
#endif

}  // namespace

at::Tensor host_buffer(int64_t n, bool pinned, at::ScalarType dtype) {
  const auto opts = at::TensorOptions().dtype(dtype).device(at::kCPU);
#if defined(KILN_WITH_CUDA)
  if (pinned && n > 0 && !device_check_enabled()) {
    void* ptr = pinned_alloc(static_cast<size_t>(n) * c10::elementSize(dtype));
    return at::from_blob(ptr, {n}, [](void* p) { cudaFreeHost(p); }, opts);
  }
#endif
  HostAllocationScope host(pinned);
  return at::empty({n}, opts);
}

bool pin_for(c10::Device device) { return device.is_cuda() || device_check_enabled(); }

at::Tensor pinned_empty_like(const at::Tensor& t) {
  if (device_check_enabled()) {
    HostAllocationScope host(/*pinned=*/true);
    return at::empty(t.sizes(), t.options().device(at::kCPU));
  }
  return at::empty_like(t, at::TensorOptions().pinned_memory(true));
}

HostBufferPool::~HostBufferPool() {
  for (auto& [key, b] : free_) release(b);
}

HostBufferPool::Block HostBufferPool::allocate(size_t bytes, bool pinned) {
  Block b;
  b.bytes = bytes;
  b.pinned = pinned;
  const size_t n = bytes == 0 ? 1 : bytes;
#if defined(KILN_WITH_CUDA)
  if (pinned && !device_check_enabled()) {
    b.ptr = pinned_alloc(n);
    return b;
  }
#endif
  b.pinned = false;
  b.ptr = std::aligned_alloc(64, (n + 63) / 64 * 64);
  if (b.ptr == nullptr) throw Error("host memory: cannot allocate " + std::to_string(bytes) + " bytes");
  return b;
}

void HostBufferPool::release(const Block& b) {
#if defined(KILN_WITH_CUDA)
  if (b.pinned) {
    cudaFreeHost(b.ptr);
    return;
  }
#endif
  std::free(b.ptr);
}

at::Tensor HostBufferPool::take(const at::Tensor& like, bool pinned) {
  const size_t bytes = static_cast<size_t>(like.numel()) * like.element_size();
  Block b;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find({bytes, pinned});
    if (it != free_.end()) {
      b = it->second;
      free_.erase(it);
      free_bytes_ -= bytes;
    }
  }
  if (b.ptr == nullptr) b = allocate(bytes, pinned);
  {
    std::lock_guard<std::mutex> lock(mu_);
    used_bytes_ += bytes;
    largest_ = std::max(largest_, bytes);
  }
  std::weak_ptr<HostBufferPool> pool = weak_from_this();
  auto back = [pool, b](void*) {
    if (auto p = pool.lock()) p->give_back(b);
    else release(b);
  };
  return at::from_blob(b.ptr, like.sizes(), back, at::TensorOptions().dtype(like.scalar_type()).device(at::kCPU));
}

void HostBufferPool::give_back(Block b) {
  std::lock_guard<std::mutex> lock(mu_);
  used_bytes_ -= b.bytes;
  b.age = ++clock_;
  free_.emplace(std::make_pair(b.bytes, b.pinned), b);
  free_bytes_ += b.bytes;
  const size_t cap = 2 * largest_ + (size_t{64} << 20);
  while (free_bytes_ > cap && !free_.empty()) {
    auto oldest = free_.begin();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->second.age < oldest->second.age) oldest = it;
    free_bytes_ -= oldest->second.bytes;
    release(oldest->second);
    free_.erase(oldest);
  }
}

size_t HostBufferPool::free_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_bytes_;
}

size_t HostBufferPool::used_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_bytes_;
}

}  // namespace kiln
