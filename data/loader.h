// data/loader.h -- the micro-batches each rank trains on, cut from one global batch.
//
// Global batch of a step = micro_batch x grad_accum x dp sequences, at stream positions
// [step * G, (step + 1) * G) with G = micro_batch * grad_accum * dp. Data-parallel rank r takes
// the contiguous slice [r * G/dp, (r + 1) * G/dp) and cuts it into grad_accum micro-batches in
// order. Every layout with the same G therefore trains on the same sequences at every step.
// A resumed run continues the stream where the checkpoint left it (resume_at).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

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
  at::Tensor targets;  // [micro_batch, T] int64, on the CPU; kIgnoreTarget where a mask says so
  // Masked data (TokenDataset::masked): the targets trained on in the whole global batch of the
  // step, every rank's micro-batches (the loss's denominator: models/gpt.h), counted once a step
  // by the prefetcher (DataLoader::step_targets). 0 otherwise.
  int64_t step_targets = 0;
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const TokenDataset> data, uint64_t seed, bool shuffle,
             BatchLayout layout);

  // Micro-batch `micro` (0 <= micro < grad_accum) of optimizer step `step` for this rank
  // (step_targets left 0: BatchPrefetcher counts them once for the step's micro-batches).
  Batch get(int64_t step, int64_t micro) const;
  // The targets trained on in step `step`'s global batch (every dp rank's sequences): counted from
  // the masks alone, so every rank knows it without a collective. G x T on unmasked data.
  int64_t step_targets(int64_t step) const;
  bool masked() const { return data_->masked(); }
  // The stream position of sequence i of that micro-batch.
  int64_t position(int64_t step, int64_t micro, int64_t i) const;
  // Resuming: `samples` sequences were consumed before step `step` (by a run whose global batch
  // may differ); step s >= step then starts at samples + (s - step) * G. Without it, samples =
  // step * G, the same thing when the global batch never changed.
  void resume_at(int64_t step, int64_t samples) {
    resume_step_ = step;
    resume_samples_ = samples;
  }
  // Sequences consumed by steps [0, step).
  int64_t samples_before(int64_t step) const {
    return resume_samples_ + (step - resume_step_) * layout_.global_batch();
  }
  // Windows of the stream never trained on: [start, end) stream positions, disjoint (a spike
  // rollback's, runtime/trainer/spike_guard.h). The stream's k-th consumed sequence is its k-th
  // position outside them: samples_before() counts consumed sequences, position() maps past the
  // windows, so a run that skips a window is the run that never had it.
  void skip(std::vector<std::pair<int64_t, int64_t>> windows);
  const std::vector<std::pair<int64_t, int64_t>>& skipped() const { return skipped_; }
  int64_t past_skipped(int64_t consumed) const;  // the stream position of the consumed-th sequence
  // The stream positions of consumed sequences [begin, end): maximal runs, in order.
  std::vector<std::pair<int64_t, int64_t>> stream_ranges(int64_t begin, int64_t end) const;
  // The windows so far and `more`, with touching windows joined (what skip() is then given).
  std::vector<std::pair<int64_t, int64_t>> with_skipped(std::vector<std::pair<int64_t, int64_t>> more) const;
  const BatchLayout& layout() const { return layout_; }

 private:
  std::shared_ptr<const TokenDataset> data_;
  SampleOrder order_;
  BatchLayout layout_;
  int64_t resume_step_ = 0, resume_samples_ = 0;
  std::vector<std::pair<int64_t, int64_t>> skipped_;  // sorted by start
  // Test-only (tests/cli/guards.sh): KILN_TEST_GARBAGE_SAMPLES=A:B turns stream positions [A, B)
  // into uniformly random tokens, a batch gone to garbage.
  int64_t garbage_start_ = -1, garbage_end_ = -1;
};

}  // namespace kiln
