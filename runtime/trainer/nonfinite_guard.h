// runtime/trainer/nonfinite_guard.h -- where a non-finite step came from, and when to give up.
//
// bf16 and fp32 have no loss scaler: a step whose loss or gradient norm is not finite on any rank
// is skipped on every rank alike (the step's verdict, runtime/trainer/trainer_step.cpp, carries
// the flag; the fused AdamW kernel leaves weights and moments untouched), or stops the run
// (--on-nonfinite stop). Skipping goes on for at most --max-skipped-steps steps in a row; the
// next ends the job (exit 4, nothing saved) with one line that says which step, and where the
// value appeared first:
//   - the local loss: every step each rank keeps, on the device and without a host read, whether
//     its own loss (before the verdict's reduction) was finite. A loss that is not finite on some
//     ranks only points at their data or their forward.
//   - the local gradients: a data-parallel reduction spreads one rank's NaN to every rank's
//     gradient, so only a look before it tells the origin. After the first skipped step the guard
//     arms a hook on each of the rank's parameters (a tensor pre-hook: it sees each micro-batch's
//     contribution before AccumulateGrad and so before DDP's / ZeRO's reduction) that records, on
//     the device, the order in which gradients turned out non-finite. A step traced that way
//     names, per rank, the parameter whose gradient was non-finite first. The hooks cost a few
//     small kernels per parameter and micro-batch, only while steps are being skipped; they stop
//     at the first finite step. Steps are read one behind (the next step's backward is queued
//     before the host reads a verdict), so the first step traced is the second after the first
//     skip: with --max-skipped-steps 2 or more a persistent fault is traced.
// At the end every rank's findings are all-gathered over the host group, so every rank throws
// the same line (rank 0 prints it, launch/main.cpp).
//
// Test-only fault injection (tests/cli/guards.sh): KILN_TEST_NAN_GRAD=RANK:STEP[:COUNT] puts a
// NaN into the gradient of rank RANK's first MLP parameter in steps STEP .. STEP + COUNT - 1
// (1-based, as the log counts them; COUNT 1 by default), before any reduction.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace kiln {

class Communicator;

class NonfiniteGuard {
 public:
  // The rank's parameters with their names (GPT::named_parameters), its world rank.
  NonfiniteGuard(std::vector<std::pair<std::string, at::Tensor>> params, int rank);
  NonfiniteGuard(const NonfiniteGuard&) = delete;
  NonfiniteGuard& operator=(const NonfiniteGuard&) = delete;

  // Step `step` (0-based) starts its forward and backward on this rank.
  void begin_step(int64_t step);
  // Its local loss, before any reduction (a device scalar): kept as a flag, no host read.
  void note_local_loss(int64_t step, const at::Tensor& loss_sum);
  // The host has read step `step`'s verdict: finite forgets the run of skipped steps and disarms
  // the hooks; not finite keeps the step's flags and arms them.
  void step_read(int64_t step, bool nonfinite);

  // Where the current run of non-finite steps came from, the same text on every rank. Collective
  // over `host` (nullptr: this process alone). Reads the kept device flags (host syncs: the run
  // is ending).
  std::string origin(Communicator* host);

 private:
  struct Param {
    std::string name;
    at::Tensor tensor;
  };
  std::string local_findings();  // "loss_step;traced_step;param;count" of this rank
  void arm();

  std::vector<Param> params_;
  int rank_ = 0;
  int64_t current_step_ = -1;
  bool armed_ = false, hooked_ = false;
  int64_t order_ = 0;                                // gradients seen in the traced step, in order
  std::map<int64_t, at::Tensor> loss_flags_;         // step -> 1 if the local loss was not finite (device)
  std::map<int64_t, at::Tensor> traces_;             // step -> per parameter: the order its gradient turned non-finite (inf: never)
  std::vector<std::pair<int64_t, at::Tensor>> run_losses_;  // the run's non-finite steps' loss flags
  int64_t traced_step_ = -1;                         // the run's first traced step, its trace on the host
  std::vector<double> trace_;
  // test-only injection (KILN_TEST_NAN_GRAD)
  int64_t inject_first_ = -1, inject_count_ = 0;
};

}  // namespace kiln
