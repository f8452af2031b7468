// runtime/observe/profiler.h -- `--profile FILE`: the PyTorch (Kineto) profiler over a window of steps.
//
// `kiln train --profile FILE` records steps [start, start + n) (--profile-start, default the
// invocation's third step, past the first steps' allocations and kernel selection;
// --profile-steps n, default 3), `kiln bench --profile FILE` its measured steps. Recorded: the
// operators on the host and, on CUDA, every kernel, copy and set on the device (CUPTI). Written:
// a Chrome trace (chrome://tracing, Perfetto) to FILE on rank 0 and FILE.rankR on the others.
// Rank 0 prints the window's top costs and logs them as a `profile` record:
//   device: for each kernel name, total time, calls, and share of the summed device time; and
//           busy = |union of the device intervals| / window wall time, the fraction of the
//           window in which something ran on the device (1 - busy: the device waited for the host)
//   CPU (no device events): operators by total time, nested ones counted in each (inclusive).
// The window ends with a device synchronisation, so its wall time is the window's steps. The
// profiler slows the host side of the steps it records: a profiled run's tokens/s is not the
// unprofiled speed (measure separately).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln {

struct ProfileEntry {
  std::string name;
  double ms = 0;      // summed duration over the window
  int64_t calls = 0;
};

struct ProfileSummary {
  bool device = false;          // entries are device events (CUDA) rather than host operators
  double wall_ms = 0;           // the window, start to the synchronised stop
  double total_ms = 0;          // sum of every entry's time (device: summed kernel time)
  double busy_ms = 0;           // device: the union of the event intervals (0 on the CPU)
  int64_t events = 0;           // events summarised
  std::vector<ProfileEntry> top;  // by time, most first (at most `top_n` of them)

  nlohmann::json to_json() const;
  std::string table() const;    // a console table of `top`
};

class StepProfiler {
 public:
  // path: the trace file (rank > 0: path + ".rankR"); cuda: record device activity too.
  StepProfiler(std::string path, int rank, bool cuda, int top_n = 15);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  void start();
  bool active() const { return active_; }
  // Call after the device is synchronised. Stops, writes the trace and returns the summary.
  ProfileSummary stop();
  const std::string& trace_path() const { return path_; }

 private:
  std::string path_;
  bool cuda_;
  int top_n_;
  bool active_ = false;
  int64_t start_ns_ = 0;
};

}  // namespace kiln
