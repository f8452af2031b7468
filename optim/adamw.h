// optim/adamw.h -- AdamW (Loshchilov & Hutter, 2019) over two parameter groups.
//
// For each parameter p with gradient g, at step t (from 1):
//   m = b1 m + (1 - b1) g            v = b2 v + (1 - b2) g^2
//   p = p - lr wd p                   (decoupled weight decay; 0 for the no-decay group)
//   p = p - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// Weight decay applies to matrices and embeddings (dim >= 2) only, never to biases and
// LayerNorm parameters (nanoGPT's and llm.c's rule). The update runs in one multi-tensor pass
// (kernels/adamw.h: kiln's kernel on CUDA, LibTorch's _fused_adamw_ as the reference and on the
// CPU); the moments are fp32 and live on the parameter's device.
//
// 16-bit working weights (--param-dtype bf16 | fp16; Megatron's Float16Optimizer, FSDP's
// param_dtype): the model computes with bf16 / fp16 parameters, and AdamW keeps, with its
// moments, an fp32 master copy w of each one. The update above runs on w with the fp32 gradient
// accumulated in w.grad (the "main grad": parallel/main_grads.h and DDP add each micro-step's
// 16-bit gradient into it), then the parameter takes w rounded to 16 bits: p = fp16(w). Bytes
// per parameter: 2 (p) + 4 (main grad) + 4 (w) + 8 (m, v) = 18, against 4 + 4 + 8 = 16 for fp32
// working weights, and no 2-byte autocast copy of each weight in the forward.
//
// Nothing to accumulate (grad_accum 1, no reduction between the backward and the update:
// read_working_grads()): the update reads autograd's 16-bit gradient of p itself. The fused
// kernel reads g as fp32 as it goes; the reference copies it to fp32 first. float(g) is exact,
// and the main grad would hold 0 + float(g) = float(g), so the update is the same bit for bit;
// what goes is the main grad's 4 bytes a parameter (16 instead of 18), its zero fill and the add
// into it (10 bytes of traffic a parameter a step).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "kernels/kernel_choice.h"

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
  // Splits `params` (fp32) by dimension into the decay (dim >= 2) and no-decay groups. `working`:
  // the dtype the parameters compute in; bf16 / fp16 makes each one's fp32 master from its
  // current (fp32) values, then casts the parameter itself to `working` (see above).
  AdamW(const std::vector<at::Tensor>& params, const AdamWConfig& cfg, at::ScalarType working = at::kFloat);

  // One update with learning rate lr, using each grad_target's .grad(). Parameters without a
  // gradient are skipped (their state does not advance). found_inf (a 0-dim fp32 tensor on the
  // parameters' device, 1 or 0; undefined: 0): 1 skips the update inside the fused kernel --
  // parameters, moments and step counts stay as they were -- with no host synchronisation, the
  // way PyTorch's GradScaler hands its verdict to the fused optimizers.
  // grad_factor (a 0-dim fp32 tensor on that device; undefined: 1) multiplies every gradient
  // first: the clipping factor over the loss scale (optim/grad_clip.h's clip_factor), applied
  // inside the update. The update runs in kernels/adamw.h: kiln's one-pass kernel under
  // set_kernels(fused) on CUDA (gradients read once, clipped, the master, moments and 16-bit copy
  // written together), else LibTorch's ops (the gradients then left holding factor x g).
  // lr_tensor (0-dim fp32 on the parameters' device; undefined: lr): the rate read on the device
  // as the update runs (kernels/adamw.h) -- a CUDA graph's update, whose rate changes each replay.
  void step(double lr, const at::Tensor& found_inf = at::Tensor(), const at::Tensor& grad_factor = at::Tensor(),
            const at::Tensor& lr_tensor = at::Tensor());
  void set_kernels(Kernels k) { kernels_ = k; }
  // Where p's gradient is read, and accumulated in fp32: its master (16-bit working weights),
  // else p itself. grad_targets(): the constructor's parameters', in its order.
  const at::Tensor& grad_target(const at::Tensor& p) const;
  std::vector<at::Tensor> grad_targets() const { return targets_; }
  bool has_masters() const { return working_ != at::kFloat; }
  // 16-bit working weights: from now on each parameter's gradient is read from the parameter
  // itself (its 16-bit .grad), not accumulated in its master's (see above). grad_target(p) is
  // then p. Call before anything reads grad_targets(); a no-op for fp32 working weights.
  void read_working_grads();
  bool reads_working_grads() const { return working_grads_; }  // set only with masters

  int64_t steps_taken() const { return steps_; }

  // Parameter p's state (p must be one of the constructor's parameters): views of the live
  // tensors, which a checkpoint reads and a resume writes into. step is a 0-dim fp32 tensor.
  struct ParamState {
    at::Tensor exp_avg, exp_avg_sq, step;
    at::Tensor master;  // the fp32 master (p itself for fp32 working weights)
  };
  ParamState state_of(const at::Tensor& p) const;
  void set_steps_taken(int64_t n) { steps_ = n; }
  const AdamWConfig& config() const { return cfg_; }

 private:
  struct Group {
    std::vector<at::Tensor> params, masters, exp_avg, exp_avg_sq, step;  // masters: params for fp32
    double weight_decay;
  };
  void step_group(Group& g, double lr, const at::Tensor& found_inf, const at::Tensor& grad_factor, const at::Tensor& lr_tensor);
  std::pair<size_t, size_t> index_of(const at::Tensor& p) const;  // (group, position); throws for a stranger
  // The tensor whose .grad the update reads: the parameter (read_working_grads) or its master.
  const at::Tensor& grad_holder(const Group& g, size_t i) const { return working_grads_ ? g.params[i] : g.masters[i]; }
  AdamWConfig cfg_;
  at::ScalarType working_;
  std::vector<at::Tensor> targets_, params_;  // in the constructor's order
  std::unordered_map<const void*, std::pair<size_t, size_t>> index_;  // TensorImpl -> (group, position)
  std::vector<Group> groups_;
  int64_t steps_ = 0;
  Kernels kernels_ = Kernels::reference;
  bool working_grads_ = false;  // read_working_grads()
};

}  // namespace kiln
