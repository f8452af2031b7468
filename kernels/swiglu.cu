// kernels/swiglu.cu -- SwiGLU's silu(gate) * up in one kernel each way (math:
// kernels/swiglu_math.cuh; entry: kernels/swiglu.h).
//
// Bytes, rows x F outputs of e bytes: forward reads 2 rows F e, writes rows F e; backward reads
// 3 rows F e (gate, up, dy), writes 2 rows F e. The composite path: forward silu (reads and
// writes rows F e) then the product (reads 2, writes 1), and keeps silu's output for backward;
// its backward runs silu's backward and two products: about twice the traffic, and rows F e more
// memory held per layer until backward.
// One thread per output element (grid-stride); the column of an element picks its gate and up.
#include "kernels/swiglu_cuda.h"

#include "kernels/cuda_types.cuh"
#include "kernels/swiglu_math.cuh"

namespace kiln::kernels {

namespace {

template <typename T>
__global__ void swiglu_forward_kernel(const T* __restrict__ h, T* __restrict__ y, int64_t n, int64_t F) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / F, c = i - r * F;
    const T* hr = h + r * 2 * F;
    y[i] = T(swiglu_forward(static_cast<float>(hr[c]), static_cast<float>(hr[F + c])));
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(const T* __restrict__ h, const T* __restrict__ dy, T* __restrict__ dh, int64_t n,
                                       int64_t F) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / F, c = i - r * F;
    const T* hr = h + r * 2 * F;
    float da, db;
    swiglu_backward(static_cast<float>(hr[c]), static_cast<float>(hr[F + c]), static_cast<float>(dy[i]), da, db);
    dh[r * 2 * F + c] = T(da);
    dh[r * 2 * F + F + c] = T(db);
  }
}

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return static_cast<unsigned>(b < 65535 * 16 ? b : 65535 * 16);
}

}  // namespace

cudaError_t swiglu_forward_cuda(DType t, const void* h, void* y, int64_t rows, int64_t F, cudaStream_t stream) {
  const int64_t n = rows * F;
  if (n == 0) return cudaSuccess;
  return dispatch_x(t, [&](auto z) {
    using T = decltype(z);
    swiglu_forward_kernel<T><<<blocks_for(n), 256, 0, stream>>>(static_cast<const T*>(h), static_cast<T*>(y), n, F);
    return cudaGetLastError();
  });
}

cudaError_t swiglu_backward_cuda(DType t, const void* h, const void* dy, void* dh, int64_t rows, int64_t F,
                                 cudaStream_t stream) {
  const int64_t n = rows * F;
  if (n == 0) return cudaSuccess;
  return dispatch_x(t, [&](auto z) {
    using T = decltype(z);
    swiglu_backward_kernel<T><<<blocks_for(n), 256, 0, stream>>>(static_cast<const T*>(h), static_cast<const T*>(dy),
                                                                  static_cast<T*>(dh), n, F);
    return cudaGetLastError();
  });
}

}  // namespace kiln::kernels
