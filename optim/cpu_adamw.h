// optim/cpu_adamw.h -- AdamW over a flat fp32 buffer on the CPU, for ZeRO's optimizer offload.
//
// ZeRO-Offload (Ren et al., 2021) keeps each rank's fp32 master parameters and Adam moments in
// host memory and updates them there. The update is memory-bound: it reads p, g, m, v and writes
// p, m, v, 28 bytes a parameter, so it is one vectorised pass over the four arrays, split over
// LibTorch's intra-op thread pool (at::parallel_for), taking raw pointers so that a caller's
// segments of flat buffers need no tensors.
//
// One update of element i at step t (from 1), with lr, b1, b2, eps, wd from CpuAdamWStep:
//   p = p (1 - lr wd)                        decoupled decay, skipped when wd == 0
//   m = lerp(m, g, 1 - b1)                   = m + (1 - b1)(g - m)     (torch's exp_avg.lerp_)
//   v = b2 v + (1 - b2) g^2
//   denom = sqrt(v) / sqrt(1 - b2^t) + eps
//   p = p - (lr / (1 - b1^t)) m / denom
// in fp32, as LibTorch's at::_fused_adamw_ CPU kernel computes it (FusedAdamKernel.cpp,
// ADAM_MODE::ADAMW) operation for operation: the scalars formed in double and rounded to float
// once, then the same fp32 operations in the same order (optim/cpu_adamw_kernel.h). Over
// LibTorch's vector loop the two agree bit for bit at the same instruction-set level; its scalar
// loop over the last n % Vec::size() elements rounds in another order (a few ulps apart; see
// tests/test_cpu_adamw.cpp). Here every element, the last partial vector included, runs the same
// vector code, so an element's result does not depend on how the buffer is cut: over threads, or
// into separate calls (ZeRO's shards at any world size give the same bits).
//
// Instruction set: the loop is compiled for AVX2+FMA+F16C (optim/cpu_adamw_avx2.cpp, x86-64 only) and
// for the build's baseline. The AVX2 one runs where the CPU has both and LibTorch's own level
// (at::get_cpu_capability(), which ATEN_CPU_CAPABILITY lowers) is AVX2 or AVX512, else the
// baseline one; each matches LibTorch's kernel of that level.
//
// Threads: at::get_num_threads() of them; a call from inside a parallel region (another
// at::parallel_for) runs on the calling thread alone.
//
// One pass for an offloaded step (parallel/zero.h): the gradient's factor (clipping and the loss
// scale's division) and the 16-bit working copy ride along, so the host reads g once and writes
// the working weights in the same sweep:
//   g = g * grad_scale                       (fp32, the factor rounded to float once: exactly what
//                                             at::Tensor::mul_(double) did to the gradient before)
//   out16 = round16(p)                       (at::vec::convert of each block of p just written, in
//                                             L1: the conversion copy_ to bf16 / fp16 runs)
// 32 bytes an element (p, m, v read and written, g read, 2 written) instead of 42 over the three
// passes (mul_, the update, the copy): 1.5x faster measured (docs/benchmarks.md).
#pragma once

#include <cstdint>

namespace kiln {

struct CpuAdamWStep {
  double lr = 0.0;            // learning rate of this update
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;  // moment decays; eps added to sqrt(v_hat)
  double weight_decay = 0.0;  // decoupled, this segment's value (0 for the no-decay group)
  int64_t step = 1;           // t, from 1 (already advanced for this update)
  double grad_scale = 1.0;    // g is read as g * float(grad_scale); 1: as it is
};

// The working copy cpu_adamw may write beside the fp32 parameters.
enum class CpuWorking { none, bf16, fp16 };

// One AdamW update of n fp32 elements in place: p, m (exp_avg), v (exp_avg_sq) read and
// written, g read. Multi-threaded over LibTorch's intra-op pool (at::parallel_for) and vectorised.
// The four arrays must not overlap; no alignment is needed. Throws std::invalid_argument for
// n < 0 or step < 1.
void cpu_adamw(float* p, const float* g, float* m, float* v, int64_t n, const CpuAdamWStep& s);
// The same, and round16(p) written to out16 (n 2-byte elements of the `working` kind; none: not
// written, out16 may be null).
void cpu_adamw(float* p, const float* g, float* m, float* v, int64_t n, const CpuAdamWStep& s, void* out16,
               CpuWorking working);

}  // namespace kiln
