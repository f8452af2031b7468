// models/moe.h -- a Mixture-of-Experts feed-forward layer (Switch / GShard style), one process.
//
// STATUS: the layer and its tests only (issue 19, first part). It is not yet a block of GPT, has
// no flags, and no expert parallelism: those are the next parts. Its expert loop finds
// each expert's tokens with nonzero(), a host synchronisation per expert: before it runs on a GPU,
// sort the admitted assignments by expert and read the E counts once (the all-to-all needs them
// anyway).
//
// N tokens x [d], E experts (each the dense block's MLP: c_fc [F, d] + b, GELU-tanh, c_proj
// [d, F] + b, F = 4d), k of them per token:
//   router      z = x W_g^T                  [N, E], fp32 (or x's wider dtype), W_g [E, d], no bias
//               p = softmax(z)               over the E experts
//               (e_1..e_k), (p_1..p_k) = top-k of p; gates g_j = p_j / sum_j p_j (k > 1: the
//               chosen probabilities renormalised, as GShard's top-2 and Mixtral's
//               top-k-then-softmax, which is the same thing; k = 1: g = p_1, Switch's)
//   capacity    C = ceil(capacity_factor x k x N / E) assignments per expert (capacity_factor
//               0: no limit, "dropless"). Assignments are admitted choice by choice (every
//               token's first choice before any second choice: GShard's priority), in token
//               order within a choice; an expert's assignments past C are dropped: that slot
//               contributes nothing, so a token all of whose choices are dropped passes through
//               the block's residual connection unchanged.
//   output      y_n = sum over n's admitted assignments j of g_j MLP_{e_j}(x_n)
//   aux loss    (Switch, Fedus et al. 2021, eq. 4) L_aux = E sum_e f_e P_e, f_e = the fraction
//               of the N k assignments routed to e (before dropping), P_e = mean_n p_{n,e};
//               1 when routing is uniform, E at worst. Only P_e carries a gradient.
//   z-loss      (ST-MoE, Zoph et al. 2022, eq. 5) L_z = mean_n (logsumexp_e z_{n,e})^2.
// The trainer is to add coef_aux L_aux + coef_z L_z to the language-model loss.
// Stats per call (for the step record): the dropped fraction of assignments, and the most and
// least loaded expert's admitted assignments over the mean (N k / E).
// FLOPs per token: 2 d E (router) + k x the dense MLP's; parameters: E x the MLP's + d E.
#pragma once

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

namespace kiln {

struct MoEConfig {
  int64_t n_experts = 4;
  int64_t top_k = 2;
  double capacity_factor = 1.25;  // 0: dropless
  // Throws ConfigError, one line, for top_k outside [1, n_experts], n_experts < 1 or a negative
  // capacity factor.
  void validate() const;
};

struct MoEStats {
  double dropped_fraction = 0.0;  // of the N k assignments
  double max_load = 0.0, min_load = 0.0;  // admitted assignments of the most / least used expert, over N k / E
};

class MoEImpl : public torch::nn::Module {
 public:
  MoEImpl(int64_t d_model, int64_t hidden, const MoEConfig& cfg, const at::TensorOptions& opts);
  // x [.., d] -> [.., d]; sets aux_loss, z_loss (scalars in the router's dtype, differentiable)
  // and stats.
  at::Tensor forward(const at::Tensor& x);

  at::Tensor router;          // [E, d]
  at::Tensor fc_w, fc_b;      // [E, F, d], [E, F]
  at::Tensor proj_w, proj_b;  // [E, d, F], [E, d]
  at::Tensor aux_loss, z_loss;
  MoEStats stats;
  const MoEConfig& config() const { return cfg_; }

 private:
  MoEConfig cfg_;
};

// The capacity C for n tokens (0: unlimited).
int64_t moe_capacity(const MoEConfig& cfg, int64_t n_tokens);

}  // namespace kiln
