// parallel/pipeline.h -- pipeline parallelism: each of pp ranks holds one stage of the model
// (parallel/pipeline_layout.h: contiguous blocks, the embedding on the first stage, ln_f and the
// tied output layer on the last) and runs the 1F1B schedule of parallel/pipeline_schedule.h
// (Narayanan et al., 2021) over point-to-point transfers of the pp group (parallel/p2p.h) --
// or, holding V chunks of blocks (--pp-virtual), the interleaved 1F1B schedule of
// parallel/pipeline_interleaved.h, whose stage s below reads virtual stage s and chunk, and whose
// last virtual stage's output goes round the ring to stage 0's next chunk -- or ZB-H1
// (--pp-schedule zb-h1, parallel/pipeline_zero_bubble.h), each backward below split into its
// input pass, sent back at once, and its weight pass, run later (parallel/backward_split.h).
//
// A step of m micro-batches (m = --grad-accum), B = micro-batch, T = sequence, d = d_model:
//   stage s forward of micro j:  x_j = recv from s-1 ([B, T, d] fp32; the first stage embeds
//                                instead), y_j = blocks_s(x_j), send y_j to s+1 (the last stage
//                                computes loss_j = CE(head(y_j)) instead)
//   stage s backward of micro j: dy_j = recv from s+1 (the last stage backpropagates
//                                loss_j S / m instead), dx_j = backward(y_j, dy_j), send dx_j
//                                to s-1 (the first stage has none)
// The sends and receives of one schedule step are posted together (one NCCL group, or
// non-blocking MPI), so no order of ranks deadlocks. Shapes come from the config: nothing is
// negotiated per message, and a stage output of another shape or dtype is an error.
// Activations: a stage holds the graphs of at most min(pp - s, m) micro-batches at once (1F1B's
// bound; GPipe would hold m). Bubble: (pp - 1) / (m + pp - 1) of each step is idle.
// Traffic per step and boundary: m B T d 4 bytes of activations forward and the same of
// gradients backward (CommStats counts the bytes sent).
//
// Tied embeddings: the first and last stages each hold a copy of wte (lookup and output layer).
// After the data-parallel reduction their gradients g_0 and g_L are exchanged and each stage adds
// the other's: g_0 + g_L on both (the same bits: IEEE addition commutes), the whole-model
// gradient. Both copies take the same AdamW step and stay equal; the first stage's copy alone
// counts in the gradient norm, the fingerprint and the checkpoint.
//
// Gradient sync over dp (DDP, or ZeRO-1/2) happens in the last micro-batch's backward, as
// without pipelining; the loss is the mean over the micro-batches, computed on the last stage.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "data/loader.h"
#include "distributed/comm.h"
#include "optim/precision.h"
#include "parallel/main_grads.h"
#include "parallel/pipeline_schedule.h"

namespace kiln {

class AdamW;
class GPT;
struct ModelShard;

// `base` (a tensor-parallel shard, or the default one) restricted to pipeline stage `stage` of
// `stages`, the blocks split `block_counts` over the virtual stages (parallel/pipeline_layout.h):
// stages of them, or under the interleaved schedule V x stages, virtual stage c x stages + stage
// being the stage's chunk c (parallel/pipeline_interleaved.h).
ModelShard pipeline_stage_shard(ModelShard base, const std::vector<int64_t>& block_counts, int stage, int stages);

// What the trainer does around the schedule's actions.
// Each backward is one chunk's (the stage's only chunk under 1F1B): under the interleaved
// schedule a micro-batch's backward on a rank comes in V pieces, other micro-batches' between
// them, and chunk c's last piece is micro-batch m - 1's.
struct PipelineHooks {
  std::function<void(int micro, int chunk)> before_forward;   // ZeRO-3's begin_forward
  std::function<void(int micro, int chunk)> before_backward;  // DDP's sync flag, ZeRO's begin_micro
  std::function<void(int micro, int chunk)> after_backward;   // ZeRO's end_micro
  std::function<void(PipeAction::Type)> after_action;         // the phase timer
};

class PipelineStage {
 public:
  // model: this stage's part (built with pipeline_stage_shard); pp: the pipeline group, whose
  // rank is the stage. Activations are [micro_batch, seq_len / seq_split, d_model] on `device`
  // (sequence parallelism: a tp rank sends its rows to the next stage's rank of the same tp
  // index, which holds the same rows), in the
  // residual stream's dtype: the parameters' (fp32, or bf16 / fp16 for 16-bit working weights,
  // optim/adamw.h -- the embedding's output and every residual add are in that dtype).
  // zero_bubble: the ZB-H1 schedule (parallel/pipeline_zero_bubble.h; one chunk a stage), each
  // backward split into its input and weight halves (parallel/backward_split.h).
  PipelineStage(GPT& model, std::shared_ptr<Communicator> pp, c10::Device device, int64_t micro_batch,
                Precision precision, bool zero_bubble = false);

  int stage() const { return stage_; }
  at::ScalarType residual_dtype() const;
  // The ids the stage's embedding and loss take: all of them, or under --cp the rank's chunks.
  at::Tensor local(const at::Tensor& ids) const;
  int stages() const { return stages_; }
  int chunks() const { return chunks_; }
  bool first() const { return stage_ == 0; }
  bool last() const { return stage_ + 1 == stages_; }

  // One optimizer step: the forwards and backwards of `micros` micro-batches in 1F1B order
  // (interleaved 1F1B when the stage holds several chunks: parallel/pipeline_interleaved.h).
  // batch(j): micro-batch j (inputs are read by the first stage, targets by the last). The last
  // stage backpropagates loss_j * backward_factor. Returns the sum of the micro-batch losses
  // (fp32 scalar on the device; zero on the other stages).
  at::Tensor train(int micros, const std::function<Batch(int)>& batch, double backward_factor,
                   const PipelineHooks& hooks = {});
  // Forward only, without autograd (evaluation): the sum of the losses of `micros`
  // micro-batches, on the last stage (zero elsewhere).
  at::Tensor evaluate(int micros, const std::function<Batch(int)>& batch);

  // The tied wte's gradient summed over the first and last stages (see above); `grad` is the
  // dp-reduced gradient, or ZeRO's reduced shard of it (laid out alike on both stages). A no-op
  // on the other stages.
  void sync_tied_embedding(at::Tensor grad);

  // The most micro-batches (chunk forwards, when interleaved) whose activations the last train()
  // held at once.
  int max_live() const { return max_live_; }

 private:
  struct Slot;
  std::vector<PipeAction> schedule(int micros, bool forward_only) const;
  bool first_chunk(int chunk) const { return first() && chunk == 0; }              // embeds
  bool last_chunk(int chunk) const { return last() && chunk + 1 == chunks_; }      // takes the loss
  // Micro-batch `micro` on the device where chunk `chunk` reads it (embedding or loss), else empty.
  Batch batch_for(int chunk, int micro, const std::function<Batch(int)>& batch, bool non_blocking) const;
  GPT& model_;
  std::shared_ptr<Communicator> pp_;
  c10::Device device_;
  int64_t micro_batch_;
  Precision precision_;
  int stage_, stages_, chunks_;
  bool zero_bubble_;
  int max_live_ = 0;
};

// How the elements of this rank's parameter `name` count in a sum over the dp x tp x pp world
// that must count every element of the whole model once (gradient norms, weight fingerprints),
// as runs of (elements, weight) over the flattened tensor: 1 for this rank's own slice of a split
// parameter, KV/tp for c_attn's kv rows when tp replicates the kv heads, 1/tp for a parameter
// replicated over tp, 0 for the last pipeline stage's copy of the tied wte (counted on the first).
// (dp is not in it: data-parallel copies are counted by whoever sums over dp.)
std::vector<std::pair<int64_t, double>> count_weights(const std::string& name, const at::Tensor& local, const GPT& model);

// The share of this rank's gradients in the squared global norm, for a sum over the whole
// dp x cp x tp x pp world (fp64 scalar on the gradients' device): count_weights' weights, divided
// by `replicas` = dp x cp (every rank of the dp x cp group holds the same reduced gradients; under
// expert parallelism an expert's are on dp / ep ranks, so its share is times ep). grads: as
// grad_norm_tp's.
at::Tensor pipeline_grad_sq_norm_share(GPT& model, int64_t replicas, const GradOf& grads = {});

// The stage whose copy of whole-model parameter `name` a checkpoint takes: the first for wte
// and wpe (the last stage's wte is the tied copy), the last for ln_f, the stage of its block
// (block_counts per virtual stage, as pipeline_stage_shard's).
int pipeline_stage_of(const std::string& name, const std::vector<int64_t>& block_counts, int stages);

}  // namespace kiln
