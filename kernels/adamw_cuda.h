// kernels/adamw_cuda.h -- launcher of the one-pass multi-tensor AdamW (kernels/adamw.cu);
// kernels/adamw.h is the entry.
#pragma once

#include <cstdint>

#include "kernels/cuda_launch.h"

namespace kiln::kernels {

// One tensor of the update: n contiguous elements each. param (the fp32 master), exp_avg and
// exp_avg_sq are fp32; grad is of the launch's grad type; working (nullptr: none) of its working
// type; step points at the tensor's fp32 step count on the device, already advanced.
struct AdamWTensor {
  float* param;
  const void* grad;
  float* exp_avg;
  float* exp_avg_sq;
  void* working;
  const float* step;
  int64_t n;
};

struct AdamWHyper {
  double lr, beta1, beta2, weight_decay, eps;
  const float* lr_on_device = nullptr;  // not null: the rate is read there (fp32, on the device; a CUDA graph's), lr ignored
};

// Updates `count` tensors (any count: launched in batches). grad_factor (nullptr: 1) multiplies
// every gradient as read; found_inf (nullptr: 0) == 1 leaves everything as it was. Both are fp32
// on the device. working_t: bf16 or f16 (ignored where every working pointer is nullptr).
cudaError_t adamw_cuda(DType grad_t, DType working_t, const AdamWTensor* tensors, int64_t count, const AdamWHyper& h,
                       const float* grad_factor, const float* found_inf, cudaStream_t stream);

}  // namespace kiln::kernels
