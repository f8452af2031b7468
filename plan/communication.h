// plan/communication.h -- plan/cost_model.h's section 4 within one layout: which link each
// group's collectives cross, every collective of a stage's step with its bytes and time, and the
// part of that time the compute does not hide. Internal to plan/ (make_plan uses it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/cluster.h"
#include "plan/cost_model.h"

namespace kiln::plan {

// The bus bandwidth and the name of the link each group's collectives cross.
struct Links {
  double dp_bw, tp_bw, pp_bw, cp_bw, ep_bw;
  std::string dp, tp, pp, cp, ep;
};

// Rank order is tp fastest, then cp, then dp, then pp (distributed/mesh.h); nodes hold consecutive
// ranks. The dp x cp gradient group spans what the dp group spans.
Links links_for(const Layout& l, const ClusterSpec& c);

std::vector<CommItem> stage_comm(const Plan& p, const StagePlan& st, const Links& k);

// Serial communication plus what the compute windows cannot hide (section 5).
double exposed_seconds(const std::vector<CommItem>& items, double t_f, double t_b, int64_t K);

}  // namespace kiln::plan
