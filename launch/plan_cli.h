// launch/plan_cli.h -- `kiln plan`: flags, validation, and the run of one of its four modes.
//
//   kiln plan --model gpt2-1.5b --gpu h200 --gpus-per-node 1 --micro-batch 8    one layout
//   kiln plan --model gpt2-1.5b --gpu h100 --nodes 4 --search --global-batch 512  rank layouts
//   kiln plan --params 7e9 --gpu h100 --nodes 64 [--tokens 2e12]                 totals only
//   kiln plan --compare run.jsonl [--peak-tflops X --achieved Y]                  against a run
//   kiln plan --compare a.jsonl --compare b.jsonl [--json]      several runs: their reports in
//                                                               turn (JSON: an array, in order)
// A layout that does not fit is printed without a step time and exits kExitPlanDoesNotFit (6),
// naming the --search command for the same model, cluster and global batch.
// Every mode takes --json (one JSON document on stdout instead of the text). Bad input (an
// unknown flag, a value of the wrong type, a layout that does not divide the cluster or the
// model, flags that do not belong to the mode) is a ConfigError: one line, exit code 2.
// Torch-free, like the cost model (plan/).
#pragma once

#include <string>
#include <vector>

#include "plan/cost_model.h"
#include "plan/search.h"

namespace kiln {

struct PlanArgs {
  enum class Mode { Layout, Totals, Search, Compare };
  Mode mode = Mode::Layout;
  GPTConfig model;                 // the shape (Layout, Search)
  double params = 0;               // P for Totals (--params)
  plan::ClusterSpec cluster;
  bool peak_given = false;         // --peak-tflops was given (Compare: overrides the log's)
  plan::Layout layout;             // Layout mode
  plan::SearchSpace space;         // Search mode
  double tokens = 0;               // D; 0 = 20 P
  bool attention_flops = false;    // add 12 L d T per token to T = 6 P D
  std::string search_command;      // Layout mode: `kiln plan` with these flags less the layout's, --search at its global batch
  std::vector<std::string> compare_paths;            // Compare: the logs, in the order given (--compare A --compare B ...)
  std::vector<plan::ClusterSpec> compare_clusters;  // each log's cluster: --gpu, or its device's preset; the flags given
  bool json = false;
  bool help = false;
  std::string help_text;
};

// args: the arguments after "plan".
PlanArgs parse_plan_args(const std::vector<std::string>& args);

// The exit code of a layout that does not fit its devices' (or its nodes' host) memory: the plan
// is printed without a step time, and a line on stderr gives the --search command that finds one
// that fits (docs/plan.md; docs/operations.md's table of exit codes).
constexpr int kExitPlanDoesNotFit = 6;

// Runs the mode and writes its text or JSON to stdout. Returns the exit code: 0, or
// kExitPlanDoesNotFit.
int run_plan(const PlanArgs& args);

}  // namespace kiln
