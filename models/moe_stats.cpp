// models/moe_stats.cpp -- the step record's MoE figures from the summed rows.
#include "models/moe_stats.h"

#include <algorithm>
#include <limits>

namespace kiln {

MoEStepStats moe_step_stats(const double* rows, const GPTConfig& cfg, int copies, int64_t calls) {
  MoEStepStats s;
  const int64_t E = cfg.n_experts, L = cfg.n_moe_layers(), width = E + 3;  // models/moe.h: moe_stats_width
  const double c = static_cast<double>(copies), n = static_cast<double>(calls) * c;
  double routed_all = 0.0, admitted_all = 0.0;
  s.max_load = 0.0;
  s.min_load = std::numeric_limits<double>::infinity();
  for (int64_t l = 0; l < L; ++l) {
    const double* row = rows + l * width;
    double routed = 0.0, most = 0.0, least = std::numeric_limits<double>::infinity();
    for (int64_t e = 0; e < E; ++e) {
      routed += row[e] / c;
      most = std::max(most, row[e] / c);
      least = std::min(least, row[e] / c);
    }
    const double mean = routed / static_cast<double>(E);
    const double max_load = mean > 0 ? most / mean : 0.0, min_load = mean > 0 ? least / mean : 0.0;
    s.max_load_by_layer.push_back(max_load);
    s.max_load = std::max(s.max_load, max_load);
    s.min_load = std::min(s.min_load, min_load);
    routed_all += routed;
    admitted_all += row[E] / c;
    s.aux_loss += row[E + 1] / n / static_cast<double>(L);
    s.z_loss += row[E + 2] / n / static_cast<double>(L);
  }
  if (L == 0) s.min_load = 0.0;
  s.dropped_fraction = routed_all > 0 ? 1.0 - admitted_all / routed_all : 0.0;
  return s;
}

}  // namespace kiln
