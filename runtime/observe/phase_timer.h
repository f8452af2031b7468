// runtime/observe/phase_timer.h -- where a step's time goes, without synchronising for it.
//
// The trainer marks the end of each stretch of work; the time since the previous mark is
// charged to the phase named. On CUDA each mark is an event recorded on the current stream (the
// host does not wait); on the CPU work is synchronous and the host clock is read. The marks run
// on from step to step as one chain of intervals: cut(token) ends an interval at the mark
// `token` (a mark() returns it) and starts the next one there; marks made after it stay in the
// chain for the next interval. The trainer cuts once per step at the mark after its update,
// once wait(token) has returned -- so the split costs nothing more than the step's own wait, a
// phase is what the GPU spent on it (idle gaps included: the chain is contiguous), and a step's
// interval is exactly its forward, backward, communication and update, even when the next step's
// forward and backward were queued before it was read (runtime/trainer/trainer.cpp). start() begins a
// new chain (the first step, and after an evaluation or a save, which synchronise anyway).
// With a wait clock (distributed/wait_clock.h) each interval also carries the time this rank stood
// still in collectives' waits within it, by phase (cut's `waited`): a forward's own compute is its
// time less its waits.
// Phases:
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

class WaitClock;

enum class Phase { Forward = 0, Backward, Comm, Optimizer };
constexpr size_t kNumPhases = 4;

class PhaseTimer {
 public:
  explicit PhaseTimer(c10::Device device, std::shared_ptr<WaitClock> clock = nullptr);
  ~PhaseTimer();
  void start();             // a new chain: the next interval begins now
  size_t mark(Phase p);     // the work queued since the previous mark belongs to p; returns its token
  // While paused, mark() records nothing and returns the latest token: a CUDA graph's capture,
  // whose work is recorded, not run (an event recorded there would never complete).
  void pause(bool on) { paused_ = on; }
  // Blocks the host until the device has done the work up to mark `token` (CUDA: its event;
  // on the CPU the work is done already).
  void wait(size_t token);
  // Milliseconds per phase from the chain's start or the last cut to mark `token`,
  // which must be done (wait); the next interval begins at that mark. `waited`: of them, the
  // waits in collectives, per phase (zeros without a clock).
  std::array<double, kNumPhases> cut(size_t token, std::array<double, kNumPhases>* waited = nullptr);
  size_t latest() const { return base_ + host_.size() - 1; }
  // The host clock at the mark the last cut ended at (at the chain's start before any cut).
  std::chrono::steady_clock::time_point cut_time() const { return host_.front(); }

 private:
  struct CudaEvents;
  c10::Device device_;
  std::vector<Phase> phases_;
  std::shared_ptr<WaitClock> clock_;
  std::vector<int64_t> segments_;  // the wait clock's segment of each interval (with phases_)
  std::vector<std::chrono::steady_clock::time_point> host_;  // the host clock at the interval's start and each mark since
  size_t base_ = 0;  // the token of host_[0]
  bool paused_ = false;
  std::unique_ptr<CudaEvents> cuda_;
};

}  // namespace kiln
