// models/moe_stats.h -- a step's Mixture-of-Experts routing figures for the step record.
//
// Each MoE layer adds a row [c_1 .. c_E, a, L_aux, L_z] per training forward (models/moe.h): c_e
// the assignments its router sent to expert e (before capacity), a the assignments admitted, and
// the call's two losses. The trainer sums the rows over the step's micro-batches and the dp ranks
// (riding in the verdict's all-reduce; runtime/trainer/trainer_step.cpp), so for layer l
//   sum_e c_e = k x tokens of the step (global batch x T)        R_l = that sum
// and the step record's figures are
//   moe_aux_loss   mean over layers of L_aux, each the mean of its calls (1: balanced, E: all to one)
//   moe_z_loss     mean over layers of L_z, likewise
//   moe_dropped    1 - sum_l a_l / sum_l R_l: the fraction of assignments past capacity
//   moe_max_load   max over layers and experts of c_e / (R_l / E): the most chosen expert's load
//                  as a fraction of the mean (1: balanced, E: every token to one expert)
//   moe_min_load   min over layers and experts of the same (0: an expert no token chose)
// Loads are the router's choices, before capacity: what the balance loss acts on (the dropped
// fraction says what capacity then cut).
#pragma once

#include <cstdint>
#include <vector>

#include "models/gpt_config.h"

namespace kiln {

struct MoEStepStats {
  double aux_loss = 0.0, z_loss = 0.0, dropped_fraction = 0.0, max_load = 0.0, min_load = 0.0;
  std::vector<double> max_load_by_layer;  // each MoE layer's most chosen expert's load, in block order
};

// rows: the summed stats, n_moe_layers() rows of E + 3; copies: how many identical copies of each
// row the sum holds (tp ranks summed together); calls: the forwards each row sums per copy
// (grad-accum x dp).
MoEStepStats moe_step_stats(const double* rows, const GPTConfig& cfg, int copies, int64_t calls);

}  // namespace kiln
