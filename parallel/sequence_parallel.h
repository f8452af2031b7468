// parallel/sequence_parallel.h -- sequence parallelism inside the tensor-parallel group
// (Megatron-LM's SP: Korthikanti et al., 2022, "Reducing Activation Recomputation in Large
// Transformer Models", s4.2.2), and the row-gathering collectives it and context parallelism use.
//
// Under 1D tensor parallelism (parallel/tensor_parallel.h) the regions between the split layers
// -- LayerNorms, residual adds, residual dropout -- run on the whole [B, T, d] on every tp rank:
// replicated work and replicated activations. With --sp each of the t ranks keeps T/t positions
// of the residual stream, rank r the rows [r T/t, (r+1) T/t), and the tp layers' two collectives
// are split in halves that move the same bytes:
//   entering a column-parallel layer (c_attn, c_fc, the tied output layer; gathered_linear):
//     forward  X = all_gather_rows(X_r)        [B, T/t, d] -> [B, T, d]    (was: identity)
//     backward dX_r = reduce_scatter_rows(dX)  the sum over tp, rank r's rows (was: all-reduce)
//              and X gathered again for dW = dY^T X: the layer keeps X_r, not X, for backward
//   leaving a row-parallel layer (attn.c_proj, mlp.c_proj, the vocabulary-parallel embedding):
//     forward  Y_r = reduce_scatter_rows(sum_i X_i A_i)                     (was: all-reduce)
//     backward dY = all_gather_rows(dY_r)                                   (was: identity)
//   the row-parallel bias is added to the rank's rows after the reduce-scatter.
// In comm_bytes' unit (distributed/comm.h) an all-reduce of [B, T, d] counts 2 B T d, an all-gather
// and a reduce-scatter B T d each: the same per layer pair and pass, plus the backward's second
// gather of each column-parallel layer's input (B T d in the compute dtype; 2 per layer and 1
// for the head). Activations of the replicated regions, and the column-parallel layers' saved
// inputs, per rank: / t (Korthikanti's 34 s b h / t + 5 a s^2 b / t per layer).
//
// Parameters of the replicated regions (LayerNorm scales and shifts, the row-parallel biases,
// wpe, ln_f) see only their rank's rows, so their gradients are partial sums: a hook on each adds
// the tp ranks' parts (an all-reduce over tp of the incoming gradient, before it is accumulated)
// so every rank holds the whole gradient, as without --sp. Traffic: 2 x (the parameter's bytes)
// per parameter and backward pass (per micro-batch).
//
// Residual dropout draws the mask of the whole [B, T, d] (the generator's state is the same on
// every tp rank) and keeps the rank's rows (models/gpt.h: residual_dropout): the masks are the
// unsplit tp run's, position for position.
//
// Rows are along dim 1 ([B, T, ...], rank-major): all_gather_rows puts rank r's block at
// [r n, (r+1) n); reduce_scatter_rows sums over the group and keeps block r. Both take the group
// explicitly.
#pragma once

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

#include "distributed/comm.h"
#include "kernels/float8.h"

namespace kiln {

class GPT;

// The group's blocks of x along `dim`, concatenated in rank order, without autograd (integer
// tensors too: an MoE layer's routing choices under a split sequence).
at::Tensor gather_rows(const at::Tensor& x, int64_t dim, Communicator& group);
// Forward: the group's blocks of x along `dim`, concatenated in rank order. Backward: the
// gradient summed over the group, this rank's block (a reduce-scatter).
at::Tensor all_gather_rows(const at::Tensor& x, int64_t dim, const std::shared_ptr<Communicator>& group);
// Forward: x summed over the group, this rank's block of x.size(dim) / n along `dim` (a
// reduce-scatter). Backward: the gradient's blocks gathered (an all-gather).
at::Tensor reduce_scatter_rows(const at::Tensor& x, int64_t dim, const std::shared_ptr<Communicator>& group);

// y = all_gather_rows(x, 1) W^T + b (b may be undefined): a column-parallel layer under sequence
// parallelism that keeps only x's rows for backward and gathers them again there (one more
// all-gather of [B, T, K] in the compute dtype per backward, for activations / t). Backward: dx
// = reduce_scatter_rows(dy W) in x's dtype, dW = dy^T gather(x), db = sum dy.
// A float8 layer (`float8` on, with tp's reductions of W's and the output gradient's amax):
// tensorwise, x's rows are quantised with the group's amax and gathered in 8 bits
// (Float8Scaling::gather_rows: half the forward gather's bytes), the float8 layer
// (kernels/float8.h) multiplies the whole and keeps its 8-bit copy for backward (1 byte an
// element of the whole, where the 16-bit way keeps 2 of x's rows: the same bytes at tp 2, and no
// gather in backward); dx is reduce-scattered in x's dtype as above. Rowwise: x is gathered in
// the compute dtype (its dW quantises x along the tokens, from the 16-bit values), then the float8
// layer multiplies the whole.
at::Tensor gathered_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                           const std::shared_ptr<Communicator>& group, const Float8Scaling* float8 = nullptr);

// Registers, on every parameter of `model` that tensor parallelism replicates, a hook that sums
// its incoming gradient over tp before it is accumulated (the LayerNorms, row-parallel biases,
// wpe and ln_f of a sequence-parallel model). The model must outlive the hooks' use.
// head_norms_only: Qwen3's q_norm and k_norm alone (plain tp: every other replicated parameter sees
// every row, but each rank norms only its own heads).
void sum_replicated_gradients_over_tp(GPT& model, const std::shared_ptr<Communicator>& tp, bool head_norms_only = false);

}  // namespace kiln
