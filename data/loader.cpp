// data/loader.cpp -- DataLoader: this rank's micro-batches, cut from the layout-independent stream.
#include "data/loader.h"

#include <stdexcept>
#include <string>

#include <ATen/ops/empty.h>

#include "distributed/error.h"

namespace kiln {

namespace {

// Runs before order_ is built, so a null dataset fails with a message instead of a crash.
int64_t samples_of(const std::shared_ptr<const TokenDataset>& data) {
  if (!data) throw std::invalid_argument("DataLoader: null dataset");
  return data->num_samples();
}

}  // namespace

DataLoader::DataLoader(std::shared_ptr<const TokenDataset> data, uint64_t seed, bool shuffle,
                       BatchLayout layout)
    : data_(std::move(data)), order_(samples_of(data_), seed, shuffle), layout_(layout) {
  if (layout_.micro_batch <= 0)
    throw ConfigError("micro-batch must be positive, got " + std::to_string(layout_.micro_batch));
  if (layout_.grad_accum <= 0)
    throw ConfigError("grad-accum must be positive, got " + std::to_string(layout_.grad_accum));
  if (layout_.dp_size <= 0)
    throw ConfigError("data-parallel size must be positive, got " +
                      std::to_string(layout_.dp_size));
  if (layout_.dp_rank < 0 || layout_.dp_rank >= layout_.dp_size)
    throw ConfigError("data-parallel rank " + std::to_string(layout_.dp_rank) + " outside [0, " +
                      std::to_string(layout_.dp_size) + ")");
}

int64_t DataLoader::position(int64_t step, int64_t micro, int64_t i) const {
  if (step < 0 || micro < 0 || micro >= layout_.grad_accum || i < 0 || i >= layout_.micro_batch)
    throw std::out_of_range("DataLoader::position: step " + std::to_string(step) + ", micro " +
                            std::to_string(micro) + ", sequence " + std::to_string(i) +
                            " outside the batch layout");
  if (step < resume_step_)
    throw std::out_of_range("DataLoader::position: step " + std::to_string(step) +
                            " is before the resume point " + std::to_string(resume_step_));
  const int64_t per_rank = layout_.micro_batch * layout_.grad_accum;
  return resume_samples_ + (step - resume_step_) * layout_.global_batch() + layout_.dp_rank * per_rank +
         micro * layout_.micro_batch + i;
}

Batch DataLoader::get(int64_t step, int64_t micro) const {
  const int64_t mb = layout_.micro_batch;
  const int64_t T = data_->seq_len();
  Batch batch{at::empty({mb, T}, at::kLong), at::empty({mb, T}, at::kLong)};
  int64_t* x = batch.inputs.data_ptr<int64_t>();
  int64_t* y = batch.targets.data_ptr<int64_t>();
  for (int64_t i = 0; i < mb; ++i)
    data_->sample(order_(position(step, micro, i)), x + i * T, y + i * T);
  return batch;
}

}  // namespace kiln
