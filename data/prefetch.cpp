// data/prefetch.cpp -- one step ahead, on a worker thread (std::async).
#include "data/prefetch.h"

#include <ATen/ATen.h>

#include "distributed/host_memory.h"

namespace kiln {

BatchPrefetcher::BatchPrefetcher(const DataLoader& loader, int64_t grad_accum, bool pinned, int64_t last_step)
    : loader_(loader), grad_accum_(grad_accum), pinned_(pinned), last_step_(last_step) {}

BatchPrefetcher::~BatchPrefetcher() {
  if (ahead_.valid()) ahead_.wait();
}

std::vector<Batch> BatchPrefetcher::make(int64_t step) const {
  std::vector<Batch> out;
  const int64_t targets = loader_.masked() ? loader_.step_targets(step) : 0;  // once for the step, on this thread
  for (int64_t micro = 0; micro < grad_accum_; ++micro) {
    Batch b = loader_.get(step, micro);
    b.step_targets = targets;
    if (pinned_) {
      Batch p{pinned_empty_like(b.inputs), pinned_empty_like(b.targets), b.step_targets};
      p.inputs.copy_(b.inputs);
      p.targets.copy_(b.targets);
      b = std::move(p);
    }
    out.push_back(std::move(b));
  }
  return out;
}

std::vector<Batch> BatchPrefetcher::take(int64_t step) {
  std::vector<Batch> batches;
  if (ahead_.valid() && next_ == step) {
    batches = ahead_.get();  // rethrows the worker's exception
  } else {
    if (ahead_.valid()) ahead_.wait();  // a prefetch of another step: not needed
    ahead_ = {};
    batches = make(step);
  }
  next_ = -1;
  if (step + 1 < last_step_) {
    next_ = step + 1;
    ahead_ = std::async(std::launch::async, [this, s = step + 1] { return make(s); });
  }
  return batches;
}

}  // namespace kiln
