// runtime/phase_timer.h -- where a step's time goes, without synchronising inside the step.
//
// The trainer marks the end of each stretch of work; the time since the previous mark is
// charged to the phase named. On CUDA each mark is an event recorded on the current stream (the
// host does not wait), and the elapsed times are read once, after the step's own
// synchronisation; so the split costs the step nothing and a phase is what the GPU spent on it.
// On the CPU work is synchronous and the host clock is read. Phases:
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
  void start();         // the step begins
  void mark(Phase p);   // the work queued since the previous mark belongs to p
  // Milliseconds per phase since start(). Call after the device has been synchronised.
  std::array<double, kNumPhases> read();

 private:
  struct CudaEvents;
  c10::Device device_;
  std::vector<Phase> phases_;
  std::vector<std::chrono::steady_clock::time_point> host_;
  std::unique_ptr<CudaEvents> cuda_;
};

}  // namespace kiln
