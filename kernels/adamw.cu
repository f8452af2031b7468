// kernels/adamw.cu -- AdamW's whole step in one pass over many tensors (math:
// kernels/adamw_math.cuh; entry: kernels/adamw.h).
//
// Per parameter element, with fp32 gradients and bf16 / fp16 working weights: reads p, g, m, v
// (16 bytes), writes p, m, v and the 16-bit working copy (14): 30 bytes. The composite path
// reads and writes the gradient to clip it (_foreach_mul_, 8 bytes), runs LibTorch's fused AdamW
// (28), then copies the masters into the working weights (_foreach_copy_, 6): 42 bytes and three
// multi-tensor launches. The clip factor and found_inf are read on the device (no host sync).
//
// Multi-tensor: a launch carries up to kBatch tensors' pointers in its arguments (under the 4 KB
// every CUDA driver takes); block b works on chunk b of the batch's chunks (kChunk elements each),
// its tensor found by the running chunk counts. Launches in turn for longer lists.
#include "kernels/adamw_cuda.h"

#include "kernels/adamw_math.cuh"
#include "kernels/cuda_types.cuh"

namespace kiln::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 16 * kThreads;  // elements a block updates
constexpr int kBatch = 56;

struct AdamWBatch {
  AdamWTensor t[kBatch];
  int64_t first_chunk[kBatch + 1];  // first_chunk[i]: the batch's chunks before tensor i
  int count;
};
static_assert(sizeof(AdamWBatch) + 64 <= 4096, "the launch's arguments must stay within 4 KB");

template <typename G, typename W>
__global__ void __launch_bounds__(kThreads)
    adamw_kernel(const AdamWBatch b, float lr, const float* __restrict__ lr_on_device, float beta1, float beta2,
                 float weight_decay, float eps, const float* __restrict__ grad_factor, const float* __restrict__ found_inf) {
  if (found_inf != nullptr && *found_inf == 1.0f) return;  // the step is skipped: nothing moves
  if (lr_on_device != nullptr) lr = *lr_on_device;  // a CUDA graph's rate, filled in before each replay
  int i = 0;
  while (i + 1 < b.count && b.first_chunk[i + 1] <= static_cast<int64_t>(blockIdx.x)) ++i;
  const AdamWTensor& t = b.t[i];
  const int64_t start = (static_cast<int64_t>(blockIdx.x) - b.first_chunk[i]) * kChunk;
  const int64_t end = start + kChunk < t.n ? start + kChunk : t.n;
  const AdamWScalars s = adamw_scalars(lr, beta1, beta2, weight_decay, eps, *t.step);
  const float c = grad_factor != nullptr ? *grad_factor : 1.0f;
  const G* __restrict__ grad = static_cast<const G*>(t.grad);
  W* __restrict__ working = static_cast<W*>(t.working);
  for (int64_t k = start + threadIdx.x; k < end; k += kThreads) {
    float p = t.param[k], m = t.exp_avg[k], v = t.exp_avg_sq[k];
    float g = static_cast<float>(grad[k]);
    if (grad_factor != nullptr) g = g * c;  // the reference's _foreach_mul_, rounded to fp32 here
    adamw_element(p, g, m, v, s);
    t.param[k] = p;
    t.exp_avg[k] = m;
    t.exp_avg_sq[k] = v;
    if (working != nullptr) working[k] = W(p);
  }
}

template <typename G, typename W>
cudaError_t launch_all(const AdamWTensor* tensors, int64_t count, const AdamWHyper& h, const float* grad_factor,
                       const float* found_inf, cudaStream_t stream) {
  for (int64_t first = 0; first < count; first += kBatch) {
    AdamWBatch b{};
    b.count = static_cast<int>(count - first < kBatch ? count - first : kBatch);
    b.first_chunk[0] = 0;
    for (int i = 0; i < b.count; ++i) {
      b.t[i] = tensors[first + i];
      b.first_chunk[i + 1] = b.first_chunk[i] + (b.t[i].n + kChunk - 1) / kChunk;
    }
    const int64_t blocks = b.first_chunk[b.count];
    if (blocks == 0) continue;
    if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
    adamw_kernel<G, W><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        b, static_cast<float>(h.lr), h.lr_on_device, static_cast<float>(h.beta1), static_cast<float>(h.beta2),
        static_cast<float>(h.weight_decay), static_cast<float>(h.eps), grad_factor, found_inf);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t adamw_cuda(DType grad_t, DType working_t, const AdamWTensor* tensors, int64_t count, const AdamWHyper& h,
                       const float* grad_factor, const float* found_inf, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  return dispatch_x(grad_t, [&](auto gz) {
    using G = decltype(gz);
    if (working_t == DType::f16) return launch_all<G, __half>(tensors, count, h, grad_factor, found_inf, stream);
    return launch_all<G, __nv_bfloat16>(tensors, count, h, grad_factor, found_inf, stream);
  });
}

}  // namespace kiln::kernels
