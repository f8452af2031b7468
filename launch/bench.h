// launch/bench.h -- `kiln bench`: throughput, MFU, memory, the time split and energy of a
// training configuration, measured on synthetic data.
//
// A bench run is a `kiln train` run (any model, layout and precision flags) of warmup +
// measure steps on the built-in synthetic corpus, without checkpoints or evaluation. Over the
// measured steps only:
//   tokens/s      = sum(tokens) / sum(step time)                 (the job's: the global batch)
//   TFLOP/s job   = tokens/s x FLOPs per token / 1e12            (docs/metrics.md)
//   TFLOP/s       = TFLOP/s job / G, per device; G = the job's distinct devices (the config
//                   record's devices, distributed/job_devices.h: ranks on one GPU count it once)
//   MFU           = TFLOP/s job / (G x device peak)
//   peak memory   = the run's own peak (reset when it starts)
//   time split    = forward, backward, exposed communication, optimizer: means per step, from
//                   CUDA events (runtime/observe/phase_timer.h)
//   energy        = NVML's energy counters over the measured steps, summed over the G devices
//                   (runtime/observe/energy.h): watts = J / s, J per token, model TFLOP/s per watt
// --sweep tries micro-batch sizes 1, 2, 4, ... up to --max-micro-batch under each activation-
// checkpointing mode (none, selective, full), stops a mode at its first out-of-memory, and
// picks the configuration with the most tokens/s. The global batch changes with the micro-
// batch; the sweep measures speed, not a training recipe. It runs in a world of one: an
// out-of-memory failure on one rank of several would leave the others in a collective.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "distributed/env.h"
#include "runtime/trainer/train_config.h"

namespace kiln {

struct BenchConfig {
  int64_t warmup = 3;            // steps run and not measured (allocation, kernel selection)
  int64_t measure = 10;          // steps measured
  bool sweep = false;            // micro-batch x activation-checkpointing search
  int64_t max_micro_batch = 64;  // largest micro-batch the sweep tries
  std::string json_path;         // write the report here (rank 0); empty: no file
  TrainConfig train;             // everything else, as `kiln train` takes it
};

struct BenchArgs {
  BenchConfig config;
  bool help = false;
  std::string help_text;
};

// args: the arguments after "bench": the bench flags above, and any `kiln train` flag.
BenchArgs parse_bench_args(const std::vector<std::string>& args);

// Runs the benchmark (every rank takes part); rank 0 prints the table and writes the JSON.
// Returns the report: {"runs": [...], "best": {...}} (on rank 0; empty elsewhere).
nlohmann::json run_bench(const BenchConfig& cfg, const ProcessInfo& proc);

}  // namespace kiln
