// distributed/wait_clock.cpp -- segments of wait time (wait_clock.h).
#include "distributed/wait_clock.h"

#include <utility>

namespace kiln {

int64_t WaitClock::segment() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_[next_] = std::move(open_);
  open_ = Segment{};
  return next_++;
}

void WaitClock::add_ms(double ms) {
  std::lock_guard<std::mutex> lock(mu_);
  open_.ms += ms;
}

void WaitClock::add_later(std::function<double()> elapsed) {
  std::lock_guard<std::mutex> lock(mu_);
  open_.later.push_back(std::move(elapsed));
}

double WaitClock::take(int64_t segment) {
  Segment s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = closed_.find(segment);
    if (it == closed_.end()) return 0.0;
    s = std::move(it->second);
    closed_.erase(it);
  }
  double ms = s.ms;
  for (const auto& f : s.later) ms += f();
  return ms;
}

}  // namespace kiln
