// kernels/classifier.cu -- softmax cross-entropy and its gradient over fp32 logit rows in two
// reads and one write (llm.c's fused classifier; the entry and its use: kernels/classifier.h).
//
// One block per row (512 threads). Pass 1 reads the row's V logits once, keeping an online
// log-sum-exp per thread (kernels/softmax_math.cuh), merged over the block: lse. The row's loss is
// lse - z_t. Pass 2 reads the row again (from L2: a row of 50,304 fp32 is 197 KiB) and writes the
// gradient's row in its 16-bit dtype: exp(z_j - lse), expm1(z_t - lse) = p_t - 1 at the target
// (from fp32, as the composite path's scatter), 0 in the padding columns.
//
// Bytes per row of V logits (Vp padded), 16-bit gradient: reads 4 V (+ 4 V from L2), writes 2 Vp.
// The composite path (kernels/classifier.cpp): fill the padding (4 (Vp - V)), log-softmax (reads
// 4 Vp, writes 4 Vp), exp (reads 4 Vp, writes 2 Vp), and the gathers and scatters: 14 Vp against
// 6 Vp here, the logits' own write (4 Vp, by the product) aside.
// A target outside [0, V) makes the row's loss NaN (the step's non-finite guard names it).
//
// The vocabulary-parallel loss (tp: each rank holds V'/t columns of every row, in the logits'
// own dtype) splits the same two passes around the ranks' reductions (parallel/tensor_parallel.cpp):
//   pass 1 (softmax_row_stats_cuda): each row's local (m, s) by the online log-sum-exp over the
//          rank's real columns; the ranks then all-reduce M = max m and S = sum s exp(m - M)
//          and lse = M + log S
//   pass 2 (softmax_xent_grad_cuda, backward): dz_j = scale (exp(z_j - lse) - [j = t]) in the
//          logits' dtype, the one-hot only where the rank holds the target, 0 in padding columns.
// Bytes per row of c = V'/t columns of e bytes: forward reads c e; backward reads c e and writes
// c e; kept from forward to backward: the logits (c e) and lse (4). The composite path: the fp32
// copy of the logits (writes 4 c), the shifted logits and their exp (reads and writes 4 c each),
// the softmax kept in fp32 (4 c), and backward's one-hot, difference and cast (about 20 c).
#include "kernels/classifier_cuda.h"

#include "kernels/cuda_types.cuh"
#include "kernels/softmax_math.cuh"

namespace kiln::kernels {

namespace {

constexpr int kThreads = 512;

// The block's (m, s) over its threads' partial (m, s), in thread 0's hands (others: garbage).
__device__ void block_lse_merge(float& m, float& s) {
  __shared__ float sm[kThreads / 32], ss[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    online_lse_merge(m, s, m2, s2);
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  if (warp == 0) {
    m = lane < kThreads / 32 ? sm[lane] : -INFINITY;
    s = lane < kThreads / 32 ? ss[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
      online_lse_merge(m, s, m2, s2);
    }
  }
}

template <typename G>
__global__ void softmax_xent_kernel(const float* __restrict__ z, int64_t ld_z, const int64_t* __restrict__ targets,
                                    int64_t vocab, int64_t pad_cols, float* __restrict__ loss_rows, G* __restrict__ grad,
                                    int64_t ld_g) {
  __shared__ float lse_shared;
  const int64_t row = blockIdx.x;
  const float* zr = z + row * ld_z;
  float m = -INFINITY, s = 0.0f;
  for (int64_t j = threadIdx.x; j < vocab; j += kThreads) online_lse_add(m, s, zr[j]);
  block_lse_merge(m, s);
  if (threadIdx.x == 0) lse_shared = online_lse_value(m, s);
  __syncthreads();
  const float lse = lse_shared;
  const int64_t t = targets[row];
  const bool valid = t >= 0 && t < vocab;
  const float zt = valid ? zr[t] : NAN;
  if (threadIdx.x == 0) loss_rows[row] = lse - zt;
  if (grad) {
    G* gr = grad + row * ld_g;
    for (int64_t j = threadIdx.x; j < vocab; j += kThreads) gr[j] = G(j == t ? expm1f(zt - lse) : expf(zr[j] - lse));
    for (int64_t j = vocab + threadIdx.x; j < vocab + pad_cols; j += kThreads) gr[j] = G(0.0f);
  }
}

template <typename Z>
__global__ void softmax_row_stats_kernel(const Z* __restrict__ z, int64_t ld_z, int64_t cols, float* __restrict__ m_out,
                                         float* __restrict__ s_out) {
  const Z* zr = z + static_cast<int64_t>(blockIdx.x) * ld_z;
  float m = -INFINITY, s = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) online_lse_add(m, s, static_cast<float>(zr[j]));
  block_lse_merge(m, s);
  if (threadIdx.x == 0) {
    m_out[blockIdx.x] = m;
    s_out[blockIdx.x] = s;
  }
}

template <typename Z>
__global__ void softmax_xent_grad_kernel(const Z* __restrict__ z, int64_t ld_z, int64_t cols, int64_t pad_cols,
                                         const float* __restrict__ lse, const int64_t* __restrict__ targets,
                                         const float* __restrict__ scale, Z* __restrict__ grad, int64_t ld_g) {
  const int64_t row = blockIdx.x;
  const Z* zr = z + row * ld_z;
  Z* gr = grad + row * ld_g;
  const float l = lse[row], c = *scale;
  const int64_t t = targets[row];  // this rank's column of the target, or outside [0, cols)
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
    const float x = static_cast<float>(zr[j]) - l;
    gr[j] = Z(c * (j == t ? expm1f(x) : expf(x)));
  }
  for (int64_t j = cols + threadIdx.x; j < cols + pad_cols; j += kThreads) gr[j] = Z(0.0f);
}

}  // namespace

cudaError_t softmax_row_stats_cuda(DType zt, const void* z, int64_t ld_z, int64_t rows, int64_t cols, float* m, float* s,
                                   cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (rows > 0x7fffffffLL) return cudaErrorInvalidValue;
  return dispatch_x(zt, [&](auto zz) {
    using Z = decltype(zz);
    softmax_row_stats_kernel<Z><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(static_cast<const Z*>(z), ld_z, cols,
                                                                                       m, s);
    return cudaGetLastError();
  });
}

cudaError_t softmax_xent_grad_cuda(DType zt, const void* z, int64_t ld_z, int64_t rows, int64_t cols, int64_t pad_cols,
                                   const float* lse, const int64_t* targets, const float* scale, void* grad, int64_t ld_g,
                                   cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (rows > 0x7fffffffLL) return cudaErrorInvalidValue;
  return dispatch_x(zt, [&](auto zz) {
    using Z = decltype(zz);
    softmax_xent_grad_kernel<Z><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        static_cast<const Z*>(z), ld_z, cols, pad_cols, lse, targets, scale, static_cast<Z*>(grad), ld_g);
    return cudaGetLastError();
  });
}

cudaError_t softmax_xent_cuda(const float* z, int64_t ld_z, const int64_t* targets, int64_t rows, int64_t vocab,
                              int64_t pad_cols, float* loss_rows, DType gt, void* grad, int64_t ld_g,
                              cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (rows > 0x7fffffffLL) return cudaErrorInvalidValue;
  return dispatch_x(gt, [&](auto g) {
    using G = decltype(g);
    softmax_xent_kernel<G><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(z, ld_z, targets, vocab, pad_cols,
                                                                                  loss_rows, static_cast<G*>(grad), ld_g);
    return cudaGetLastError();
  });
}

}  // namespace kiln::kernels
