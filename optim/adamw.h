// optim/adamw.h -- AdamW (Loshchilov & Hutter, 2019) over two parameter groups.
//
// For each parameter p with gradient g, at step t (from 1):
//   m = b1 m + (1 - b1) g            v = b2 v + (1 - b2) g^2
//   p = p - lr wd p                   (decoupled weight decay; 0 for the no-decay group)
//   p = p - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// Weight decay applies to matrices and embeddings (dim >= 2) only, never to biases and
// LayerNorm parameters (nanoGPT's and llm.c's rule). The update runs in LibTorch's fused
// multi-tensor kernel (_fused_adamw_), on CUDA and on CPU alike; the moments are fp32 and live
// on the parameter's device.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace kiln {

// What a checkpoint holds of each parameter: its values and AdamW's two moments (the step count,
// the same for every parameter, is kept apart).
enum class StatePart { Param, ExpAvg, ExpAvgSq };

struct AdamWConfig {
  double beta1 = 0.9;         // first-moment decay
  double beta2 = 0.95;        // second-moment decay (GPT-2/3 recipe)
  double eps = 1e-8;          // added to sqrt(v)
  double weight_decay = 0.1;  // decoupled decay of the decay group
};

class AdamW {
 public:
  // Splits `params` by dimension into the decay (dim >= 2) and no-decay groups.
  AdamW(const std::vector<at::Tensor>& params, const AdamWConfig& cfg);

  // One update with learning rate lr, using each parameter's .grad(). Parameters without a
  // gradient are skipped (their state does not advance).
  void step(double lr);

  int64_t steps_taken() const { return steps_; }

  // Parameter p's state (p must be one of the constructor's parameters): views of the live
  // tensors, which a checkpoint reads and a resume writes into. step is a 0-dim fp32 tensor.
  struct ParamState {
    at::Tensor exp_avg, exp_avg_sq, step;
  };
  ParamState state_of(const at::Tensor& p) const;
  void set_steps_taken(int64_t n) { steps_ = n; }
  const AdamWConfig& config() const { return cfg_; }

 private:
  struct Group {
    std::vector<at::Tensor> params, exp_avg, exp_avg_sq, step;
    double weight_decay;
  };
  void step_group(Group& g, double lr);
  AdamWConfig cfg_;
  std::vector<Group> groups_;
  int64_t steps_ = 0;
};

}  // namespace kiln
