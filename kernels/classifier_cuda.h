// kernels/classifier_cuda.h -- launcher of the fused softmax cross-entropy over logit rows
// (kernels/classifier.cu); kernels/classifier.h is the entry.
// z [rows, ld_z] fp32 (its first `vocab` columns the real vocabulary), targets [rows] int64,
// loss_rows [rows] fp32 (-log p of each row's target), grad [rows, ld_g] of type gt or null:
// softmax - onehot in the first vocab columns, 0 in the next pad_cols (the padded vocabulary).
#pragma once

#include <cstdint>

#include "kernels/cuda_launch.h"

namespace kiln::kernels {

cudaError_t softmax_xent_cuda(const float* z, int64_t ld_z, const int64_t* targets, int64_t rows, int64_t vocab,
                              int64_t pad_cols, float* loss_rows, DType gt, void* grad, int64_t ld_g,
                              cudaStream_t stream);

// The vocabulary-parallel loss's two passes (kernels/classifier.cu). z [rows, ld_z] of type zt
// (the logits' own dtype), its first `cols` columns this rank's real vocabulary.
// Row stats: m[rows], s[rows] fp32, the online log-sum-exp's (max, sum of exp(z - max)); a row
// with no columns gives (-inf, 0).
cudaError_t softmax_row_stats_cuda(DType zt, const void* z, int64_t ld_z, int64_t rows, int64_t cols, float* m, float* s,
                                   cudaStream_t stream);
// Gradient: grad[rows, ld_g] of type zt = scale (exp(z - lse) - onehot(targets)) in the first
// cols columns, 0 in the next pad_cols. lse [rows] fp32; targets [rows] int64, this rank's column
// of each row's target (outside [0, cols): no one-hot here); scale: one fp32 on the device.
cudaError_t softmax_xent_grad_cuda(DType zt, const void* z, int64_t ld_z, int64_t rows, int64_t cols, int64_t pad_cols,
                                   const float* lse, const int64_t* targets, const float* scale, void* grad, int64_t ld_g,
                                   cudaStream_t stream);

}  // namespace kiln::kernels
