// optim/lr_schedule.cpp -- the schedules of optim/lr_schedule.h.
#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "distributed/error.h"

namespace kiln {

LRShape parse_lr_shape(const std::string& name) {
  if (name == "cosine") return LRShape::Cosine;
  if (name == "constant") return LRShape::Constant;
  if (name == "warmup") return LRShape::Warmup;
  if (name == "warmup-decay") return LRShape::WarmupDecay;
  if (name == "warmup-cosine") return LRShape::WarmupCosine;
  throw ConfigError("--lr-schedule must be one of cosine, constant, warmup, warmup-decay, warmup-cosine (got '" + name + "')");
}

std::string to_string(LRShape shape) {
  switch (shape) {
    case LRShape::Cosine: return "cosine";
    case LRShape::Constant: return "constant";
    case LRShape::Warmup: return "warmup";
    case LRShape::WarmupDecay: return "warmup-decay";
    case LRShape::WarmupCosine: return "warmup-cosine";
  }
  return "?";
}

namespace {

// DeepSpeed's schedules at position i (the update u = i + 1 runs with it).
double deepspeed_at(const LRSchedule& s, int64_t i) {
  const double w = static_cast<double>(std::max<int64_t>(2, s.warmup));
  const double pos = static_cast<double>(i);
  const auto gamma = [&] { return s.log_warmup ? std::log(pos + 1.0) / std::log(w) : pos / w; };
  const double total = static_cast<double>(s.total);
  if (s.shape == LRShape::WarmupCosine) {
    if (i < 0) return 0.0;
    const double r0 = s.warmup_start_lr / s.max_lr, c = s.min_lr / s.max_lr;
    if (pos < w) return s.max_lr * (r0 + gamma() * (1.0 - r0));
    const double p = std::min(1.0, (pos - w + 1.0) / std::max(1.0, total - w));
    return s.max_lr * std::max(0.0, c + (1.0 - c) * (1.0 + std::cos(M_PI * p)) / 2.0);
  }
  const double delta = s.max_lr - s.warmup_start_lr;
  if (i < 0) return s.warmup_start_lr;
  if (pos < w) return s.warmup_start_lr + delta * gamma();
  if (s.shape == LRShape::Warmup) return s.max_lr;
  return s.warmup_start_lr + delta * std::max(0.0, (total - pos) / std::max(1.0, total - w));
}

}  // namespace

double LRSchedule::at(int64_t updates) const {
  if (shape != LRShape::Cosine && shape != LRShape::Constant) return deepspeed_at(*this, updates - 1);
  if (updates < warmup) return max_lr * static_cast<double>(updates + 1) / static_cast<double>(warmup);
  if (shape == LRShape::Constant) return max_lr;
  if (updates >= total) return min_lr;
  const double r = static_cast<double>(updates - warmup) / static_cast<double>(total - warmup);
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * r)) * (max_lr - min_lr);
}

}  // namespace kiln
