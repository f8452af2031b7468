// optim/lr_schedule.cpp -- the warm-up + cosine schedule.
#include "optim/lr_schedule.h"

#include <cmath>

namespace kiln {

double LRSchedule::at(int64_t step) const {
  if (step < warmup) return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (step >= total) return min_lr;
  const double r = static_cast<double>(step - warmup) / static_cast<double>(total - warmup);
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * r)) * (max_lr - min_lr);
}

}  // namespace kiln
