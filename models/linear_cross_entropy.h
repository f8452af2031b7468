// models/linear_cross_entropy.h -- the output layer and the mean cross-entropy in one step,
// without ever holding the whole fp32 logits (the memory-efficient loss of issue 8).
//
// For hidden states x [N, d], the tied embedding W [Vp, d] (Vp = the padded vocabulary, whose
// last Vp - V rows never meet a target) and targets t [N]:
//   z = x W^T [N, Vp];   loss = (1/N) sum_i ( logsumexp_{v < V} z_iv - z_i,t_i )
//   dloss/dz_iv = (softmax_{v < V}(z_i)_v - [v = t_i]) / N  (0 for v >= V)
//   dloss/dx = G W,   dloss/dW = G^T x,   G = dloss/dz
//
// The plain way (GPT-2's, and kiln's before this file) keeps the fp32 log-softmax (4 N V bytes)
// for backward; under bf16 its forward holds the logits (2 N Vp), their fp32 copy and the
// log-softmax at once, and its backward makes two fp32 gradients of that size beside the kept
// one: 12 N V bytes at the peak (9.9 GB for gpt2-124m at 16 x 1024 tokens). Here the rows go
// through in chunks of `chunk_rows`: a chunk's logits are made, reduced to its loss and turned
// into its rows of G in place; after the last chunk two matrix products give dloss/dx and
// dloss/dW, and only those are kept for backward ((N d + Vp d) 4 bytes: 0.2 GB there). Peak: G
// in the compute dtype (2 N Vp: 1.65 GB there) plus one chunk's fp32 work (256 MiB by default),
// and on the CPU under bf16 an fp32 copy of W for the products (4 Vp d: 0.15 GB there).
// The gradient is computed in the forward (as llm.c's fused classifier does): backward only
// scales it by the incoming gradient. Under no-grad (evaluation) no G is made.
//
// Passes over a chunk's logits (each a read or write of c x Vp elements; the first GPU profile
// found the older way at nine, a third of gpt2-124m's step on an H200): (1) the product writes z
// in fp32, its padding columns set to -inf (they leave the log-sum-exp, and their softmax, hence
// G's padding columns and W's padding rows' gradient, is exactly 0) -- from 16-bit operands by
// mm's out_dtype on CUDA, by upcasting the operands on the CPU (W once, x per chunk: not
// logits-sized), which has no such mm; (2) one log-softmax reads z and writes log p in fp32; (3)
// exp reads log p and writes G's rows
// rounded once to the compute dtype. The loss is -mean(log p at the targets), and G's target
// entries are overwritten with expm1(log p_t) = p_t - 1 from fp32. G stays unscaled (in [-1, 1]);
// the two products after the last chunk read it once each and apply 1/N as cuBLAS's alpha.
// With kiln's kernels on CUDA (`kernels`: fused; kernels/classifier.h) passes 2 and 3 are one
// kernel that reads z twice (the second time mostly from L2) and writes G's rows: no -inf fill,
// no log p in memory.
//
// Numerics: the logits are the products of the 16-bit operands accumulated and kept in fp32 (not
// rounded to the compute dtype as the plain way's are: closer to the exact loss), on CUDA and the
// CPU alike, and log-sum-exp and softmax run in fp32 as before; G is rounded to the compute dtype as the plain way rounds its
// gradient before the products (there after the 1/N, here before it: the same relative rounding). So bf16 and fp32 follow the plain way's arithmetic, up to the
// order of the loss's sum over rows and the incoming gradient (1/K under accumulation) being
// applied after the products rather than before. fp16 is not: its G (down to 1e-3 / N) would
// underflow before the loss scale could lift it, so under fp16 autocast the plain way runs.
//
// 16-bit logits (logits16, kiln train --logits-dtype bf16, bf16 compute only): the product writes
// z rounded to bf16, as autocast's at::linear does for the plain way and the PyTorch peers (one
// rounding of each logit more than above: 2^-9 relative, ~0.02 on a logit of 10), and the loss
// reads it in three passes of 2 bytes: the rows' (max, sum of exp) by the online log-sum-exp, the
// loss lse - z_t, the gradient exp(z - lse) - onehot written into G's rows
// (kernels/classifier.h's softmax_row_stats / softmax_xent_grad, tp's vocabulary-parallel
// passes; fused on CUDA, the same math in ATen ops elsewhere). Bytes per logit: 2 written + 6
// read and written, against 4 written + 4 read (+ 4 from L2) + 2 written in fp32: the figure is
// the GPU's A/B (docs/kernels.md).
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "kernels/kernel_choice.h"

namespace kiln {

// The mean cross-entropy over the first `vocab` columns of x W^T. x [N, d] (any float dtype; the
// products run in autocast's dtype when autocast is on for x's device), weight [Vp, d],
// targets [N] int64. chunk_rows <= 0: rows per chunk such that a chunk's fp32 logits take at
// most 256 MiB.
// logits16 (with a bf16 compute dtype; ignored otherwise): the logits in bf16 (see above).
at::Tensor linear_cross_entropy(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& targets,
                                int64_t vocab, int64_t chunk_rows = 0, Kernels kernels = Kernels::reference,
                                bool logits16 = false);

// The plain way, for comparison and for fp16: cross_entropy(linear(x, W)[:, :V].float(), t).
at::Tensor plain_linear_cross_entropy(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& targets,
                                      int64_t vocab);

}  // namespace kiln
