// runtime/trainer.h -- the training loop: model, data, optimizer, schedule, metrics, log.
//
// One optimizer step s:
//   for micro m in [0, grad_accum):  x, y = loader.get(s, m);  (loss(x, y) / grad_accum).backward()
//   norm = clip_grad_norm(params, grad_clip);  agreed finite or the run stops naming the step
//   (under DDP: micro-steps 0..K-2 accumulate locally, the last one's backward all-reduces)
//   adamw.step(lr(s));  read loss and norm once (the step's only host synchronisation)
// The mean of the micro-batch losses is the step's loss; gradients accumulate in the fp32
// .grad buffers. The trainer composes the parts; it holds no global state.
#pragma once

#include <nlohmann/json.hpp>

#include "runtime/env.h"
#include "runtime/train_config.h"

namespace kiln {

class Trainer {
 public:
  // The config must have passed validate(). proc: this process's place in the job (a world of
  // one without mpirun). Under mpirun the ranks form the dp x tp x pp mesh and DDP reduces the
  // gradients over dp; rank 0 alone prints and writes the log.
  Trainer(TrainConfig cfg, ProcessInfo proc);
  // Runs the configured steps, writing the console lines and the JSONL log. Returns the
  // summary record. Throws kiln::Error subclasses on bad data or non-finite numerics.
  nlohmann::json run();

 private:
  TrainConfig cfg_;
  ProcessInfo proc_;
};

}  // namespace kiln
