// runtime/host_memory.cpp -- exact-size pinned host buffers (cudaHostAlloc), pageable otherwise.
#include "runtime/host_memory.h"

#include <string>

#include <ATen/ATen.h>
#if defined(KILN_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

#include "runtime/error.h"

namespace kiln {

at::Tensor host_buffer(int64_t n, bool pinned) {
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(at::kCPU);
#if defined(KILN_WITH_CUDA)
  if (pinned && n > 0) {
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    void* ptr = nullptr;
    const cudaError_t rc = cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault);
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();  // clear the runtime's last error: the caller reports and stops
      throw Error("host memory: cudaHostAlloc of " + std::to_string(bytes) + " bytes failed (" +
                  cudaGetErrorString(rc) + "): not enough page-locked host memory for the offloaded state");
    }
    return at::from_blob(ptr, {n}, [](void* p) { cudaFreeHost(p); }, fp32);
  }
#endif
  (void)pinned;
  return at::empty({n}, fp32);
}

}  // namespace kiln
