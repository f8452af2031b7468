// runtime/trainer.h -- the training loop: model, data, optimizer, schedule, metrics, log.
//
// One optimizer step s:
//   for micro m in [0, grad_accum):  x, y = loader.get(s, m);  (loss(x, y) / grad_accum).backward()
//   norm = clip_grad_norm(params, grad_clip);  agreed finite or the run stops naming the step
//   adamw.step(lr(s));  read loss and norm once (the step's only host synchronisation)
// The mean of the micro-batch losses is the step's loss; gradients accumulate in the fp32
// .grad buffers. The trainer composes the parts; it holds no global state.
#pragma once

#include <nlohmann/json.hpp>

#include "runtime/train_config.h"

namespace kiln {

class Trainer {
 public:
  // The config must have passed validate().
  explicit Trainer(TrainConfig cfg);
  // Runs the configured steps, writing the console lines and the JSONL log. Returns the
  // summary record. Throws kiln::Error subclasses on bad data or non-finite numerics.
  nlohmann::json run();

 private:
  TrainConfig cfg_;
};

}  // namespace kiln
