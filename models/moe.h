// models/moe.h -- a Mixture-of-Experts feed-forward layer (Switch / GShard style).
//
// GPT's MoE blocks hold one (models/gpt.h; GPTConfig::n_experts). Under expert parallelism
// (parallel/expert_parallel.h) a rank holds E / ep of the experts and the LayerOps it is given
// move each expert's rows to the rank holding it and back; the router (replicated) and
// everything below decide the same way on every layout.
//
// Input x [G, S, d]: G groups of S tokens (GPT passes [B, T, d]: a group is one sequence, GShard's
// "group"); a 2-D x [N, d] is one group of N tokens. E experts (each the dense block's MLP: c_fc
// [F, d] + b, GELU-tanh, c_proj [d, F] + b, F = 4d; or, SwiGLU's (Mixtral's), fc [2F, d] holding
// gate's rows then up's, down(silu(gate x) * up x), biases only if the model has them), k of them
// per token:
//   router      z = x W_g^T                  [N, E], fp32 (or x's wider dtype), W_g [E, d], no bias
//               p = softmax(z)               over the E experts (softmax, then top-k)
//               (e_1..e_k), (p_1..p_k) = top-k of p; gates g_j = p_j / sum_j p_j (k > 1: the
//               chosen probabilities renormalised, as GShard's top-2 and Mixtral's
//               top-k-then-softmax, which is the same thing; k = 1: g = p_1, Switch's)
//   capacity    per group: C = ceil(capacity_factor x k x S / E) assignments per expert
//               (capacity_factor 0: no limit, "dropless"). Within a group, assignments are
//               admitted choice by choice (every token's first choice before any second choice:
//               GShard's priority), in token order within a choice; an expert's assignments past C
//               are dropped: that slot contributes nothing, so a token all of whose choices are
//               dropped passes through the block's residual connection unchanged. A group being
//               one sequence, what is dropped depends on the sequence alone -- never on the
//               micro-batch size or the layout (dp, ep): every layout drops what the single
//               process drops.
//   output      y_n = sum over n's admitted assignments j of g_j MLP_{e_j}(x_n)
//   aux loss    (Switch, Fedus et al. 2021, eq. 4, per group as Switch's own code computes it)
//               L_aux = mean_g E sum_e f_{g,e} P_{g,e}, f_{g,e} = the fraction of group g's S k
//               assignments routed to e (before dropping), P_{g,e} = mean over g's tokens of p_e;
//               1 when routing is uniform, E at worst. Only P carries a gradient.
//   z-loss      (ST-MoE, Zoph et al. 2022, eq. 5) L_z = mean_n (logsumexp_e z_{n,e})^2.
// Both are means over groups or tokens, so a data-parallel mean of per-rank losses is the
// single process's loss.
//
// The losses reach the gradient without entering the returned loss: the output is passed through
// an identity whose backward also gives the combined loss aux_coef L_aux + z_coef L_z the
// gradient `loss_backward_scale` (Megatron's MoEAuxLossAutoScaler). Set it to the factor the
// language-model loss is multiplied by before backward (loss scale / grad-accum; the trainer
// does): the gradient is then that of (L_LM + aux_coef L_aux + z_coef L_z) x that factor, with
// pipeline stages, activation checkpointing and every other wrapper unchanged.
//
// Dispatch: the admitted assignments are sorted by expert (stable: token order within an
// expert), each expert runs its contiguous rows in one batch, and the outputs are summed back
// into their tokens (index_add). The E counts are read by the host once per call (one
// synchronisation, as Megatron's dropless dispatcher), to size each expert's batch.
//
// Stats per call (host, for tests and the console): the dropped fraction of the N k assignments,
// and the most and least chosen expert's assignments (before dropping) over the mean N k / E.
// For the step record, a device row [E routed counts, admitted count, L_aux, L_z] is added into
// `step_stats` by every forward that runs with grad on (so a checkpointed block's recomputation
// counts once, and evaluation not at all); the trainer sums and clears it each step.
// FLOPs per token: 2 d E (router) + k x the dense MLP's; parameters: E x the MLP's + d E.
// Mixtral (MixtralSparseMoeBlock) routes the same way: softmax, top-k, the k renormalised.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "kernels/float8.h"
#include "kernels/kernel_choice.h"

namespace kiln {

struct GPTConfig;

struct MoEConfig {
  int64_t n_experts = 4;          // E
  int64_t top_k = 2;              // k
  double capacity_factor = 1.25;  // per group; 0: dropless
  double aux_loss_coef = 0.0;     // weight of L_aux in the gradient (GPT: --moe-aux-loss-coef)
  double z_loss_coef = 0.0;       // weight of L_z (GPT: --moe-z-loss-coef)
  bool swiglu = false;            // the experts are SwiGLU feed-forwards (GPTConfig::mlp)
  bool bias = true;               // the experts' linear layers have biases (GPTConfig::bias all)
  // Throws ConfigError, one line, for top_k outside [1, n_experts], n_experts < 1 or a negative
  // capacity factor or coefficient.
  void validate() const;
  static MoEConfig of(const GPTConfig& cfg);
};

struct MoEStats {
  double dropped_fraction = 0.0;  // of the N k assignments
  double max_load = 0.0, min_load = 0.0;  // assignments routed to the most / least chosen expert, over N k / E
};

// The width of a step_stats row: E routed counts, then admitted, L_aux, L_z.
inline int64_t moe_stats_width(int64_t n_experts) { return n_experts + 3; }

struct LayerOps;

class MoEImpl : public torch::nn::Module {
 public:
  // ops: expert parallelism's (LayerOps::expert_split, dispatch_experts); null: every expert here.
  MoEImpl(int64_t d_model, int64_t hidden, const MoEConfig& cfg, const at::TensorOptions& opts,
          std::shared_ptr<const LayerOps> ops = nullptr);
  // x [G, S, d] or [N, d] -> the same shape; sets aux_loss, z_loss (scalars in the router's
  // dtype, differentiable) and stats.
  at::Tensor forward(const at::Tensor& x);

  // rows [n, d], every expert's rows consecutive (counts[e] of them for expert e, in order) ->
  // [n, d]: MLP_e of each row. The experts' part of forward (expert parallelism runs it on the
  // rows it receives).
  at::Tensor run_experts(const at::Tensor& rows, const std::vector<int64_t>& counts) const;

  at::Tensor router;          // [E, d]
  at::Tensor fc_w, fc_b;      // [E_local, F, d], [E_local, F]   (E_local = E / ep: this rank's experts; SwiGLU: 2F)
  at::Tensor proj_w, proj_b;  // [E_local, d, F], [E_local, d]   (biases undefined without them)
  at::Tensor aux_loss, z_loss;  // the last call's
  MoEStats stats;               // the last call's
  at::Tensor step_stats;        // [moe_stats_width(E)] float, summed over grad-mode calls; undefined: none yet
  double loss_backward_scale = 1.0;
  // The experts' SwiGLU: kiln's kernel on CUDA or the composite ops (kernels/swiglu.h).
  Kernels kernels = Kernels::reference;
  // The experts' products in float8 (--precision fp8 --fp8-recipe rowwise; GPT::set_float8): off by
  // default and under tensorwise, whose scale over an expert's rows would depend on which ranks'
  // tokens reached it. Rowwise scales a token's row by itself in y and dX; only dW's scales (a
  // feature's amax over the expert's tokens) see the batch the expert got.
  Float8Scaling float8;
  const MoEConfig& config() const { return cfg_; }

 private:
  MoEConfig cfg_;
  std::shared_ptr<const LayerOps> ops_;
};

// The capacity C for a group of n tokens (0: unlimited).
int64_t moe_capacity(const MoEConfig& cfg, int64_t n_tokens);

}  // namespace kiln
