// runtime/trainer/spike_guard.h -- a loss spike, and the decision to go back (--spike-rollback Z).
//
// The practice of OPT, BLOOM and PaLM: when the loss jumps far above its recent level and stays
// there, go back to the last good checkpoint and skip the data that produced the jump. Here:
//   - the recent level: the mean m and standard deviation s of the last W = 20 losses that were
//     not part of a spike (at least 10 of them before anything is judged; non-finite losses are
//     the non-finite guard's, runtime/trainer/nonfinite_guard.h, and are not counted);
//   - a spiking step: loss > m + Z s;
//   - a spike: --spike-patience P spiking steps in a row (steps k0 .. k1). Then the trainer
//     (runtime/trainer/trainer_loop.cpp, Trainer::roll_back) reloads, in place and on every rank, the
//     newest checkpoint from before k0 (step c < k0), marks the data the steps c+1 .. k1 consumed as
//     skipped -- PaLM's rule: from the checkpoint through the spike -- (data/loader.h: those stream
//     positions are never read again; recorded in every later checkpoint, so a resume skips them
//     too), points `latest` at that checkpoint, writes a `rollback` record and goes on from step
//     c + 1. The run is then the run that never had that data: same losses, bit for bit on the CPU.
// Every rank sees the same loss (the step's verdict), so every rank decides alike.
#pragma once

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

namespace kiln {

class SpikeGuard {
 public:
  SpikeGuard(double z, int64_t patience, int64_t window = 20, int64_t min_history = 10);

  struct Verdict {
    bool spiking = false;   // this step's loss is above m + Z s
    bool roll_back = false; // the patience-th spiking step in a row
    double mean = 0, std = 0;
  };
  // Step `step` (1-based) had `loss`.
  Verdict observe(int64_t step, double loss);
  // The spiking steps in a row so far: (step, loss).
  const std::vector<std::pair<int64_t, double>>& spike() const { return spike_; }
  // After a rollback to the checkpoint of step `step`: forget the steps after it.
  void rewind(int64_t step);

 private:
  double z_;
  int64_t patience_, window_, min_history_;
  std::deque<std::pair<int64_t, double>> history_;  // (step, loss), not spiking, the last window_
  std::vector<std::pair<int64_t, double>> spike_;
};

}  // namespace kiln
