// runtime/trainer/spike_guard.cpp -- the running mean and deviation, the run of spiking steps.
#include "runtime/trainer/spike_guard.h"

#include <cmath>

namespace kiln {

SpikeGuard::SpikeGuard(double z, int64_t patience, int64_t window, int64_t min_history)
    : z_(z), patience_(patience), window_(window), min_history_(min_history) {}

SpikeGuard::Verdict SpikeGuard::observe(int64_t step, double loss) {
  Verdict v;
  if (!std::isfinite(loss)) return v;
  const double n = static_cast<double>(history_.size());
  if (static_cast<int64_t>(history_.size()) >= min_history_) {
    double sum = 0, sq = 0;
    for (const auto& [s, l] : history_) sum += l;
    v.mean = sum / n;
    for (const auto& [s, l] : history_) sq += (l - v.mean) * (l - v.mean);
    v.std = std::sqrt(sq / (n - 1));
    v.spiking = loss > v.mean + z_ * v.std;
  }
  if (v.spiking) {
    spike_.emplace_back(step, loss);
    v.roll_back = static_cast<int64_t>(spike_.size()) >= patience_;
    return v;
  }
  spike_.clear();
  history_.emplace_back(step, loss);
  while (static_cast<int64_t>(history_.size()) > window_) history_.pop_front();
  return v;
}

void SpikeGuard::rewind(int64_t step) {
  spike_.clear();
  while (!history_.empty() && history_.back().first > step) history_.pop_back();
}

}  // namespace kiln
