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

}  // namespace kiln::kernels
