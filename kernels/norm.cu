// kernels/norm.cu -- LayerNorm and RMSNorm in the activations' own dtype with fp32 statistics
// (the math: kernels/norm_math.cuh; the entry: kernels/norm.h).
//
// Why: CUDA's autocast runs layer_norm in fp32 (it is on autocast's fp32 list), so a bf16 model
// pays, per norm and step, a cast of x to fp32, the norm over 4-byte elements, and the cast of its
// output back to bf16 in the next product; backward the same again. These kernels read and write
// the 16-bit tensors and keep only the per-row mean and rstd (8 bytes a row) in fp32.
//
// Bytes moved, for rows x d elements of e bytes (2 for bf16):
//   forward   reads x three times (sum, squared deviations, output; the second and third mostly
//             from L1/L2: a warp owns a row) and writes y: 2 rows d e from DRAM, + 8 rows
//   backward  dx: reads x, dy twice (sums, then dx) and writes dx: 3 rows d e from DRAM;
//             dw / db: reads x and dy once more in a column reduction: 2 rows d e
//   The composite path under autocast: forward 2 casts (4 rows d (e + 4)) + the fp32 norm
//   (rows d 8); backward the same order again.
// With the residual add before the norm (kernels/norm.h's add_norm, the block's x + a then ln_2):
//   forward   reads x and the residual r, writes s = x + r and y: 4 rows d e (the composite: the
//             add's 3 and the norm's 2, 5 rows d e)
//   backward  reads s, dy and ds (s's gradient from the residual stream), writes dx + ds once:
//             4 rows d e (the composite: the norm's 3 and the gradient sum's 3, 6 rows d e)
// Layout: one warp per row (8 rows per 256-thread block), lanes striding the columns; dw / db
// by column tiles of 32 x 8 threads, each tile summing a fixed set of rows, then the R tiles of a
// column summed in order: the gradients are deterministic run to run, unlike atomics.
#include "kernels/norm_cuda.h"

#include <algorithm>

#include "kernels/cuda_types.cuh"
#include "kernels/norm_math.cuh"

namespace kiln::kernels {

namespace {

constexpr int kWarpsPerBlock = 8;

// res non-null: the norm is of s = x + res (kernels/norm_math.cuh's norm_input), written to sum
// (the residual stream's next value) first; the passes after recompute s from x and res (their
// reads mostly from L1/L2) rather than read back the warp's own global writes.
template <typename T, typename W>
__global__ void norm_forward_kernel(const T* __restrict__ x, const T* __restrict__ res, T* __restrict__ sum,
                                    const W* __restrict__ w, const W* __restrict__ b, T* __restrict__ y,
                                    float* __restrict__ mean_out, float* __restrict__ rstd_out, int64_t rows, int d,
                                    float eps, bool rms) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;  // the whole warp: a warp owns a row
  const T* xr = x + row * d;
  const T* rr = res != nullptr ? res + row * d : nullptr;
  if (rr != nullptr) {
    T* sr = sum + row * d;
    for (int j = lane; j < d; j += 32) sr[j] = residual_add(xr[j], rr[j]);
  }
  float mean = 0.0f;
  if (!rms) mean = warp_sum(norm_partial_sum(xr, rr, d, lane, 32)) / static_cast<float>(d);
  const float rstd = norm_rstd(warp_sum(norm_partial_sq(xr, rr, d, lane, 32, mean)), d, eps);
  T* yr = y + row * d;
  for (int j = lane; j < d; j += 32) yr[j] = norm_forward_element<T, W>(norm_input(xr, rr, j), mean, rstd, w, b, j);
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// dsum non-null: dx_j + dsum_j, added in fp32 before the one rounding (the add's backward).
template <typename T, typename W>
__global__ void norm_dx_kernel(const T* __restrict__ x, const T* __restrict__ dy, const T* __restrict__ dsum,
                               const W* __restrict__ w, const float* __restrict__ mean, const float* __restrict__ rstd,
                               T* __restrict__ dx, int64_t rows, int d, bool rms) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T* xr = x + row * d;
  const T* dyr = dy + row * d;
  const float m = mean[row], r = rstd[row];
  float sg, sgx;
  norm_partial_backward(xr, dyr, w, d, lane, 32, m, r, sg, sgx);
  const float mg = warp_sum(sg) / static_cast<float>(d), mgx = warp_sum(sgx) / static_cast<float>(d);
  T* dxr = dx + row * d;
  if (dsum != nullptr) {
    const T* dsr = dsum + row * d;
    for (int j = lane; j < d; j += 32)
      dxr[j] = add_norm_backward_element<T, W>(xr[j], dyr[j], dsr[j], w, j, m, r, mg, mgx, rms);
  } else {
    for (int j = lane; j < d; j += 32) dxr[j] = norm_backward_element<T, W>(xr[j], dyr[j], w, j, m, r, mg, mgx, rms);
  }
}

// Column partials: tile (blockIdx.x: 32 columns, blockIdx.y: one of R row sets). Thread (tx, ty)
// sums rows ty + 8 blockIdx.y + 8 R k for its column; the 8 ty sums are added in order.
template <typename T>
__global__ void norm_dweight_partial_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                                            const float* __restrict__ mean, const float* __restrict__ rstd,
                                            float* __restrict__ part_w, float* __restrict__ part_b, int64_t rows,
                                            int d) {
  __shared__ float sw[8][33], sb[8][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int col = blockIdx.x * 32 + tx;
  float aw = 0.0f, ab = 0.0f;
  if (col < d) {
    for (int64_t r = static_cast<int64_t>(blockIdx.y) * 8 + ty; r < rows; r += static_cast<int64_t>(gridDim.y) * 8) {
      const float g = static_cast<float>(dy[r * d + col]);
      aw += g * (static_cast<float>(x[r * d + col]) - mean[r]) * rstd[r];
      ab += g;
    }
  }
  sw[ty][tx] = aw;
  sb[ty][tx] = ab;
  __syncthreads();
  if (ty == 0 && col < d) {
    float w = 0.0f, b = 0.0f;
    for (int k = 0; k < 8; ++k) {
      w += sw[k][tx];
      b += sb[k][tx];
    }
    part_w[static_cast<int64_t>(blockIdx.y) * d + col] = w;
    if (part_b) part_b[static_cast<int64_t>(blockIdx.y) * d + col] = b;
  }
}

template <typename W>
__global__ void norm_dweight_final_kernel(const float* __restrict__ part_w, const float* __restrict__ part_b, int R,
                                          int d, W* __restrict__ dw, W* __restrict__ db) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= d) return;
  float w = 0.0f, b = 0.0f;
  for (int k = 0; k < R; ++k) {
    w += part_w[static_cast<int64_t>(k) * d + col];
    if (db) b += part_b[static_cast<int64_t>(k) * d + col];
  }
  if (dw) dw[col] = W(w);
  if (db) db[col] = W(b);
}

// Row sets of the column reduction: about 64 rows per thread's column, at most 256 sets. A
// function of rows alone, so the order of the sums (and the gradients' bits) never depend on
// the device.
int row_sets(int64_t rows) { return static_cast<int>(std::clamp<int64_t>((rows + 511) / 512, 1, 256)); }

}  // namespace

cudaError_t norm_forward_cuda(DType xt, DType wt, const void* x, const void* res, void* sum, const void* w, const void* b,
                              void* y, float* mean, float* rstd, int64_t rows, int d, float eps, bool rms,
                              cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  return dispatch_xw(xt, wt, [&](auto t, auto u) {
    using T = decltype(t);
    using W = decltype(u);
    norm_forward_kernel<T, W><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(res), static_cast<T*>(sum), static_cast<const W*>(w),
        static_cast<const W*>(b), static_cast<T*>(y), mean, rstd, rows, d, eps, rms);
    return cudaGetLastError();
  });
}

int64_t norm_backward_scratch_floats(int64_t rows, int d) { return 2 * static_cast<int64_t>(row_sets(rows)) * d; }

cudaError_t norm_backward_cuda(DType xt, DType wt, const void* x, const void* dy, const void* dsum, const void* w,
                               const float* mean, const float* rstd, void* dx, void* dw, void* db, float* scratch,
                               int64_t rows, int d, bool rms, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return dispatch_xw(xt, wt, [&](auto t, auto u) {
    using T = decltype(t);
    using W = decltype(u);
    if (dx) {
      const unsigned blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
      norm_dx_kernel<T, W><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(
          static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<const T*>(dsum), static_cast<const W*>(w), mean,
          rstd, static_cast<T*>(dx), rows, d, rms);
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    }
    if (dw || db) {
      const int R = row_sets(rows);
      float* part_w = scratch;
      float* part_b = db ? scratch + static_cast<int64_t>(R) * d : nullptr;
      const dim3 grid((d + 31) / 32, R), block(32, 8);
      norm_dweight_partial_kernel<T><<<grid, block, 0, stream>>>(static_cast<const T*>(x), static_cast<const T*>(dy),
                                                                 mean, rstd, part_w, part_b, rows, d);
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
      norm_dweight_final_kernel<W><<<(d + 255) / 256, 256, 0, stream>>>(part_w, part_b, R, d, static_cast<W*>(dw),
                                                                          static_cast<W*>(db));
    }
    return cudaGetLastError();
  });
}

}  // namespace kiln::kernels
