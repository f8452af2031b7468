// runtime/trainer/trainer.h -- the training loop: model, data, optimizer, schedule, metrics, log.
//
// One optimizer step s (S = the loss scale: 1 unless fp16; u = updates applied so far):
//   reseed dropout from (seed, s, dp rank)
//   for micro m in [0, grad_accum):  x, y = loader.get(s, m)
//       loss = model.loss(x, y) under autocast (bf16/fp16)        fp32 for --precision fp32
//       (loss * S / grad_accum).backward()                          grads accumulate in fp32
//   (under DDP: micro-steps 0..K-2 accumulate locally, the last one's backward all-reduces)
//   norm = ||g|| / S;  g = clip(g) / S  (one pass)
//   [loss, non-finite flag] summed over dp: every rank reaches the same verdict
//   fp16: the loss scaler decides (an overflow skips the step and may halve S)
//   bf16/fp32: non-finite stops the run naming the step, or skips it (--on-nonfinite skip; at most
//   --max-skipped-steps in a row; runtime/trainer/nonfinite_guard.h names where it came from)
//   not skipped: adamw.step(lr(u)); u += 1      (a skipped step leaves weights, moments and
//                                                 the LR schedule where they were)
//   checkpoint when s + 1 is a multiple of --save-every, and after the last step
// The loss and flag are read once per step: the step's only host synchronisation besides the
// timing one. The trainer composes the parts; it holds no global state.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "distributed/env.h"
#include "runtime/trainer/spike_guard.h"
#include "runtime/trainer/train_config.h"

namespace kiln {

struct Batch;
struct CheckpointIo;

class Trainer {
 public:
  // The config must have passed validate(). proc: this process's place in the job (a world of
  // one without mpirun). Under mpirun the ranks form the dp x tp x pp mesh and DDP reduces the
  // gradients over dp; rank 0 alone prints, writes the log and writes checkpoints.
  Trainer(TrainConfig cfg, ProcessInfo proc);
  ~Trainer();
  // Runs the configured steps (resuming first when --resume finds a checkpoint), writing the
  // console lines and the JSONL log. Returns the summary record. Throws kiln::Error subclasses
  // on bad data, a refused checkpoint, or non-finite numerics.
  nlohmann::json run();
  // `kiln eval`: loads the checkpoint's weights (cfg.resume; its optimizer state is not needed)
  // on this layout and evaluates them once on the validation data; returns the eval record
  // ({"type": "eval", "step", "val_loss", ...}).
  nlohmann::json evaluate_checkpoint();

 private:
  struct Run;  // everything a run builds: mesh, data, model, wrappers, optimizer, sinks
  struct QueuedStep;
  struct StepOutcome;
  struct Loop;         // what the loop keeps across its steps (trainer_loop.cpp)
  struct StepFigures;  // one step's time, throughput, memory and energy, as recorded

  // Set-up (trainer.cpp), in this order.
  void setup();
  void check_launch() const;
  void build_mesh();
  void take_guards();
  void build_data();
  void build_model();
  void build_optimizer();  // ZeRO-0: AdamW and DDP
  void build_zero();       // ZeRO-1/2/3
  void build_step_parts();
  void build_graphs();  // --cuda-graph (trainer_graph.cpp)
  void load_checkpoint();
  void build_observers();
  void log_config();  // the config record, and rank 0's start-up lines (trainer_records.cpp)
  nlohmann::json config_record() const;
  void print_start_lines() const;
  void print_state_lines() const;

  // The step (trainer_step.cpp).
  QueuedStep forward_backward(int64_t step);
  void begin_step(QueuedStep& out, int64_t step);
  void zero_gradients();
  // device_batches: the micro-batches already on the device (the step graph's); else the prefetcher's
  // loss_tokens: set to the step's trained targets on masked data
  at::Tensor run_micro_batches(int64_t step, double backward_factor, const std::vector<Batch>* device_batches = nullptr,
                               int64_t* loss_tokens = nullptr);
  void finish_reductions();
  at::Tensor gradient_norm(double loss_scale);
  void queue_verdict(QueuedStep& out, const at::Tensor& loss_sum, const at::Tensor& norm);
  void queue_update(QueuedStep& q);
  void queue_verdict_copy(QueuedStep& q);
  // --cuda-graph (trainer_graph.cpp): the same step as forward_backward and queue_update, replayed
  QueuedStep forward_backward_graphed(int64_t step);
  void queue_update_graphed(QueuedStep& q);
  StepOutcome finish_step(QueuedStep& q);

  // The loop (trainer_loop.cpp).
  Loop start_loop();
  void run_steps(Loop& loop);
  bool may_defer(const Loop& loop, int64_t step) const;
  bool record(Loop& loop, int64_t step, const StepOutcome& s);
  nlohmann::json step_record(const Loop& loop, int64_t step, const StepOutcome& s, const StepFigures& f) const;
  void print_step_line(const Loop& loop, int64_t step, const StepOutcome& s, const StepFigures& f) const;
  bool after_step(Loop& loop, int64_t step, int64_t stop_request);  // the request every rank agreed on
  bool note_evaluation(Loop& loop, int64_t step, bool* save_now);
  void write_sample(int64_t step);
  void save_checkpoint(Loop& loop, int64_t step);
  void saved(Loop& loop, int64_t step, const std::string& dir, const CheckpointIo& io, double stall_s, double waited_s, bool async);
  void collect_save(Loop& loop, bool wait);
  void roll_back(Loop& loop, int64_t step, const SpikeGuard::Verdict& v);
  void profile_stop(Loop& loop, int64_t next_step);
  nlohmann::json pipeline_stages(int64_t last_comm_bytes);
  nlohmann::json finish_run(Loop& loop);

  double evaluate(int64_t step);  // mean validation loss, logged as an "eval" record
  TrainConfig cfg_;
  bool evaluating_ = false;  // kiln eval: the checkpoint's weights only (no optimizer state needed)
  ProcessInfo proc_;
  std::unique_ptr<Run> run_;
};

}  // namespace kiln
