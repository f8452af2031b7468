// parallel/tensor_parallel.h -- 1D tensor parallelism (Megatron-LM: Shoeybi et al., 2019): the
// communication primitives as autograd functions, and the layers built from them.
//
// A group of t ranks splits each weight matrix. With X [.., K] the input and A [K, N] a layer's
// matrix (kiln stores A^T, LibTorch's [N, K] weight):
//   column-parallel   A = [A_1 .. A_t] by columns; rank i computes Y_i = X A_i  [.., N/t]
//                     forward: the input is used as is (copy_to_tp: identity);
//                     backward: dX = sum_i dY_i A_i^T, an all-reduce over tp (copy_to_tp's).
//   row-parallel      A = [A_1; ..; A_t] by rows, X = [X_1 .. X_t] split the same way (the
//                     column-parallel layer's output); rank i computes X_i A_i and
//                     Y = sum_i X_i A_i is an all-reduce over tp (reduce_from_tp); backward:
//                     dX_i = dY A_i^T, local (reduce_from_tp's backward is the identity).
//                     The bias is added once, after the reduction.
// A column-parallel layer followed by a row-parallel one (attention: QKV then the output
// projection; MLP: up then down) costs one all-reduce of the activations [B, T, d] forward and
// one backward, per pair: 2 x 2 B T d bytes-of-dtype per layer pair and pass in CommStats' unit.
//
// Vocabulary parallelism: rank i holds the rows [i V'/t, (i+1) V'/t) of the (tied) embedding.
//   embedding         ids outside the rank's rows look up zero; the partial embeddings are
//                     all-reduced (reduce_from_tp).
//   cross-entropy     over logits split by vocabulary [N, V'/t] without ever gathering them:
//                       m = max_all(max_local z)               (all-reduce max)
//                       S = sum_all(sum_local exp(z - m))       (all-reduce sum)
//                       z_y = the target's logit, on the rank that holds it (all-reduce sum)
//                       loss_n = log S + m - z_y
//                     backward: dz = (softmax(z) - onehot(y)) dloss, on the local columns.
//                     Traffic: three all-reduces of N floats, never N x V'.
// Each primitive takes its group explicitly; nothing here is global.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "distributed/comm.h"
#include "kernels/float8.h"
#include "kernels/kernel_choice.h"
#include "parallel/main_grads.h"

namespace kiln {

// Forward: identity. Backward: the gradient all-reduced (summed) over tp.
at::Tensor copy_to_tp(const at::Tensor& x, const std::shared_ptr<Communicator>& tp);
// Forward: x all-reduced (summed) over tp. Backward: identity.
at::Tensor reduce_from_tp(const at::Tensor& x, const std::shared_ptr<Communicator>& tp);

// x [.., K] full; weight [N/t, K] this rank's rows of the full [N, K]; bias [N/t] or undefined.
// Returns this rank's output columns [.., N/t].
// float8: the layer's float8 scaling with tp's amax reductions, or null (kernels/matmul.h).
at::Tensor column_parallel_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                  const std::shared_ptr<Communicator>& tp, const Float8Scaling* float8 = nullptr);
// x [.., K/t] this rank's input columns; weight [N, K/t] this rank's columns of the full [N, K];
// bias [N] (whole, added once) or undefined. Returns the full output [.., N].
at::Tensor row_parallel_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                               const std::shared_ptr<Communicator>& tp);

// ids: any shape, int64 in [0, V'); table [V'/t, d] this rank's rows, which start at
// vocab_start. Returns the full embeddings [.., d].
at::Tensor vocab_parallel_embedding(const at::Tensor& ids, const at::Tensor& table, int64_t vocab_start,
                                    const std::shared_ptr<Communicator>& tp);

// logits [N, V'/t] this rank's columns (starting at vocab_start); targets [N] int64 in
// [0, vocab). Columns at or past `vocab` (the padding of V') never enter the softmax.
// Returns the mean cross-entropy (fp32 scalar), the same on every tp rank.
// The composite way (Megatron's): the logits in fp32, the global max all-reduced, the shifted
// exponentials summed and all-reduced with the target logits; the fp32 softmax kept for backward.
// two_pass (the model's way with fused kernels on CUDA): each rank's (max m, sum s of exp(z - m))
// per row over its columns (kernels/classifier.h's softmax_row_stats: one read of the logits in
// their own dtype), M = max over tp of m, then S = sum over tp of s exp(m - M) with the target
// logits in one all-reduce, lse = M + log S; the logits (their dtype) and lse kept; backward
// dz = (exp(z - lse) - onehot) / N by softmax_xent_grad, one pass, in the logits' dtype.
// `kernels` picks the local passes' implementation (the reference runs them in ATen: the CPU
// tests the two-pass math that way).
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, int64_t vocab_start,
                                        int64_t vocab, const std::shared_ptr<Communicator>& tp, bool two_pass = false,
                                        Kernels kernels = Kernels::reference);

// ---- the model ---------------------------------------------------------------------------
// Runs fn with the device's default generator forked for `rank`: seeded from a hash of the
// generator's current state (the same on every rank of a group: the replicated region draws
// alike) and the rank, then restored, so the main stream is as if fn had drawn nothing.
// Deterministic: activation checkpointing replays the same state, hence the same fork.
at::Tensor with_rank_rng(c10::Device device, int64_t rank, const std::function<at::Tensor()>& fn);

// The layer factory: this rank's ModelShard (models/gpt.h) -- its slice sizes and the LayerOps
// above, bound to the tp group. Split: attention heads (c_attn by output rows, q, k and v heads
// each divided; attn.c_proj by input columns), the MLP width (c_fc rows, mlp.c_proj columns),
// the padded vocabulary (wte rows, shared by the embedding and the tied output layer).
// Replicated: LayerNorms, wpe, the row-parallel layers' biases; their gradients are the same on
// every tp rank (their inputs and output gradients are), so they need no tp reduction.
// Memory per rank: the split weights / t; per layer and micro-batch, activations of the split
// layers / t, the replicated ones (LayerNorm inputs, residual stream) whole.
// Communication per layer and pass: two all-reduces of [B, T, d] (attention, MLP), plus the
// embedding's forward all-reduce and three of [B T] floats for the loss.
// KV heads are divided over tp where tp divides them, replicated where tp exceeds them (each rank
// keeps the head its query heads use; the sharers sum its rows' gradients; docs/tensor_parallel.md).
struct ModelShard;
class AdamW;
class GPT;
struct GPTConfig;

// ConfigError, one line, when tp does not divide the heads, the kv heads, d_model, the MLP
// width or the padded vocabulary.
void check_tensor_parallel(const GPTConfig& cfg, int64_t tp);
// sequence_parallel: Megatron's SP (parallel/sequence_parallel.h): the residual stream split by
// rows over tp, the ops' collectives all-gathers and reduce-scatters; the caller also calls
// sum_replicated_gradients_over_tp on the model.
ModelShard make_tensor_parallel_shard(const GPTConfig& cfg, const std::shared_ptr<Communicator>& tp,
                                      bool sequence_parallel = false);
// Rank r's slice of whole-model parameter `name` under t-way tensor parallelism (w: its whole
// tensor; w itself when the parameter is replicated or t is 1).
at::Tensor tp_slice_of(const std::string& name, const at::Tensor& w, const GPTConfig& cfg, int64_t t, int64_t r);
// The inverse: the whole tensor (of shape whole_shape) from pieces[r], rank r's slice, r < t.
at::Tensor tp_assemble(const std::string& name, const std::vector<at::Tensor>& pieces, at::IntArrayRef whole_shape,
                       const GPTConfig& cfg);
// GPT::init_weights' slicer for tp rank `rank` of `tp`.
std::function<at::Tensor(const std::string&, const at::Tensor&)> tp_slicer(const GPTConfig& cfg, int64_t tp, int64_t rank);
// Whether parameter `name` (GPT's names) is split over tp; the others are replicated.
bool is_tensor_parallel(const std::string& name);
// A split parameter's local tensor (or its gradient) as pieces with the weight each takes in a
// sum over tp that counts every element of the whole model once: 1, except the kv rows of
// c_attn when tp replicates the kv heads (each held by tp / KV ranks): KV / tp.
std::vector<std::pair<at::Tensor, double>> tp_weighted_pieces(const std::string& name, const at::Tensor& local,
                                                              const GPT& model);
// The global gradient norm of a tensor-parallel model: norm^2 = sum over tp of the split
// parameters' squares + the replicated ones' (counted once). Returns the norm / grad_scale (fp16's
// loss scale), a 0-dim fp32 tensor; the clipping is the optimizer's (optim/grad_clip.h's
// clip_factor, applied by AdamW::step). grads: where each parameter's gradient is
// (parallel/main_grads.h; empty: its .grad()).
at::Tensor grad_norm_tp(GPT& model, double grad_scale, const std::shared_ptr<Communicator>& tp, const GradOf& grads = {});

}  // namespace kiln
