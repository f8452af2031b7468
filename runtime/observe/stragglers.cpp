// runtime/observe/stragglers.cpp -- the step's slowest rank, and medians.
#include "runtime/observe/stragglers.h"

#include <algorithm>
#include <map>

#include "distributed/rank0_verdict.h"

namespace kiln {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double hi = v[mid];
  if (v.size() % 2 == 1) return hi;
  return (hi + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid))) / 2.0;
}

}  // namespace

std::vector<Straggler> find_stragglers(const std::vector<double>& median_ms, const std::vector<int>& stage, double factor) {
  std::map<int, std::vector<double>> by_stage;
  for (size_t r = 0; r < median_ms.size(); ++r) by_stage[stage[r]].push_back(median_ms[r]);
  std::vector<Straggler> out;
  for (size_t r = 0; r < median_ms.size(); ++r) {
    const std::vector<double>& peers = by_stage[stage[r]];
    if (peers.size() < 2) continue;
    const double m = median(peers);
    if (m > 0 && median_ms[r] > factor * m) out.push_back({static_cast<int>(r), stage[r], median_ms[r], m});
  }
  return out;
}

StragglerWatch::StragglerWatch(std::shared_ptr<Communicator> world, int pp_stage, double factor)
    : world_(std::move(world)), stage_(pp_stage), factor_(factor) {}

SlowestRank StragglerWatch::step(const std::vector<double>& all, double mine, bool timed) {
  if (timed) mine_.push_back(mine);
  SlowestRank s;
  for (size_t r = 0; r < all.size(); ++r)
    if (r == 0 || all[r] > s.compute_ms) s = {all[r], static_cast<int>(r)};
  return s;
}

std::vector<Straggler> StragglerWatch::finish() {
  const std::vector<double> all = all_gather_doubles(world_.get(), {median(mine_), static_cast<double>(stage_)});
  std::vector<double> medians;
  std::vector<int> stages;
  for (size_t i = 0; i + 1 < all.size(); i += 2) medians.push_back(all[i]), stages.push_back(static_cast<int>(all[i + 1]));
  return find_stragglers(medians, stages, factor_);
}

}  // namespace kiln
