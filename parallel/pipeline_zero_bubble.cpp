// parallel/pipeline_zero_bubble.cpp -- ZB-H1 from 1F1B's actions (parallel/pipeline_zero_bubble.h).
#include "parallel/pipeline_zero_bubble.h"

#include <algorithm>
#include <deque>
#include <stdexcept>
#include <string>

namespace kiln {

std::vector<PipeAction> zb_h1(int pp, int stage, int micros) {
  const std::vector<PipeAction> base = one_f_one_b(pp, stage, micros);  // checks the arguments
  if (stage == 0) return base;  // the fused backward: no input gradient to send
  using Type = PipeAction::Type;
  std::vector<PipeAction> out;
  std::deque<int> deferred;  // micro-batches whose W is still to run, oldest first
  int inputs = 0;            // I's so far
  bool due = false;          // the last I brings a W with it (the first `stage` do not)
  auto weight = [&] {
    out.push_back({Type::BackwardWeight, deferred.front(), {}});
    deferred.pop_front();
    due = false;
  };
  for (const PipeAction& a : base) {
    if (a.type == Type::Backward) {
      out.push_back({Type::BackwardInput, a.micro, {}});
      deferred.push_back(a.micro);
      due = ++inputs > stage;
      continue;
    }
    if (a.type == Type::Exchange && due) {
      // The Exchange sending the I's gradient: in the steady phase it also takes the next
      // forward's input (the W goes before it), in the cool-down it does not (the W goes after).
      const bool steady = a.transfers.size() > 1;
      if (steady) weight();
      out.push_back(a);
      if (!steady) weight();
      continue;
    }
    out.push_back(a);
  }
  while (!deferred.empty()) weight();
  return out;
}

std::string zb_h1_rule(int pp, int chunks, int zero, bool full_recompute) {
  if (pp < 2) return "--pp-schedule zb-h1 schedules pipeline stages: it needs --pp 2 or more";
  if (chunks > 1) return "--pp-schedule zb-h1 runs one chunk a stage: leave --pp-virtual out (or use --pp-schedule interleaved)";
  if (zero == 3) {
    return "--pp-schedule zb-h1 with --zero 3 is not built (a weight pass runs long after its input pass, and ZeRO-3 "
           "frees a unit after each use): use --zero 1 or 2, or --pp-schedule 1f1b";
  }
  if (full_recompute) {
    return "--pp-schedule zb-h1 with --activation-checkpointing full is not built (the recomputation accumulates a "
           "block's weight gradients inside the input pass): use selective, or --pp-schedule 1f1b";
  }
  return "";
}

double zb_h1_idle(int pp, int micros, double t_f, double t_i, double t_w) {
  if (pp < 1 || micros < 1 || !(t_w >= 0) || !(t_w <= t_f) || !(t_w <= t_i)) {
    throw std::invalid_argument("zb_h1_idle: need pp >= 1, micros >= 1 and 0 <= t_w <= min(t_f, t_i) (got pp " +
                                std::to_string(pp) + ", micros " + std::to_string(micros) + ", t_f " + std::to_string(t_f) +
                                ", t_i " + std::to_string(t_i) + ", t_w " + std::to_string(t_w) + ")");
  }
  return (pp - 1) * (t_f + t_i - t_w) + std::max(0, pp - micros) * t_w;
}

double zb_h1_bubble_fraction(int pp, int micros) {
  if (pp < 1 || micros < 1) {
    throw std::invalid_argument("zb_h1_bubble_fraction: need pp >= 1 and micros >= 1 (got pp " + std::to_string(pp) +
                                ", micros " + std::to_string(micros) + ")");
  }
  const double idle = zb_h1_idle(pp, micros, 1, 1, 1);  // in units of one pass
  return idle / (3.0 * micros + idle);
}

}  // namespace kiln
