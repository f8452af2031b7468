// models/gpt.h -- the decoder (GPT-2 and the Llama family: models/gpt_config.h) as a LibTorch module.
//
// Shapes (B batch, T sequence, d = d_model, H heads, KV kv-heads, h = d/H, V' padded vocab):
//   x   = wte[idx] + wpe[0..T)         (learned positions; under rope: wte[idx])   [B, T, d]
//   per block:  x = x + drop(c_proj(attn(ln_1(x))))              attention, causal
//               x = x + drop(mlp(ln_2(x)))
//                   gelu:   mlp.c_proj(gelu_tanh(mlp.c_fc(.)))
//                   swiglu: mlp.c_proj(silu(gate) * up), [gate | up] = mlp.c_fc(.)
//   logits = ln_f(x) @ wte^T          (tied; untied: @ lm_head^T)                 [B, T, V']
//   loss = mean cross-entropy over the first vocab_size logits (padding never enters the loss)
// ln_* are LayerNorms (weight, bias) or RMSNorms (weight: x / sqrt(mean(x^2) + eps) * weight).
// Attention: c_attn produces q [B,T,H,h], k and v [B,T,KV,h]; under rope q and k are turned by
// their positions' angles (models/rotary.h); scaled_dot_product_attention (flash / cuDNN /
// memory-efficient kernels on GPU) with is_causal and enable_gqa. Linear layers have biases as
// GPTConfig::bias says (all, none, or c_attn's only).
//
// Parameter names follow Hugging Face GPT2LMHeadModel's "transformer.*" names (wte, wpe,
// h.N.ln_1, h.N.attn.c_attn, ...); Linear weights are stored [out, in] as torch.nn.Linear
// does (HF's Conv1D stores the transpose; the checkpoint writer transposes).
//
// The model holds no parallelism code: data parallelism, sharding and checkpointing are
// applied from outside (parallel/), as torchtitan does. What it offers them is three hook points,
// each a std::function that is empty by default (an empty hook runs the plain code, so the
// numerics are those of the model without hooks): GPT::block_runner (how a block is run),
// AttentionImpl::core (the attention core) and MLPImpl::gelu_proj (c_proj(gelu(h))).
//
// Tensor parallelism enters through ModelShard (below): the model is built with this rank's
// part of each split layer (heads, MLP columns, vocabulary rows) and applies those layers
// through the LayerOps it is given; parallel/tensor_parallel.h makes both. With the default
// shard (tp = 1, empty ops) the model is the plain one.
//
// Sequence and context parallelism enter through the same LayerOps: the residual stream then
// holds some positions of each sequence (LayerOps::seq_rows); the model takes those positions'
// embeddings and dropout masks, and lets the ops gather what a layer needs whole (the tp layers'
// inputs, the head's among them; the attention's keys and values).
//
// Pipeline parallelism enters through ModelShard too: a stage holds one chunk of contiguous
// blocks (their parameters keep their whole-model names, h.<i>...), or under the interleaved
// schedule V non-adjacent chunks (parallel/pipeline_interleaved.h); the first stage also the
// embedding (wte, wpe), the last one ln_f and the tied output layer (its own copy of wte). A
// stage runs embed() (first), run_blocks(x, chunk) for each chunk, head_loss() (last);
// parallel/pipeline.h moves the activations between stages.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include "kernels/float8.h"
#include "kernels/kernel_choice.h"
#include "models/gpt_config.h"
#include "models/moe.h"
#include "models/rotary.h"

namespace kiln {

// y = x W^T + b, W [out, in]; without a bias (bias undefined) y = x W^T.
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in, int64_t out, const at::TensorOptions& opts, bool with_bias = true);
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor weight, bias;
  // Float8 products (--precision fp8; GPT::set_float8): off by default. The tp ops add the
  // reductions of the split tensors' amax (parallel/tensor_parallel.cpp). Its weight cache
  // (GPT::keep_float8_weights) serves training-mode forwards only: in eval mode W is quantised afresh.
  Float8Scaling float8;
};

// How the model applies its split layers: empty functions run the plain ops.
struct LayerOps {
  // y = x W^T + b of a column-split layer (c_attn, mlp.c_fc): x whole, y this rank's columns.
  std::function<at::Tensor(const at::Tensor&, const LinearImpl&)> column;
  // y = x W^T + b of a row-split layer (attn.c_proj, mlp.c_proj): x this rank's columns, y whole.
  std::function<at::Tensor(const at::Tensor&, const LinearImpl&)> row;
  // wte[idx], with wte this rank's vocabulary rows.
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> embed;
  // Mean cross-entropy of hidden @ wte^T (hidden [B, T_local, d], this rank's rows of ln_f's
  // output) against targets [B, T] over the real vocabulary (fp32), with wte this rank's
  // vocabulary rows; the model's kernels choice (kernels/kernel_choice.h) passed along.
  // rows (int64 [n]; undefined: every row): only those rows of the sequence's B x T (masked
  // targets: GPT::head_loss), targets then [n], those rows' own.
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, Kernels, const at::Tensor&)> loss;
  // y = x W^T + b of c_attn when it needs more than `column` (kv heads replicated over tp);
  // empty: `column`.
  std::function<at::Tensor(const at::Tensor&, const LinearImpl&)> qkv;
  // The sum over ranks of a row-split layer's partial products x_i W_i^T (no bias), for hooks
  // that compute the product themselves (MLPImpl::gelu_proj).
  std::function<at::Tensor(const at::Tensor&)> reduce;
  // Runs fn (the attention core, whose dropout draws per head) inside the tensor-parallel
  // region: with a random stream of this rank's own, so ranks holding different heads draw
  // different masks. Tensors on `device`.
  std::function<at::Tensor(c10::Device, const std::function<at::Tensor()>&)> in_tp_region;

  // ---- a split sequence (parallel/sequence_parallel.h, parallel/context_parallel.h) ----
  // The residual stream holds 1 / seq_split of each sequence's positions: the sequence's T
  // positions are T_local x seq_split. seq_rows(T, device): which positions (int64 [T_local]),
  // in the order the rank holds them; the model takes its position embeddings and draws its
  // residual dropout masks by them (each mask drawn for the whole [B, T, d] and this rank's rows
  // kept, so a split run draws the masks the unsplit one does). Empty: the whole sequence.
  int64_t seq_split = 1;
  std::function<at::Tensor(int64_t, c10::Device)> seq_rows;
  // The positions of the rows the attention's q, k and v hold (int64, in order), where they are
  // not every position: context parallelism's two chunks -- under --sp too, whose column layers
  // gather the cp chunk's rows over tp first, so they differ from seq_rows there. Rotary
  // positions are taken at them. Empty: 0 .. T-1.
  std::function<at::Tensor(int64_t, c10::Device)> attention_rows;
  // The sequence's rows gathered whole, in position order ([B, T_local, ...] -> [B, T, ...]),
  // without autograd: an MoE layer routes each sequence as one group (models/moe.h), so under a
  // split sequence its ranks agree on the sequence's choices first. Empty: the sequence is whole.
  std::function<at::Tensor(const at::Tensor&)> gather_sequence;
  // The factor a rank's part of a sequence-wide mean (the MoE layers' auxiliary losses) takes so
  // that the gradient reductions make it the whole's: cp (the gradients' mean over dp x cp), 1
  // under --sp alone (tp sums the replicated parameters' gradients).
  double sequence_loss_factor = 1.0;
  // The model's input rows for this rank: [B, T] token ids (or targets) -> [B, T_local] (context
  // parallelism: GPT::loss applies it). Empty: the whole sequence.
  std::function<at::Tensor(const at::Tensor&)> local_tokens;
  // The attention's keys and values [B, KV, T_local, h] -> those of the whole sequence [B, KV,
  // T, h], with the mask [T_local, T] (boolean, true: attend; or an additive 0 / -inf bias of the
  // compute dtype) that keeps attention causal for this rank's query positions (context
  // parallelism). Empty: local causal attention.
  std::function<std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&)> gather_kv;
  // The positions of gather_kv's keys, in the order it gives them (int64 [T]; --document-mask
  // under context parallelism makes its mask at them). Empty where gather_kv is.
  std::function<at::Tensor(int64_t, c10::Device)> gathered_key_rows;
  // The ops for decoding with a KV cache (runtime/inference/kv_cache.h), which runs whole sequences of
  // one token and cannot split them; null: these.
  std::shared_ptr<const LayerOps> unsplit;

  // ---- expert parallelism (parallel/expert_parallel.h) ----
  // The MoE layers' experts are divided over expert_split ranks: this one holds experts
  // [expert_rank E / expert_split, (expert_rank + 1) E / expert_split).
  // exchange_counts(counts): the E admitted counts of this rank (int64, on the device) to the
  // ranks holding those experts; returns c [expert_split, E / expert_split] (on the device), c[j][l]
  // the rows rank j will send this rank's local expert l. The layer issues it before its one host
  // read, which reads c with its own counts.
  // dispatch_experts(rows, counts, c, c_device, run_local): rows [n, d] sorted by expert, counts[e]
  // of them for expert e (all E), c as read (flattened) and c_device, exchange_counts' tensor; sends each expert's rows to the rank holding it,
  // calls run_local(arrived, local_counts) on what arrives there (rows of this rank's experts,
  // sorted by local expert) and returns the outputs [n, d] in rows' order. Empty: every expert on
  // this rank.
  int64_t expert_split = 1, expert_rank = 0;
  using ExpertRunner = std::function<at::Tensor(const at::Tensor&, const std::vector<int64_t>&)>;
  std::function<at::Tensor(const at::Tensor&)> exchange_counts;
  std::function<at::Tensor(const at::Tensor&, const std::vector<int64_t>&, const std::vector<int64_t>&, const at::Tensor&,
                           const ExpertRunner&)>
      dispatch_experts;
};

// This rank's part of a tensor-parallel model: tp ranks split the attention heads, the MLP
// width and the padded vocabulary (each must divide by tp; GPTConfig does not know tp, the
// caller checks). tp = 1: the whole model.
// Blocks [begin, end) of the model; end -1: n_layer.
struct BlockRange {
  int64_t begin = 0, end = -1;
};

struct ModelShard {
  int64_t tp = 1, rank = 0;
  std::shared_ptr<const LayerOps> ops = std::make_shared<LayerOps>();
  // Pipeline stage: its chunks of blocks, ascending and disjoint (one chunk of every block by
  // default; interleaved: V of them); `embedding` (first stage: wte lookup + wpe, run before
  // chunk 0), `head` (last stage: ln_f and the tied output layer, wte, run after the last chunk).
  std::vector<BlockRange> chunks{BlockRange{}};
  bool embedding = true, head = true;
  // The only stage (GPT's constructor checks that it then holds every block).
  bool whole_model() const { return embedding && head; }
};

// A LayerNorm (weight and bias), or with rms an RMSNorm (weight only; at::rms_norm).
class LayerNormImpl : public torch::nn::Module {
 public:
  LayerNormImpl(int64_t d, double eps, const at::TensorOptions& opts, bool rms = false);
  at::Tensor forward(const at::Tensor& x) const;
  // The residual add before the norm: s = x + r, then (s, norm(s)); one kernel each way when the
  // kernels are fused and x, r share a dtype (kernels/norm.h's add_norm), else x + r and forward.
  std::pair<at::Tensor, at::Tensor> forward_add(const at::Tensor& x, const at::Tensor& r) const;
  at::Tensor weight, bias;  // bias undefined for an RMSNorm
  double eps;
  bool rms;
  // Tests only: under autocast, compute in fp32 and return fp32, as CUDA's autocast runs
  // layer_norm (the CPU's keeps the input dtype), so a CPU test sees the dtypes a GPU run sees.
  bool fp32_under_autocast = false;
  // kiln's norm kernel on CUDA (kernels/norm.h: 16-bit in and out, fp32 statistics) or the
  // composite op (GPT::set_kernels sets it).
  Kernels kernels = Kernels::reference;
};

// The attention core: causal softmax(q k^T / sqrt(h)) v, dropout p on the probabilities, by
// scaled_dot_product_attention. q [B, H, T, h], k and v [B, KV, T, h] -> [B, H, T, h]; each kv
// head serves H / KV consecutive query heads. With `mask` ([Tq, Tk]: bool, true: attend, or an
// additive bias; context parallelism's queries against the whole sequence's keys) the mask
// replaces the causal rule.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout_p,
                            const at::Tensor& mask = {});
// scaled_dot_product_attention with grouped K/V heads (H / KV query heads per kv head), on a
// kernel that is not the math fallback wherever one exists: enable_gqa is taken by the flash
// kernel (and, by LibTorch version, others), but a mask (context parallelism's, the KV cache's)
// or fp32 inputs exclude flash, and SDPA would then run the math kernel -- [B, H, Tq, Tk] fp32
// scores, O(T^2) memory. So: ask LibTorch which kernel it would pick (_fused_sdp_choice, host-side
// checks only); where that is math, K and V are expanded to H heads (repeat_interleave, the same
// values the math kernel would make) so the memory-efficient or cuDNN kernel can take them.
// Equal heads: plain SDPA.
at::Tensor grouped_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal);
// --document-mask: each position's document, [B, T] int64: the count of `token`s (the one that
// opens every document) up to and including it -- so a document's opening token is its own first
// position, and what precedes a batch row's first one (the tail of a document cut by the packing)
// is document 0.
at::Tensor document_ids_of(const at::Tensor& idx, int64_t token);
// The attention mask of documents [B, T]: [B, 1, T, T] bool, true where key j is at or before query
// i in i's document (SDPA broadcasts it over the heads).
at::Tensor document_mask(const at::Tensor& document_ids);
// The mask of documents at some of the sequence's positions: queries at `queries` [Tq], keys at
// `keys` [Tk] (int64 positions in the sequence, in the order the attention holds them: context
// parallelism's rank chunks and gathered keys): [B, 1, Tq, Tk] bool, true where the key is at or
// before the query in the query's document -- and, with a sliding window W > 0, within its last W
// positions (i - W < j). Without documents (document_ids undefined): the causal rule (and the
// window) alone, [1, 1, Tq, Tk]. document_mask(ids) at every position, in order.
at::Tensor document_mask_at(const at::Tensor& document_ids, const at::Tensor& queries, const at::Tensor& keys,
                            int64_t window = 0);
// --document-positions restart: each position's index within its document, [B, T] int64 (what
// precedes a row's first opening token counts from the row's start).
at::Tensor document_positions_of(const at::Tensor& idx, int64_t token);
// A batch's attention mask where the causal rule is not the whole of it -- documents
// (--document-mask) and / or a sliding window shorter than the sequence (Mistral's) -- made once
// per forward (GPT::set_documents) and shared by every layer's attention: as SDPA's additive bias
// (0 / -inf) in the queries' dtype, made at the first layer that asks and then the same tensor for
// all -- SDPA would otherwise convert a boolean mask into a new bias in every layer, each kept for
// backward ([B, 1, T, T] of 2 bytes a layer). Under context parallelism at the rank's queries and
// the gathered keys ([B, 1, 2C, T]: never the whole [T, T]).
struct AttentionMask {
  at::Tensor ids;        // document_ids_of(tokens), [B, T]: the whole sequence's; undefined: no documents
  at::Tensor order;      // 0 .. T-1 (int64, the tokens' device): the positions where the attention holds them all
  int64_t batch = 0;     // B, the tokens' rows
  int64_t window = 0;    // the sliding window (0: none)
  at::Tensor positions;  // --document-positions restart: document_positions_of(tokens); undefined: the sequence's
  at::Tensor bias;       // the mask as a bias in the dtype last asked for
  at::Tensor starts;     // flash's variable-length path: cu_seqlens, made at the first layer that asks
  // queries / keys: the positions the attention holds (undefined: every position, in order).
  const at::Tensor& bias_in(at::ScalarType dtype, const at::Tensor& queries = {}, const at::Tensor& keys = {});
  // The B x T rows cut into sequences -- each batch row, and within it each document --, as flash
  // attention's cumulative lengths: int32 [n + 1], 0 first and B T last (one wait for the device:
  // the count of documents).
  const at::Tensor& cu_seqlens();
};
// Documents and the sliding window through flash attention's variable-length kernel
// (at::_flash_attention_forward with cumulative sequence lengths, its left window W - 1; the
// backward is LibTorch's own, FlashAttentionBackward0), in place of the mask: the B x T rows
// packed as one [B T, heads, h] sequence cut at mask.cu_seqlens(), causal within each piece.
// O(T) memory and no masked-out tile computed, where the masked kernel makes and reads a [B, 1,
// T, T] bias. q [B, H, T, h], k and v [B, KV, T, h] -> [B, H, T, h]. The max length passed is T
// (an upper bound: flash sizes its grid by it). Eligible (varlen_flash_eligible): CUDA, 16-bit q,
// k and v of one dtype, a head width flash takes (a multiple of 8, at most 256), H a multiple of KV, --kernels
// fused, no context parallelism (its gathered keys are not rows of the sequence) and no
// selective-recomputation hook. The reference: causal_attention with mask.bias_in (the gpu test).
bool varlen_flash_eligible(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Kernels kernels);
at::Tensor varlen_flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, AttentionMask& mask,
                                  double dropout_p);
// Residual dropout of x [B, T_local, d] under `ops`: at::dropout, or with a split sequence the
// whole sequence's mask at this rank's rows (LayerOps::seq_rows).
at::Tensor residual_dropout(const at::Tensor& x, double p, const LayerOps& ops);

class AttentionImpl : public torch::nn::Module {
 public:
  // rope: the model's rotary tables (shared by its blocks), null for learned positions.
  AttentionImpl(const GPTConfig& cfg, const at::TensorOptions& opts, const ModelShard& shard = {},
                std::shared_ptr<RotaryEmbedding> rope = nullptr);
  at::Tensor forward(const at::Tensor& x);  // [B, T, d] -> [B, T, d]
  // The heads of x [B, T, d] (c_attn through `ops`, the model's when null): q [B, H, T, h], k and
  // v [B, KV, T, h], q and k turned to `positions` under rope (int64 [T]; undefined: 0 .. T-1).
  // (The KV cache passes the unsplit ops: runtime/inference/kv_cache.h.)
  std::tuple<at::Tensor, at::Tensor, at::Tensor> heads(const at::Tensor& x, const at::Tensor& positions = {},
                                                       const LayerOps* ops = nullptr);
  // c_proj of the attention's output y [B, H, T, h] -> [B, T, d], through `ops` (null: the model's).
  at::Tensor project(const at::Tensor& y, const LayerOps* ops = nullptr);
  std::shared_ptr<LinearImpl> c_attn, c_proj;
  // Qwen3's RMSNorms over each query and key head before the rotary turn (GPTConfig::qk_norm;
  // null otherwise). Replicated over tp, each rank norming its own heads: their gradients are
  // parts, summed over tp (parallel/tensor_parallel.h).
  std::shared_ptr<LayerNormImpl> q_norm, k_norm;
  // Hook for the attention core, called as core(q, k, v, dropout_p, mask) with causal_attention's
  // arguments; empty: causal_attention. (Set by parallel/activation_checkpoint.h.)
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, double, const at::Tensor&)> core;
  // This rank's query and key/value heads, and the head width (runtime/inference/kv_cache.h reads them).
  int64_t n_head() const { return n_head_; }
  int64_t n_kv_head() const { return n_kv_head_; }
  int64_t head_dim() const { return head_dim_; }
  // The batch's attention mask (GPT::set_documents makes it from the tokens: documents under
  // --document-mask, the sliding window; null: plain causal attention). A query then sees the keys
  // at or before it in its own document only, and within the window.
  std::shared_ptr<AttentionMask> mask;
  // fused: on CUDA a mask goes through flash's variable-length kernel where it can
  // (varlen_flash_attention); reference: the masked SDPA kernel (GPT::set_kernels sets it).
  Kernels kernels = Kernels::reference;

 private:
  int64_t n_head_, n_kv_head_, head_dim_;  // this rank's heads
  double dropout_;
  std::shared_ptr<const LayerOps> ops_;
  std::shared_ptr<RotaryEmbedding> rope_;
};

class MLPImpl : public torch::nn::Module {
 public:
  MLPImpl(const GPTConfig& cfg, const at::TensorOptions& opts, const ModelShard& shard = {});
  at::Tensor forward(const at::Tensor& x);  // c_proj(gelu_tanh(c_fc(x))), or SwiGLU's c_proj(silu(gate) * up)
  // The same through `ops` (the KV cache's unsplit ones), without the hook.
  at::Tensor forward_with(const at::Tensor& x, const LayerOps& ops) const;
  std::shared_ptr<LinearImpl> c_fc, c_proj;  // SwiGLU: c_fc [2F, d] holds gate's rows, then up's
  Kernels kernels = Kernels::reference;       // SwiGLU's silu(gate) * up: kernels/swiglu.h
  // With kernels fused: GELU's bias + activation inside cuBLASLt's products (kernels/gelu_mlp.h),
  // where the layer is whole (no tp ops) and no hook replaces c_proj(gelu(.)).
  bool gelu_epilogue = false;
  // Hook for gelu_tanh(h) W^T + b with W, b = c_proj's, called as gelu_proj(h, W, b) with
  // h = c_fc(x) [B, T, 4d / tp]; under tensor parallelism b is zero (the bias is added once,
  // after LayerOps::reduce). Empty: the plain ops. (Set by parallel/activation_checkpoint.h;
  // a GELU feed-forward's only.)
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)> gelu_proj;
  bool swiglu() const { return swiglu_; }

 private:
  std::shared_ptr<const LayerOps> ops_;
  bool swiglu_ = false;
};

// A transformer block. Its feed-forward is the dense MLP, or, in the MoE blocks of an MoE model
// (GPTConfig::is_moe_layer), a Mixture-of-Experts layer (models/moe.h) over the block's
// sequences, with every expert on this rank or, under expert parallelism, this rank's share of
// them (LayerOps::expert_split): exactly one of mlp and moe is set. Under tensor
// parallelism the MoE layer is replicated (each tp rank routes and runs the same tokens; its
// gradients are equal on every tp rank, as a LayerNorm's).
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const GPTConfig& cfg, const at::TensorOptions& opts, const ModelShard& shard = {}, int64_t index = 0,
            std::shared_ptr<RotaryEmbedding> rope = nullptr);
  at::Tensor forward(const at::Tensor& x);
  // The block with its residual adds deferred into the norms after them (kernels/norm.h's
  // add_norm): s = x + pending (pending: the previous block's branch output, undefined for none)
  // added inside ln_1; returns (y, m) with the block's output y + m left for its consumer -- the
  // next block's ln_1 or ln_f -- to add the same way. forward(x) is forward_deferred(x, {}) summed.
  // The same ops in the same order as forward's chain (x + r, then the norm), so the reference path
  // is bit for bit the same; with the fused kernels each block boundary's add and norm are one
  // kernel each way (GPT::run_blocks_deferred).
  std::pair<at::Tensor, at::Tensor> forward_deferred(const at::Tensor& x, const at::Tensor& pending);
  std::shared_ptr<LayerNormImpl> ln_1, ln_2;
  std::shared_ptr<AttentionImpl> attn;
  std::shared_ptr<MLPImpl> mlp;  // null in an MoE block
  std::shared_ptr<MoEImpl> moe;  // null in a dense block

 private:
  double dropout_;
  std::shared_ptr<const LayerOps> ops_;
};

class GPT : public torch::nn::Module {
 public:
  // Allocates (uninitialised) parameters with `opts` (dtype float32; device cpu, cuda, or meta
  // for shape-only models). Call init_weights() before training.
  // shard: this rank's part under tensor parallelism (default: the whole model).
  GPT(const GPTConfig& cfg, const at::TensorOptions& opts = at::TensorOptions(), ModelShard shard = {});

  // GPT-2 initialisation, drawn on the CPU from a generator seeded with `seed`, so the weights
  // are the same whatever the device and layout: N(0, 0.02) for matrices and token embeddings,
  // N(0, 0.01) for positions, N(0, 0.02/sqrt(2L)) for the residual projections (attn.c_proj,
  // mlp.c_proj), zero biases, unit LayerNorm scales, zero padding rows of wte. No-op on the meta
  // device. A shard draws every parameter of the whole model, one at a time, and keeps its part:
  // a pipeline stage its own parameters, a tensor-parallel shard `slice`(name, whole) of each
  // (parallel/tensor_parallel.h: tp_slicer); no rank ever holds the whole model.
  using TensorSlicer = std::function<at::Tensor(const std::string& name, const at::Tensor& whole)>;
  void init_weights(uint64_t seed, const TensorSlicer& slice = nullptr);

  // Residual stream after ln_f: [B, T] token ids -> [B, T, d].
  at::Tensor hidden(const at::Tensor& idx);
  // --document-mask (document_token >= 0) and a sliding window shorter than idx's sequence: every
  // block's attention takes idx's mask (AttentionImpl::mask, one for all); otherwise none.
  // hidden() and loss() call it, and a pipeline stage before its blocks (needs_mask()).
  void set_documents(const at::Tensor& idx);
  bool needs_mask() const { return document_token >= 0 || cfg_.sliding_window > 0; }
  // The parts a pipeline stage runs (the whole model runs all three in hidden() / loss()):
  // wte[idx] + wpe (first stage) [B, T] -> [B, T, d]; this stage's blocks [B, T, d] -> [B, T, d];
  // ln_f, the tied output layer and the mean cross-entropy (last stage) -> scalar; without tensor
  // parallelism in chunks of rows, never holding the whole fp32 logits (loss_chunk_rows).
  at::Tensor embed(const at::Tensor& idx);
  at::Tensor run_blocks(const at::Tensor& x, int chunk = 0);  // chunk: of shard().chunks
  // run_blocks with the last block's residual add left undone: (y, m), the output y + m (the blocks
  // chained by BlockImpl::forward_deferred; with a block_runner -- recomputation -- each block whole
  // and m undefined). head_loss and hidden() take the pair into ln_f's add_norm.
  std::pair<at::Tensor, at::Tensor> run_blocks_deferred(const at::Tensor& x, int chunk = 0);
  // pending: a residual add still to make before ln_f (run_blocks_deferred's m; undefined: none).
  // Masked targets (loss_targets_per_term > 0): only the rows whose target is trained on go
  // through the output layer and the loss (their indices found on the host: one wait for the
  // device), and their mean is weighted by their count / loss_targets_per_term; a rank with none
  // puts one row through weighted 0, so every gradient a reduction waits for is still made.
  at::Tensor head_loss(const at::Tensor& x, const at::Tensor& targets, const at::Tensor& pending = at::Tensor());
  // This stage's blocks in order, all its chunks (every block of the whole model). h has n_layer
  // entries; those of other stages are empty placeholders without parameters.
  std::vector<std::shared_ptr<BlockImpl>> blocks() const;
  // Whether block i is this stage's, and which of its chunks holds it (-1: none).
  int chunk_of_block(int64_t i) const;
  // Logits over the padded vocabulary: [B, T] -> [B, T, V'].
  at::Tensor logits(const at::Tensor& idx);
  // Mean next-token cross-entropy: idx and targets [B, T] int64 -> scalar.
  at::Tensor loss(const at::Tensor& idx, const at::Tensor& targets);

  const GPTConfig& config() const { return cfg_; }
  const ModelShard& shard() const { return shard_; }
  int64_t num_params() const;  // counts the module's parameters (the tied wte once)

  // ---- Mixture-of-Experts (an MoE config; nothing otherwise)
  // This stage's MoE layers with their block numbers, in order.
  std::vector<std::pair<int64_t, std::shared_ptr<MoEImpl>>> moe_layers() const;
  // The factor the language-model loss is multiplied by before backward (loss scale / grad-accum):
  // the MoE losses' gradients take it too (MoEImpl::loss_backward_scale).
  void set_moe_loss_backward_scale(double scale);
  // The MoE layers' step_stats since the last call, as one float tensor [n_moe_layers x
  // moe_stats_width(E)] on `device`, row i for the model's i-th MoE layer (zero for another
  // stage's); clears them. Undefined for a dense model.
  at::Tensor take_moe_stats(c10::Device device);

  at::Tensor wte, wpe;  // [V', d], [T, d] (undefined on a pipeline stage that lacks them; wpe under rope)
  at::Tensor lm_head;   // [V', d]: the untied output layer (undefined when tied to wte)
  // The output layer's weight: lm_head, or wte when tied.
  const at::Tensor& output_weight() const { return lm_head.defined() ? lm_head : wte; }
  torch::nn::ModuleList h;
  std::shared_ptr<LayerNormImpl> ln_f;  // null on a pipeline stage other than the last
  // Hook that runs one block, called as block_runner(block, x) for x [B, T, d]; empty:
  // block.forward(x). (Set by parallel/activation_checkpoint.h.)
  std::function<at::Tensor(BlockImpl&, const at::Tensor&)> block_runner;
  // Rows per chunk of the output layer + cross-entropy (models/linear_cross_entropy.h): 0 picks
  // by size (256 MiB of fp32 logits per chunk); -1 runs the plain, whole-logits way (kept to
  // compare against: `kiln train --loss-chunk-rows -1`).
  int64_t loss_chunk_rows = 0;
  // --document-mask: the token that opens every document (the tokenizer's eot); attention then
  // stays inside documents (document_ids_of). -1: off.
  int64_t document_token = -1;
  // --document-positions restart (with document_token, rotary positions): each document's rotary
  // positions count from 0 at its opening token (document_positions_of); false: the sequence's.
  bool restart_positions = false;
  // Masked targets (data with a target mask, kiln prep --chat: some targets are kIgnoreTarget):
  // head_loss returns the sum of the trained targets' cross-entropy over this, rather than the
  // mean over its rows -- the step's trained targets divided by the loss terms the runtime
  // averages (micro-batches x dp x cp), so that their mean is the sum over every trained target of
  // the global batch divided by their count, whatever the layout. 0: unmasked data, the mean.
  double loss_targets_per_term = 0.0;
  // The chunked loss's logits in bf16 under bf16 compute (models/linear_cross_entropy.h; kiln
  // train --logits-dtype bf16); fp32 by default.
  bool logits16 = false;
  // Which implementation of the fused ops runs (kernels/kernel_choice.h): the norms, SwiGLU (the
  // dense MLP's and the experts') and the loss's softmax. Sets every module's choice; the loss's
  // is kernels() itself. Reference by default (the composite ops: what a model without the choice
  // computes).
  // gelu_epilogue: also GELU's bias and activation inside the products (kernels/gelu_mlp.h;
  // --gelu-epilogue), with k fused.
  void set_kernels(Kernels k, bool gelu_epilogue = false);
  Kernels kernels() const { return kernels_; }
  // --precision fp8 (kernels/float8.h): the blocks' linear layers -- attention's c_attn and
  // c_proj, the dense feed-forward's c_fc and c_proj, and under the rowwise recipe the experts'
  // (MoEImpl::float8); not the embedding or the output layer -- take float8 products with
  // `scaling` where the whole layer's shape passes float8_layer_eligible(auto_filter) and this
  // rank's part's dims are multiples of 16. Returns {this stage's layers in float8, this stage's
  // block layers}, an MoE layer's experts counted as 2 layers each (all of them, whichever ranks hold them). Call after set_kernels (the fused
  // GELU epilogue and the recomputation hook step aside for a float8 feed-forward).
  std::pair<int64_t, int64_t> set_float8(const Float8Scaling& scaling, bool auto_filter);
  // The float8 linear layers (not the experts) keep their weights' 8-bit forms for an optimizer
  // step (kernels/float8.h, Float8WeightCache): made by the step's first training-mode forward,
  // read by the step's later ones and by the backward. begin_float8_step starts a step (the trainer:
  // before each step's micro-batches); the weights must not change inside one. Off by default;
  // under ZeRO-3 the weights come gathered (in 8 bits, or in 16 to be quantised at each use).
  // Call after set_float8; returns the weight elements so kept (2 bytes each: both forms).
  int64_t keep_float8_weights();
  // The blocks' linear layers set_float8 put in float8 (not the experts), block by block;
  // with_qkv false leaves out c_attn.
  std::vector<LinearImpl*> float8_linears(bool with_qkv = true);
  void begin_float8_step() { ++*float8_clock_; }

 private:
  std::shared_ptr<int64_t> float8_clock_ = std::make_shared<int64_t>(0);
  Kernels kernels_ = Kernels::reference;
  GPTConfig cfg_;
  ModelShard shard_;
  std::shared_ptr<RotaryEmbedding> rope_;  // rotary positions' tables (null: learned positions)
};

}  // namespace kiln
