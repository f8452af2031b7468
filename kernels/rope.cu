// kernels/rope.cu -- rotary position embeddings in one kernel each way (math:
// kernels/rope_math.cuh; entry: kernels/rope.h).
//
// One thread per pair (x[i], x[i + h/2]) of a head at a position: reads the pair (through the
// strided view of the qkv product: no contiguous copy first) and the angle's cos and sin (from
// L2: the table rows of T positions), writes the turned pair contiguous, [B, H, T, h] as SDPA
// takes it. Bytes, n elements of e bytes: reads n e, writes n e. The composite path
// (kernels/rope.cpp): the negation, the cat, two products and their sum -- five elementwise
// passes over q and k, each reading and writing about n e -- forward and backward alike, and it
// keeps the gathered tables for backward where this keeps nothing but the tables themselves.
#include "kernels/rope_cuda.h"

#include "kernels/cuda_types.cuh"
#include "kernels/rope_math.cuh"

namespace kiln::kernels {

namespace {

template <typename T>
__global__ void rope_kernel(const T* __restrict__ x, int64_t B, int64_t H, int64_t T_, int64_t half, int64_t sb,
                            int64_t sh, int64_t st, const T* __restrict__ cos, const T* __restrict__ sin,
                            const int64_t* __restrict__ positions, T* __restrict__ y, float sign) {
  const int64_t pairs = B * H * T_ * half;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < pairs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = i % half;
    int64_t r = i / half;  // (b, hd, t) row
    const int64_t t = r % T_;
    r /= T_;
    const int64_t hd = r % H, b = r / H;
    const T* xr = x + b * sb + hd * sh + t * st;
    const int64_t p = positions ? positions[t] : t;
    const float c = static_cast<float>(cos[p * 2 * half + j]), s = sign * static_cast<float>(sin[p * 2 * half + j]);
    float y1, y2;
    rope_turn(static_cast<float>(xr[j]), static_cast<float>(xr[j + half]), c, s, y1, y2);
    T* yr = y + ((b * H + hd) * T_ + t) * 2 * half;
    yr[j] = T(y1);
    yr[j + half] = T(y2);
  }
}

}  // namespace

cudaError_t rope_cuda(DType t, const void* x, int64_t B, int64_t H, int64_t T, int64_t h, int64_t sb, int64_t sh,
                      int64_t st, const void* cos, const void* sin, const int64_t* positions, void* y, bool backward,
                      cudaStream_t stream) {
  const int64_t pairs = B * H * T * (h / 2);
  if (pairs == 0) return cudaSuccess;
  if (h % 2 != 0) return cudaErrorInvalidValue;
  const int64_t want = (pairs + 255) / 256;
  const unsigned blocks = static_cast<unsigned>(want < 65535 * 16 ? want : 65535 * 16);
  return dispatch_x(t, [&](auto z) {
    using E = decltype(z);
    rope_kernel<E><<<blocks, 256, 0, stream>>>(static_cast<const E*>(x), B, H, T, h / 2, sb, sh, st,
                                               static_cast<const E*>(cos), static_cast<const E*>(sin), positions,
                                               static_cast<E*>(y), backward ? -1.0f : 1.0f);
    return cudaGetLastError();
  });
}

}  // namespace kiln::kernels
