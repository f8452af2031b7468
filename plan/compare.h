// plan/compare.h -- `kiln plan --compare run.jsonl`: the cost model against a real run.
//
// Reads a `kiln train --log-json` file (the last `config` record and the `step` records after
// it; rank 0 wrote it, so the prediction is rank 0's: pipeline stage 0), rebuilds the run's
// model and layout from the config record (its pp_split too), evaluates the cost model on it and
// sets each prediction beside its measurement with the relative error (predicted - measured) /
// measured:
//   exact   parameters, FLOPs per token, tokens per step, with pp the blocks of every stage
//           (the record's pipeline.blocks), and rank 0's (stage 0's): ZeRO's padded count Psi',
//           model-state bytes by kind (device and host: params, grads, optimizer; when the log
//           reports them), --async-save's snapshot pool (host memory; the record's
//           snapshot_pool_bytes, 0 for a run that does not save in the background), comm_bytes
//           per step.
//           These are accounting, not estimates: they must be equal, for any dp x tp x pp.
//   model   peak memory (mem_gb, the allocator peak on a GPU or VmHWM on the CPU), step time
//           (median after step 1) and MFU (from that median: the job's model FLOP/s / (devices
//           x peak), devices being the config record's distinct devices, as the trainer logs
//           it); the latter two need a peak FLOP/s (the log's, or --peak-tflops) and use --achieved.
// It also reports the achieved fraction the run implies, to calibrate --achieved with:
//   achieved = measured model FLOP/s x (F + F_recompute) / F / peak.
// The record's world.sp and world.cp (sequence and context parallelism) are read too; a log from
// before them means no sp and cp 1. So are its MoE fields (config.n_experts, top_k, moe_every,
// moe_capacity_factor, the loss coefficients; absent: a dense model), with the exact rows
// params_active (MoE only) and params_local (rank 0's GPT::num_params(), its stage's tp slices).
// Expert parallelism (config.ep, absent = 1): params_local and the model state hold the rank's
// E/ep experts (exact); comm_bytes becomes an estimate row, and its parts are checked apart from
// the step records' ep_comm_bytes (the ep group's traffic within comm_bytes):
//   comm_bytes - ep_comm_bytes    exact, every step (DDP dense over dp and experts over expert-dp,
//                                 the verdict, tp's collectives)
//   ep_comm_bytes >= counts+norm  a lower bound: the all-to-alls' counts (8 E per MoE layer and
//                                 forward) and the norm's 16 bytes, exact in themselves
//   ep rows mod (d x b)           exact, 0: what is left is whole rows, d elements of b = the
//                                 smaller of the rows' two dtypes' bytes, on every step
//   ep_comm_bytes: all-to-all rows  the rest (mean over steps) against the plan's balanced,
//                                 dropless estimate; the note gives it at the run's drop rate.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "plan/cost_model.h"

namespace kiln::plan {

struct CompareRow {
  std::string name;                  // "model_state.device.params", "comm_bytes", "step_s", ...
  std::string unit;                  // bytes | s | fraction | count | FLOP
  std::optional<double> predicted;
  std::optional<double> measured;
  bool exact = false;                // accounting: predicted must equal measured
  std::string note;                  // why a value is missing, or how it was measured
  bool lower_bound = false;          // accounting of a part: measured must be at least predicted (--ep's counts and norm)
  bool estimate = false;             // a figure that depends on what the run did (--ep's routing-dependent rows)

  std::optional<double> rel_error() const;
  bool mismatch() const {
    if (!predicted || !measured) return false;
    return (exact && *predicted != *measured) || (lower_bound && *measured < *predicted);
  }
};

struct CompareResult {
  std::string log_path;
  Plan plan;                         // the cost model on the run's own model and layout
  std::vector<CompareRow> rows;
  std::optional<double> calibrated_achieved;  // the achieved fraction the run implies
  int64_t steps = 0;                 // step records read
  bool timing = false;               // a peak FLOP/s was known: step time and MFU predicted
  bool exact_ok() const;             // every exact row with both values equal, every lower bound held
};

// cluster: a preset or flags for what the log does not say (link bandwidths, --achieved);
// its node shape is replaced by the run's world, its peak by the log's when peak_given is false.
// Throws ConfigError for a missing or malformed file, or one without a config record.
CompareResult compare_with_log(const std::string& path, ClusterSpec cluster, bool peak_given);

// The plan's activation bytes per rank (rank 0's: pipeline stage 0; every micro-batch it holds
// in flight; the figure the report prints as "activations") for the run a config record
// describes -- the record as kiln train writes it (its "config", "world", "device", "topology"),
// no step records needed. The trainer puts it in that record. Throws ConfigError when a field the
// layout needs is missing or the layout is one the plan refuses.
double predicted_activation_bytes(const nlohmann::json& config_record);

}  // namespace kiln::plan
