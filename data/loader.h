// data/loader.h -- the micro-batches each rank trains on, cut from one global batch.
//
// Global batch of a step = micro_batch x grad_accum x dp sequences, at stream positions
// [step * G, (step + 1) * G) with G = micro_batch * grad_accum * dp. Data-parallel rank r takes
// the contiguous slice [r * G/dp, (r + 1) * G/dp) and cuts it into grad_accum micro-batches in
// order. Every layout with the same G therefore trains on the same sequences at every step.
#pragma once

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

#include "data/sample_order.h"
#include "data/token_dataset.h"

namespace kiln {

struct BatchLayout {
  int64_t micro_batch = 1;  // sequences per micro-batch per rank
  int64_t grad_accum = 1;   // micro-batches per optimizer step per rank
  int64_t dp_size = 1;      // data-parallel ranks
  int64_t dp_rank = 0;      // this rank's index in [0, dp_size)
  int64_t global_batch() const { return micro_batch * grad_accum * dp_size; }
};

struct Batch {
  at::Tensor inputs;   // [micro_batch, T] int64, on the CPU
  at::Tensor targets;  // [micro_batch, T] int64, on the CPU
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const TokenDataset> data, uint64_t seed, bool shuffle,
             BatchLayout layout);

  // Micro-batch `micro` (0 <= micro < grad_accum) of optimizer step `step` for this rank.
  Batch get(int64_t step, int64_t micro) const;
  // The stream position of sequence i of that micro-batch.
  int64_t position(int64_t step, int64_t micro, int64_t i) const;
  const BatchLayout& layout() const { return layout_; }

 private:
  std::shared_ptr<const TokenDataset> data_;
  SampleOrder order_;
  BatchLayout layout_;
};

}  // namespace kiln
