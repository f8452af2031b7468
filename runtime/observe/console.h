// runtime/observe/console.h -- what rank 0 prints while it trains: the step line, the eval line and the
// closing summary. The JSONL log is the record; these lines are for the person watching.
//
//   step    120/300 | loss 3.2141 | lr 9.51e-04 | norm 0.812 |    48.3 ms | 21.2K tok/s | 0.11 TFLOP/s/device
//          | mem 0.43 GB | 122.9K tok | 0:06 elapsed, ETA 0:09
//   eval       120 | val loss 3.3012 | ppl 27.15 | 0.4 s
//   kiln: done in 0:15: steps 1-300 (300 updates, 0 skipped), 307.2K tokens seen
//         loss 2.1044 (mean of the last 10: 2.1210); val loss 2.2006 (ppl 9.03)
//         20.9K tok/s, 0.11 TFLOP/s/device; peak memory 0.43 GB
//         last checkpoint ckpt/step_00000300
//
// ETA = the steps left x the mean time of the steps timed so far (the first step, which pays for
// allocation and kernel selection, is not timed; until a second step exists, its own time). Tokens seen count the whole run
// (the steps before a resume too: the data position, in sequences, times the sequence length).
// Perplexity = exp(val loss), the loss being the mean cross-entropy per token in nats.
// The start-up line's layout names each dimension as kiln plan does (plan/search.h's describe):
//   kiln: tiny, 1.2M parameters, fp32 on cpu, 8 rank(s) (dp 2 (ep 2) cp 2 tp 2 (sp) pp 1) on ...
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace kiln {

// 1234 -> "1234", 12345 -> "12.3K", 1.2e6 -> "1.20M", 3.4e9 -> "3.40G".
std::string human_count(double v);
// Seconds as h:mm:ss, or m:ss under an hour: 75 -> "1:15", 3725 -> "1:02:05".
std::string human_duration(double seconds);

struct StepLine {
  int64_t step = 0, steps = 0;  // the step just done (1-based), of --steps
  double loss = 0, lr = 0, norm = 0;
  double step_ms = 0, tokens_per_s = 0, tflops = 0, tflops_job = 0;
  bool several_devices = false;   // print the job's TFLOP/s too
  std::optional<double> mfu;      // fraction
  double mem_gb = 0;
  std::optional<double> loss_scale;  // fp16 only
  bool skipped = false;
  std::string skip_reason;        // "overflow" or "non-finite"
  int64_t tokens_seen = 0;
  double elapsed_s = 0;
  double eta_s = 0;
};
std::string format_step_line(const StepLine& s);

std::string format_eval_line(int64_t step, double val_loss, double seconds);

// The parallel layout as kiln plan names it: "dp D tp T pp P", with " (ep E)" after dp (carved
// out of it) and " cp C" after that when they are above 1, and " (sp)" after tp under --sp.
std::string format_layout(int dp, int ep, int cp, int tp, bool sp, int pp);

// The closing lines, from the run's JSONL summary record and the tokens the run saw.
std::string format_summary(const nlohmann::json& summary, int64_t tokens_seen);

}  // namespace kiln
