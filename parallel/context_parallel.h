// parallel/context_parallel.h -- context parallelism: each sequence split over a cp group, for
// sequences too long for one rank's activations (Llama 3, Dubey et al. 2024, s3.3.2; Megatron-
// Core's CP).
//
// The sequence of T tokens is cut into 2n chunks of C = T / 2n; rank i of the n cp ranks holds
// chunks i and 2n-1-i (positions [iC, (i+1)C) and [(2n-1-i)C, (2n-i)C), 2C = T/n in all). Under
// causal attention a query at position p costs p + 1 key positions, so contiguous shards would
// give the last rank ~2n-1 times the first one's work; with the mirrored pairs every rank's
// attention costs the same: the sum of (p + 1) over its positions is C^2 (2n - 1) + C (C + 1)
// for every i.
//
// Every layer but attention is position-wise: it runs on the rank's 2C positions with the
// model's own weights (replicated over cp). Position embeddings and residual dropout masks are
// taken at the rank's positions (models/gpt.h: LayerOps::seq_rows; each dropout mask drawn for
// the whole sequence, so the masks are the unsplit run's). Attention:
//   K, V [B, KV/t, 2C, h] -> all-gather over cp (keys and values stacked, one call) -> the whole
//   sequence's [B, KV/t, T, h], put in position order; the rank's queries attend with the mask
//   M[j, k] = (k <= pos(j)) -- exact causal attention, nothing approximated. M is passed as an
//   additive bias (0 / -inf, the compute dtype) made once for the run and shared by every layer:
//   the fused kernels keep their bias for backward, so a mask per layer (or a boolean one, which
//   SDPA converts per call) would keep a [2C, T] tensor per layer.
//   backward: dK, dV of the whole sequence -> reduce-scatter over cp: the sum of every rank's
//   contributions to its own keys' and values' gradients.
// The all-gather rather than a ring of point-to-point steps (Llama 3's choice for GQA models):
// K and V are the small tensors (KV heads <= heads), the exchange is one collective the
// backends already have, and the attention kernel runs once on whole tensors. The cost: the
// whole K and V stay alive per layer until backward.
// Bytes per layer and micro-batch, comm_bytes' unit (distributed/comm.h): forward all-gather
// 2 B (KV/t) T h a (a = bytes of the compute dtype), backward reduce-scatter 2 B (KV/t) T h a'
// (a' = the gradient's dtype, the same), again per recomputed forward.
// Memory per rank: every activation / cp, except the attention's saved K and V, whole:
// 2 B (KV/t) T h a per layer (plus, on the CPU's math path, the [B, H/t, 2C, T] scores), and
// the one shared bias, a 2C T bytes.
//
// Gradients: each cp rank's loss is the mean over its 2C positions of each sample; the global
// loss is the mean over all T, i.e. the average of the cp ranks' means (equal counts). Averaging
// gradients over the dp x cp group (distributed/mesh.h: dp_cp) is therefore exact; DDP and ZeRO run
// over that group. Attention-probability dropout draws from a stream of each rank's own (as
// tensor parallelism's heads do: parallel/tensor_parallel.h, with_rank_rng).
//
// With --sp (sequence parallelism in the tp group; Megatron's layout, cp outside and tp / sp
// inside): the tp ranks of a cp rank split its 2C positions further into t blocks of 2C / t (2 cp
// tp must divide T); the residual stream holds those rows, the column layers' all-gathers over tp
// rebuild the cp chunk for q, k, v (LayerOps::attention_rows: rotary positions at the chunk's),
// and K, V are then gathered over cp as above. Every per-token activation is / (cp t) outside
// the tp layers' gathered inputs.
// With pipeline parallelism: each stage's blocks run on the rank's rows, a boundary carries
// [B, T / (cp t), d] (parallel/pipeline.h).
#pragma once

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

#include "distributed/comm.h"

namespace kiln {

struct GPTConfig;
struct ModelShard;

// ConfigError, one line, when 2 cp does not divide the sequence length.
void check_context_parallel(const GPTConfig& cfg, int64_t cp);
// The positions cp rank r of n holds in a sequence of T (int64 [T / n]): chunks r and 2n-1-r.
at::Tensor context_positions(int64_t T, int64_t n, int64_t r, c10::Device device = c10::Device(c10::kCPU));
// shard (tensor-parallel or whole) made context-parallel over `cp`: GPT::loss takes the rank's
// tokens, the attention gathers K and V (LayerOps::gather_kv); attention dropout draws from a
// stream of its (tp, cp) rank's own.
ModelShard make_context_parallel(ModelShard shard, const GPTConfig& cfg, const std::shared_ptr<Communicator>& cp);

}  // namespace kiln
