// runtime/phase_timer.h -- where a step's time goes, without synchronising for it.
//
// The trainer marks the end of each stretch of work; the time since the previous mark is
// charged to the phase named. On CUDA each mark is an event recorded on the current stream (the
// host does not wait); on the CPU work is synchronous and the host clock is read. The marks run
// on from step to step as one chain of intervals: cut() ends an interval at the latest mark and
// starts the next one there. The trainer cuts once per step, right after the step's one host
// synchronisation (the verdict's read), when every event up to it has completed: so the split
// costs nothing, a phase is what the GPU spent on it, and the update queued after that read
// (its optimizer mark) falls into the next step's interval. start() begins a new chain (the first
// step, and after an evaluation or a save, which synchronise anyway). Phases:
//   forward    the micro-steps' forward passes (loss included)
//   backward   their backward passes
//   comm       waits on gradient reductions after backward (DDP's finish, ZeRO's last
//              micro-step) and the step's verdict all-reduce: communication not hidden by compute
//   optimizer  gradient norm, clipping, the update (ZeRO: and its parameter all-gather)
#pragma once

#include <array>
#include <chrono>
#include <memory>
#include <vector>

#include <c10/core/Device.h>

namespace kiln {

enum class Phase { Forward = 0, Backward, Comm, Optimizer };
constexpr size_t kNumPhases = 4;

class PhaseTimer {
 public:
  explicit PhaseTimer(c10::Device device);
  ~PhaseTimer();
  void start();         // a new chain: the next interval begins now
  void mark(Phase p);   // the work queued since the previous mark belongs to p
  // Milliseconds per phase from the chain's start or the last cut to the latest mark; the next
  // interval begins at that mark. Call once the device has done the work up to it.
  std::array<double, kNumPhases> cut();
  // The host clock at the chain's start and at the latest mark (where the last cut ended): the
  // ends of the step's wall-clock interval, the same points the phases run between.
  std::chrono::steady_clock::time_point start_time() const { return start_time_; }
  std::chrono::steady_clock::time_point cut_time() const { return host_.back(); }

 private:
  struct CudaEvents;
  c10::Device device_;
  std::vector<Phase> phases_;
  std::vector<std::chrono::steady_clock::time_point> host_;  // the host clock at start and each mark
  std::chrono::steady_clock::time_point start_time_;
  std::unique_ptr<CudaEvents> cuda_;
};

}  // namespace kiln
