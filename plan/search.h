// plan/search.h -- `kiln plan --search`: every layout of a cluster, the ones that fit, ranked.
//
// Enumerated, for a fixed global batch G (sequences per optimizer step) on all the cluster's
// devices: dp x cp x tp x pp = devices (tp, pp and cp over the divisors that the model admits; cp
// where 2 cp divides the sequence), sequence parallelism on and off wherever tp > 1 (and cp = 1,
// as kiln builds it), for an MoE model expert parallelism ep over the divisors of dp that divide
// the experts (kiln builds it with ZeRO-0 and one pipeline stage), ZeRO stage
// 0-3, offload none / optimizer (stages 1-3) / all (stage 3), activation checkpointing none /
// selective / full, micro-batch b over the divisors of G / dp (K = G / (dp b)), and the ZeRO-2/3
// accumulation policy (reduce / local) where K > 1. Each candidate is evaluated by the cost model
// (plan/cost_model.h); those whose device peak exceeds the device memory, or whose host-side
// model state exceeds the host memory, are dropped. The rest are ranked by predicted step time
// (to the microsecond: closer is a tie). Ties (communication fully hidden, say) are broken, in
// order, by what the model does not see: the larger micro-batch (GEMM efficiency), at least 10%
// of device memory left free, the simpler setting (lower ZeRO stage, no offload, no
// recomputation, no cp, no ep, no sp, reduce before local: fewer collectives and copies, whose
// latency is not modelled), then the smaller device peak.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/cost_model.h"

namespace kiln::plan {

struct SearchSpace {
  int64_t global_batch = 0;     // sequences per optimizer step (G); must be divisible by some dp
  int64_t max_micro_batch = 0;  // largest micro-batch tried (0: no limit)
  Layout base;                  // precision, attention kernel, dropout... of every candidate
  std::vector<int> zero_stages = {0, 1, 2, 3};
  std::vector<Recompute> recompute = {Recompute::None, Recompute::Selective, Recompute::Full};
  std::vector<Offload> offload = {Offload::None, Offload::Optimizer, Offload::All};
  int64_t top = 5;              // ranked layouts kept (and explained)
};

struct Ranked {
  Plan plan;
  std::string reason;           // why it ranks where it does (against the next one)
};

struct SearchResult {
  int64_t candidates = 0;       // layouts enumerated
  int64_t invalid = 0;          // refused by the layout rules (divisibility, combinations)
  int64_t over_device = 0;      // device peak > device memory
  int64_t over_host = 0;        // host-side state > host memory
  int64_t fitting = 0;          // ranked
  std::vector<Ranked> best;     // the top `top`, fastest first
};

// Throws ConfigError when the global batch is not usable or nothing fits (saying why).
SearchResult search(const GPTConfig& model, const ClusterSpec& cluster, const SearchSpace& space);

// True when a ranks before b (the order described above).
bool ranks_before(const Plan& a, const Plan& b);

// One line: step time made of compute / exposed comm / bubble, and what separates `a` from `next`.
std::string explain(const Plan& a, const Plan* next);

// "dp 8 tp 1 pp 1, ZeRO-1, offload none, AC none, mb 8 x 4"; "dp 2 cp 2 tp 2 pp 1, ...", "tp 2 (sp)",
// "dp 8 (ep 4) tp 1 pp 1, ..." (the ep groups carved out of dp)
std::string describe(const Layout& l);

}  // namespace kiln::plan
