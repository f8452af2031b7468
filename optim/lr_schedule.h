// optim/lr_schedule.h -- linear warm-up, then cosine decay to a floor.
//
//   lr(s) = max_lr (s + 1) / warmup                                   s < warmup
//   lr(s) = min_lr + (max_lr - min_lr) (1 + cos(pi r)) / 2,
//           r = (s - warmup) / (total - warmup)                       warmup <= s < total
//   lr(s) = min_lr                                                    s >= total
// (nanoGPT's and llm.c's schedule; s counts optimizer steps from 0.)
#pragma once

#include <cstdint>

namespace kiln {

struct LRSchedule {
  double max_lr = 6e-4;  // peak learning rate
  double min_lr = 6e-5;  // floor reached at `total`
  int64_t warmup = 0;    // warm-up steps
  int64_t total = 1;     // step at which the cosine reaches min_lr
  double at(int64_t step) const;
};

}  // namespace kiln
