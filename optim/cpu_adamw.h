// optim/cpu_adamw.h -- AdamW over flat fp32 host buffers, for ZeRO's optimizer offload.
//
// One update of n elements, in place, with LibTorch's _fused_adamw_ arithmetic (optim/adamw.h):
//   p  = p (1 - lr wd)
//   m  = m + (1 - b1)(g - m)            v = b2 v + (1 - b2) g^2
//   p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// Multi-threaded over LibTorch's intra-op pool (at::parallel_for) and vectorised.
#pragma once

#include <cstdint>

namespace kiln {

struct CpuAdamWStep {
  double lr = 0.0;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.0;  // decoupled, this segment's value (0 for the no-decay group)
  int64_t step = 1;           // t, from 1 (already advanced for this update)
};

// p, m (exp_avg), v (exp_avg_sq) read and written; g read.
void cpu_adamw(float* p, const float* g, float* m, float* v, int64_t n, const CpuAdamWStep& s);

}  // namespace kiln
