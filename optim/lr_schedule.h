// optim/lr_schedule.h -- the learning rate at each optimizer update: kiln's warm-up + cosine,
// and DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR with their exact arithmetic.
//
// u counts the updates applied before this one (skipped fp16 steps do not count), from 0.
// lr_max = max_lr, lr_min = min_lr, W = warmup, T = total, lr_0 = warmup_start_lr.
//
// cosine (kiln's default; nanoGPT's and llm.c's):
//   lr(u) = lr_max (u + 1) / W                                       u < W
//   lr(u) = lr_min + (lr_max - lr_min) (1 + cos(pi r)) / 2,
//           r = (u - W) / (T - W)                                    W <= u < T
//   lr(u) = lr_min                                                   u >= T
// constant: the same warm-up, then lr_max.
//
// DeepSpeed's schedules (deepspeed/runtime/lr_schedules.py, 0.19.8). DeepSpeed sets the lr of
// the schedule's position i = -1 when it builds the scheduler, and steps the scheduler after each
// applied optimizer step, so the update u runs with position i = u - 1. With W' = max(2, W) (as
// DeepSpeed clamps) and the warm-up fraction
//   g(i) = ln(i + 1) / ln(W')      (warmup_type "log", DeepSpeed's default)
//   g(i) = i / W'                  (warmup_type "linear")
// the schedules are, at position i:
//   warmup (WarmupLR):             i < 0: lr_0;  i < W': lr_0 + (lr_max - lr_0) g(i);  else lr_max
//   warmup-decay (WarmupDecayLR):  as warmup for i < W'; then
//                                  lr_0 + (lr_max - lr_0) max(0, (T - i) / max(1, T - W'))
//   warmup-cosine (WarmupCosineLR), with ratios r_0 = lr_0 / lr_max, c = lr_min / lr_max:
//                                  i < 0: 0 (DeepSpeed's lr before its first step, not r_0);
//                                  i < W': lr_max (r_0 + (1 - r_0) g(i));
//                                  else lr_max max(0, c + (1 - c) (1 + cos(pi p)) / 2),
//                                  p = min(1, (i - W' + 1) / max(1, T - W'))
// So a DeepSpeed run's first update has lr lr_0 (0 for WarmupCosineLR) and, with the log warm-up,
// its second one lr_0 too (ln 1 = 0): kiln reproduces that rather than "fix" it.
#pragma once

#include <cstdint>
#include <string>

namespace kiln {

enum class LRShape { Cosine, Constant, Warmup, WarmupDecay, WarmupCosine };

// --lr-schedule names: cosine | constant | warmup | warmup-decay | warmup-cosine. Throws ConfigError.
LRShape parse_lr_shape(const std::string& name);
std::string to_string(LRShape shape);

struct LRSchedule {
  double max_lr = 6e-4;  // peak learning rate
  double min_lr = 6e-5;  // floor (cosine, warmup-cosine); warmup-decay decays to warmup_start_lr
  int64_t warmup = 0;    // warm-up updates
  int64_t total = 1;     // update at which the decay ends
  LRShape shape = LRShape::Cosine;
  double warmup_start_lr = 0.0;  // DeepSpeed's warmup_min_lr (warmup, warmup-decay, warmup-cosine)
  bool log_warmup = false;       // DeepSpeed's warmup_type "log" (else "linear")
  double at(int64_t updates) const;
};

}  // namespace kiln
