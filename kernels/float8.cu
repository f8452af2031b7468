// kernels/float8.cu -- the float8 quantisation in two passes over x (math: kernels/float8_math.cuh;
// entry: kernels/float8.cpp, whose composite ops are the reference).
//
// Bytes, n elements of e bytes: the amax pass reads n e, the cast pass reads n e and writes n
// (the scales are a scalar or a row of them). The composite path -- abs, max, to(fp32), divide,
// clamp, to(f8) -- reads and writes about 2 e + 4 + 4 + 4 + 4 + 1 bytes an element (33 for bf16
// against 5 here) and holds an fp32 copy of x. The amax's reduction over ranks (tp, cp, sp) runs
// between the passes on the amax tensor: nothing goes to the host.
//   amax over all: grid-stride, each thread's max, warp then block max on the bits, one atomicMax
//     a block into the zeroed scalar.
//   amax over each row: a block a row (the row's elements strided by the block's threads).
//   amax over each column: a thread a column, threads of a warp on adjacent columns (coalesced),
//     blockIdx.y taking a slab of rows; atomicMax into the column's word.
//   cast: grid-stride with one scale; a block a row with the row's scale or the columns'.
#include "kernels/float8_cuda.h"

#include <cuda_fp8.h>

#include "kernels/cuda_types.cuh"
#include "kernels/float8_math.cuh"

namespace kiln::kernels {

namespace {

__device__ __forceinline__ uint32_t warp_max_bits(uint32_t v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The block's max of v (blockDim.x a multiple of 32, at most 1024); valid in thread 0.
__device__ __forceinline__ uint32_t block_max_bits(uint32_t v) {
  __shared__ uint32_t warps[32];
  v = warp_max_bits(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warps[warp] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / 32 ? warps[threadIdx.x] : 0u;
  if (warp == 0) v = warp_max_bits(v);
  return v;
}

template <typename T>
__global__ void amax_all_kernel(const T* __restrict__ x, int64_t n, uint32_t* __restrict__ amax) {
  uint32_t m = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    m = max(m, abs_bits(static_cast<float>(x[i])));
  m = block_max_bits(m);
  if (threadIdx.x == 0) atomicMax(amax, m);
}

template <typename T>
__global__ void amax_rows_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, uint32_t* __restrict__ amax) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    uint32_t m = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = max(m, abs_bits(static_cast<float>(xr[c])));
    m = block_max_bits(m);
    if (threadIdx.x == 0) amax[r] = m;
    __syncthreads();  // the shared words are reused by the next row
  }
}

template <typename T>
__global__ void amax_cols_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t slab, uint32_t* __restrict__ amax) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  const int64_t r0 = blockIdx.y * slab, r1 = r0 + slab < rows ? r0 + slab : rows;
  uint32_t m = 0;
  for (int64_t r = r0; r < r1; ++r) m = max(m, abs_bits(static_cast<float>(x[r * cols + c])));
  atomicMax(amax + c, m);
}

template <typename T>
__global__ void cast_all_kernel(const T* __restrict__ x, int64_t n, const float* __restrict__ s, float fmax,
                                __nv_fp8_interpretation_t format, __nv_fp8_storage_t* __restrict__ q) {
  const float s0 = s[0];
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    q[i] = __nv_cvt_float_to_fp8(float8_prescaled(static_cast<float>(x[i]), s0, fmax), __NV_SATFINITE, format);
}

// A block a row at a time (no division an element): the row's scale, or each column's.
template <typename T, bool PerRow>
__global__ void cast_lines_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, const float* __restrict__ s, float fmax,
                                  __nv_fp8_interpretation_t format, __nv_fp8_storage_t* __restrict__ q) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    __nv_fp8_storage_t* qr = q + r * cols;
    const float sr = PerRow ? s[r] : 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      qr[c] = __nv_cvt_float_to_fp8(float8_prescaled(static_cast<float>(xr[c]), PerRow ? sr : s[c], fmax), __NV_SATFINITE, format);
  }
}

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return static_cast<unsigned>(b < 65535 * 16 ? b : 65535 * 16);
}

}  // namespace

cudaError_t float8_amax_cuda(DType t, const void* x, int64_t rows, int64_t cols, Along along, float* amax, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  auto* bits = reinterpret_cast<uint32_t*>(amax);  // the zeroed floats' bits: 0 is +0.0f
  return dispatch_x(t, [&](auto z) {
    using T = decltype(z);
    const T* xt = static_cast<const T*>(x);
    if (along == Along::all) {
      amax_all_kernel<T><<<blocks_for(n) < 1024 ? blocks_for(n) : 1024, 256, 0, stream>>>(xt, n, bits);
    } else if (along == Along::rows) {
      amax_rows_kernel<T><<<static_cast<unsigned>(rows < 65535 ? rows : 65535), 256, 0, stream>>>(xt, rows, cols, bits);
    } else {
      const int64_t slab = rows > 256 * 65535 ? (rows + 65534) / 65535 : 256;  // rows a block reads down its columns (grid.y <= 65535)
      const dim3 grid(static_cast<unsigned>((cols + 255) / 256), static_cast<unsigned>((rows + slab - 1) / slab));
      amax_cols_kernel<T><<<grid, 256, 0, stream>>>(xt, rows, cols, slab, bits);
    }
    return cudaGetLastError();
  });
}

cudaError_t float8_cast_cuda(DType t, const void* x, int64_t rows, int64_t cols, Along along, const float* s,
                             Float8Format format, void* q, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  const float fmax = format == Float8Format::e4m3 ? 448.0f : 57344.0f;
  const __nv_fp8_interpretation_t f = format == Float8Format::e4m3 ? __NV_E4M3 : __NV_E5M2;
  return dispatch_x(t, [&](auto z) {
    using T = decltype(z);
    const T* xt = static_cast<const T*>(x);
    auto* qt = static_cast<__nv_fp8_storage_t*>(q);
    const unsigned lines = static_cast<unsigned>(rows < 65535 * 16 ? rows : 65535 * 16);
    if (along == Along::all) {
      cast_all_kernel<T><<<blocks_for(n), 256, 0, stream>>>(xt, n, s, fmax, f, qt);
    } else if (along == Along::rows) {
      cast_lines_kernel<T, true><<<lines, 256, 0, stream>>>(xt, rows, cols, s, fmax, f, qt);
    } else {
      cast_lines_kernel<T, false><<<lines, 256, 0, stream>>>(xt, rows, cols, s, fmax, f, qt);
    }
    return cudaGetLastError();
  });
}

}  // namespace kiln::kernels
