// runtime/trainer/trainer_step.cpp -- one training step, in three parts (runtime/trainer/trainer_run.h's
// QueuedStep), so that its one host read can wait behind the next step's forward and backward
// (Trainer::run, docs/precision.md "The step"):
//   forward_backward  the micro-batches, the gradient reductions, the norm, the verdict's all-reduce
//   queue_update      the update, decided on the device; the verdict's copy to the host queued after it
//   finish_step       waits for that copy (the step's one host synchronisation) and reads it
#include "runtime/trainer/trainer.h"
#include "runtime/trainer/trainer_run.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#if defined(KILN_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

#include "data/prefetch.h"
#include "distributed/cuda_backend.h"
#include "distributed/device_check.h"
#include "distributed/error.h"
#include "distributed/host_memory.h"
#include "distributed/mesh.h"
#include "models/gpt.h"
#include "optim/adamw.h"
#include "optim/grad_clip.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/precision.h"
#include "parallel/ddp.h"
#include "parallel/expert_parallel.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"
#include "parallel/zero.h"
#include "runtime/observe/phase_timer.h"

namespace kiln {

namespace {


// The dropout seed of step `step` on data-parallel rank `dp_rank` (splitmix64 of the three):
// reseeding every step makes the step number the whole RNG state a checkpoint needs.
uint64_t step_seed(uint64_t seed, int64_t step, int dp_rank) {
  uint64_t z = seed ^ (static_cast<uint64_t>(step) * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(dp_rank) << 48);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (z ^ (z >> 31)) >> 1;  // manual_seed takes a non-negative int64 range
}

// Test-only KILN_TEST_SLOW_RANK: this rank's step made `ms` longer where a slow device would make it
// longer -- on a GPU a spin kernel on the compute stream (a host sleep would only delay the queue,
// which a GPU ahead of its host hides), on the CPU a sleep.
void slow_down_for_test(c10::Device device, double ms) {
#if defined(KILN_WITH_CUDA)
  if (device.is_cuda()) {
    int khz = 0;  // cycles per millisecond
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device.index() < 0 ? 0 : device.index()) != cudaSuccess || khz <= 0) {
      (void)cudaGetLastError();
      khz = 1'500'000;
    }
    cuda_spin(static_cast<int64_t>(ms * khz));  // at::cuda::sleep
    return;
  }
#endif
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

}  // namespace

Trainer::QueuedStep Trainer::forward_backward(int64_t step) {
  Run& r = *run_;
  if (r.graphs && step >= r.graphs->capture_at) return forward_backward_graphed(step);
  QueuedStep out;
  begin_step(out, step);
  zero_gradients();
  const double backward_factor = out.loss_scale / static_cast<double>(cfg_.grad_accum);
  const at::Tensor loss_sum = run_micro_batches(step, backward_factor, nullptr, &out.loss_tokens);
  finish_reductions();
  const at::Tensor norm = gradient_norm(out.loss_scale);
  r.timer->mark(Phase::Optimizer);
  if (r.nonfinite) r.nonfinite->note_local_loss(out.step, loss_sum);  // this rank's own, before the reduction
  queue_verdict(out, loss_sum, norm);
  return out;
}

// The step's start on the host: a new timing chain where one was broken, the counters the step's
// figures are differences of, the dropout seed (zero_gradients: its device part).
void Trainer::begin_step(QueuedStep& out, int64_t step) {
  Run& r = *run_;
  out.step = step;
  if (r.nonfinite) r.nonfinite->begin_step(step);
  if (r.chain_broken) {
    r.timer->start();
    r.interval_joules = r.energy->joules();
    r.chain_broken = false;
  }
  out.loss_scale = r.scaler->scale();
  out.comm_bytes = r.comm_bytes();                      // until queue_update: this step's traffic
  out.ep_comm_bytes = r.mesh ? r.mesh->ep_bytes_sent() : 0;
  if (r.ep_traffic) out.ep_rows = *r.ep_traffic;
  out.host_syncs = host_syncs();                        // until queue_update: the host's waits before the update
  // Pipeline stages draw from streams of their own (stage 0's is the unpipelined one).
  at::manual_seed(step_seed(cfg_.seed ^ (static_cast<uint64_t>(r.mesh ? r.mesh->coord().pp : 0) << 40), step, r.dp_rank));
}

// The gradients zeroed (or set to none) before the step's first backward.
void Trainer::zero_gradients() {
  Run& r = *run_;
  if (r.expert_ddp) r.expert_ddp->zero_grad();
  if (r.ddp) r.ddp->zero_grad();
  else if (!r.zero) r.model->zero_grad(/*set_to_none=*/true);
  if (r.main_grads) r.main_grads->zero_grad();
}

// Forward and backward over the step's micro-batches (1F1B through the stages under --pp), with
// DDP's sync skipping and ZeRO's per-micro-batch reductions; returns the summed loss.
at::Tensor Trainer::run_micro_batches(int64_t step, double backward_factor, const std::vector<Batch>* device_batches,
                                      int64_t* loss_tokens) {
  Run& r = *run_;
  const c10::Device device = r.dev.device;
  r.model->begin_float8_step();  // the weights changed since the last micro-batch: fp8 requantises them once (GPT::keep_float8_weights)
  auto loss_sum = at::zeros({}, at::TensorOptions().device(device));
  // Made one step ahead (pinned on a GPU, so the non-blocking copies below overlap compute).
  const std::vector<Batch> batches = device_batches ? *device_batches : r.prefetch->take(step);
  // Masked targets: the loss's denominator (models/gpt.h), the step's trained targets over its
  // loss terms -- micro-batches x dp x cp, the ones the gradients and the verdict average.
  if (r.loader->masked()) {
    const double terms = static_cast<double>(cfg_.grad_accum * r.shape.dp * r.shape.cp);
    r.model->loss_targets_per_term = static_cast<double>(std::max<int64_t>(1, batches.front().step_targets)) / terms;
    if (loss_tokens) *loss_tokens = batches.front().step_targets;
  }
  const double slow_ms = r.test_slow_factor > 0 ? r.test_slow_factor * r.test_own_compute_ms : r.test_slow_ms;  // test-only
  if (slow_ms > 0) slow_down_for_test(device, slow_ms);
  // MoE: the router losses' gradients take the LM loss's factor (models/moe.h).
  if (cfg_.gpt.is_moe()) r.model->set_moe_loss_backward_scale(backward_factor);
  // Before a micro-step's backward, on both paths below: every gradient reduction's sync flag
  // (reduce in the last micro-step only) and ZeRO's per-micro-step bookkeeping (chunk -1: all
  // units). One place, so that no reducer is left out on one path (the pipeline's once missed
  // the experts' DDP).
  auto begin_backward = [&](int64_t micro, int chunk) {
    const bool last = micro + 1 == cfg_.grad_accum;
    if (r.ddp) r.ddp->set_sync(last);  // sync skipping
    if (r.expert_ddp) r.expert_ddp->set_sync(last);
    if (r.zero) r.zero->begin_micro(micro, chunk);
  };
  if (r.pipe) {
    // 1F1B over the stages: the same hooks as below, around each micro-batch's backward (under
    // the interleaved schedule, each chunk's piece of it: DDP's buckets count a parameter ready
    // in its chunk's last piece, micro-batch m - 1's; ZeRO clears, counts and reduces the chunk's
    // units alone).
    const bool chunked = r.pipe->chunks() > 1;
    PipelineHooks hooks;
    hooks.before_forward = [&](int, int chunk) {
      if (r.zero) r.zero->begin_forward(chunked ? chunk : -1);  // ZeRO-3: the chunk's outer units
    };
    hooks.before_backward = [&](int micro, int chunk) { begin_backward(micro, chunked ? chunk : -1); };
    hooks.after_backward = [&](int, int chunk) {
      if (r.zero) r.zero->end_micro(chunked ? chunk : -1);
    };
    hooks.after_action = [&](PipeAction::Type t) {
      r.timer->mark(t == PipeAction::Type::Forward    ? Phase::Forward
                    : t == PipeAction::Type::Exchange ? Phase::Comm
                                                      : Phase::Backward);  // a backward, or its input or weight half
    };
    loss_sum = r.pipe->train(static_cast<int>(cfg_.grad_accum), [&](int micro) { return batches.at(static_cast<size_t>(micro)); },
                             backward_factor, hooks);
  }
  for (int64_t micro = 0; micro < (r.pipe ? 0 : cfg_.grad_accum); ++micro) {
    begin_backward(micro, -1);
    const Batch& batch = batches[static_cast<size_t>(micro)];
    at::Tensor loss;
    {
      AutocastScope autocast(r.precision, device.type());
      loss = r.model->loss(to_device(batch.inputs, device, /*non_blocking=*/true), to_device(batch.targets, device, /*non_blocking=*/true));
    }
    r.timer->mark(Phase::Forward);
    (loss * backward_factor).backward();
    loss_sum += loss.detach().to(at::kFloat);
    r.timer->mark(Phase::Backward);
    if (r.zero) {
      r.zero->end_micro();
      r.timer->mark(Phase::Comm);
    }
  }
  return loss_sum;
}

// The reductions that end the backward: DDP's last buckets (the experts' apart, x 1/ep), the tied
// embedding's gradient between the first and last pipeline stages.
void Trainer::finish_reductions() {
  Run& r = *run_;
  if (r.ddp) {
    r.ddp->finish_backward();
    if (r.expert_ddp) {
      r.expert_ddp->finish_backward();
      std::vector<at::Tensor> expert_grads;
      for (const auto& t : r.expert_targets) expert_grads.push_back(t.grad());
      scale_expert_gradients(expert_grads, r.shape.ep);
    }
    r.timer->mark(Phase::Comm);
  }
  if (r.pipe && (r.pipe->first() || r.pipe->last()) && r.model->config().tie_embeddings) {
    r.pipe->sync_tied_embedding(r.zero ? r.zero->grad_shard_of(r.model->wte) : grad_of(r.grad_of, r.model->wte));
    r.timer->mark(Phase::Comm);
  }
}

// The gradient's norm (where it is local) or this rank's share of its square; the clipping is
// the update's (queue_update).
at::Tensor Trainer::gradient_norm(double loss_scale) {
  Run& r = *run_;
  // DDP / one process: every rank holds the whole reduced gradient, so the norm is local. ZeRO:
  // each rank holds a shard; the squared norms are summed with the verdict.
  // Pipeline: every stage holds its own parameters, so the squared norm is summed over the world
  // with the verdict (each rank's share weighted so the sum counts every parameter once) and
  // the clipping comes after it.
  // Expert parallelism: ZeRO's shards and the pipeline's shares count each expert once as they
  // are; DDP's replicated gradients sum the experts' squares over ep (grad_norm_ep).
  if (r.zero) return r.zero->local_grad_sq_norm();
  if (r.pipe) return pipeline_grad_sq_norm_share(*r.model, r.shape.grad_ranks(), r.grad_of);
  if (r.shape.ep > 1)
    return grad_norm_ep(*r.model, loss_scale, r.mesh->ep(), r.shape.tp > 1 ? r.mesh->tp() : nullptr, r.grad_of);
  if (r.shape.tp > 1) return grad_norm_tp(*r.model, loss_scale, r.mesh->tp(), r.grad_of);
  const at::Tensor n = grad_norm(r.grads);
  return loss_scale != 1.0 ? n / loss_scale : n;
}

// The verdict: [mean loss, non-finite, MoE rows, norm] reduced over the ranks that share the
// step's loss, queued on the device.
void Trainer::queue_verdict(QueuedStep& out, const at::Tensor& loss_sum, const at::Tensor& norm) {
  Run& r = *run_;
  const c10::Device device = r.dev.device;
  // One small tensor decides the step on every rank: the mean loss and whether anything was
  // not finite (an fp16 overflow, or a diverged run), summed over dp; the norm rides along
  // (every rank already holds the same one; ZeRO sums its squared shards too).
  // MoE: the step's routing stats (models/moe.h, one row per MoE layer) ride along before the
  // norm, summed with the loss: [loss, non-finite, MoE rows..., norm].
  const at::Tensor moe_stats = r.model->take_moe_stats(device);
  std::vector<at::Tensor> parts{(loss_sum / static_cast<double>(cfg_.grad_accum)).reshape({1}),
                                at::logical_not(at::isfinite(loss_sum)).logical_or(at::logical_not(at::isfinite(norm))).to(at::kFloat).reshape({1})};
  if (moe_stats.defined()) parts.push_back(moe_stats);
  parts.push_back(norm.to(loss_sum.device(), at::kFloat).reshape({1}));
  auto verdict = at::cat(parts);
  out.norm_index = verdict.numel() - 1;
  // ZeRO under tensor parallelism sums over dp x tp (the world, without pipeline stages): each
  // rank's squared norm covers its tp slice, replicated parameters weighted 1/tp. Pipeline: over
  // the world, the loss coming from the last stage alone.
  // MoE under --sp: each tp rank's routing rows are its own rows' (parts, not copies: models/moe.h),
  // summed over tp too.
  const bool moe_parts_over_tp = moe_stats.defined() && cfg_.sp;
  const bool over_world = r.pipe || (r.zero && r.shape.tp > 1) || moe_parts_over_tp;
  // Context parallelism: over dp x cp, each cp rank's loss being the mean over its positions.
  Communicator* verdict_group = over_world ? r.mesh->world().get() : r.mesh ? r.mesh->dp_cp().get() : nullptr;
  if (r.pipe && !r.pipe->last()) verdict[0].zero_();
  const bool reduce_verdict = r.mesh && (r.shape.grad_ranks() > 1 || r.zero || r.pipe || moe_parts_over_tp);
  if (reduce_verdict) {
    auto reduced = verdict.narrow(0, 0, r.zero || r.pipe ? out.norm_index + 1 : out.norm_index);  // a contiguous view
    verdict_group->all_reduce(reduced, ReduceOp::Sum)->wait();
    r.timer->mark(Phase::Comm);
  }

  out.verdict = verdict;
  // the last stage's dp x cp x tp ranks each put their loss in the world's sum (cp: the mean over
  // its own positions; their mean is the whole mean, as cp's verdict over dp x cp makes it)
  out.loss_copies = r.pipe ? r.shape.dp * r.shape.cp * r.shape.tp : reduce_verdict ? verdict_group->size() : 1;
  // Each MoE row summed over the dp ranks' tokens, and over tp copies of the same when the
  // verdict went over the world (under --sp the tp ranks' rows are parts of one sequence's).
  out.moe_copies = reduce_verdict && over_world && !cfg_.sp ? r.shape.tp : 1;
}

void Trainer::queue_update(QueuedStep& q) {
  Run& r = *run_;
  // The update, decided on the device (no host read before it; docs/precision.md, "The step"):
  //   found_inf = [anything not finite on any rank]   the fused AdamW kernel skips the update
  //   ZeRO, pp: n = sqrt(sum of squares) / S,  c = min(1, max / (n + 1e-6)) / S  (clip_factor's
  //   rule, in double as the host once did it, then fp32), applied to the reduced gradients.
  //   The others: c = clip_factor(n) (optim/grad_clip.h, fp32), n the verdict's norm.
  // The optimizer applies c as it reads the gradients (one pass: AdamW::step, ZeroEngine::step).
  // The learning rate is the schedule's at the updates applied so far: the host has read every
  // earlier step's verdict by now (Trainer::run finishes step N before queueing N + 1's update).
  if (q.graphed) return queue_update_graphed(q);
  const at::Tensor found_inf = (q.verdict[1] > 0).to(at::kFloat);
  at::Tensor coef;
  if (r.zero) {
    const at::Tensor n = q.verdict[q.norm_index].to(at::kDouble).sqrt() / q.loss_scale;
    coef = cfg_.grad_clip > 0.0 ? at::clamp_max(cfg_.grad_clip / (n + 1e-6), 1.0) : at::ones_like(n);
    coef = (coef / q.loss_scale).to(at::kFloat);
  } else if (r.pipe) {
    const at::Tensor n = (q.verdict[q.norm_index].to(at::kDouble).sqrt() / q.loss_scale).to(at::kFloat);
    coef = clip_factor(n, cfg_.grad_clip, q.loss_scale);
  } else {
    coef = clip_factor(q.verdict[q.norm_index], cfg_.grad_clip, q.loss_scale);  // the local norm (not reduced)
  }
  q.lr = r.schedule->at(r.progress.updates);
  if (r.zero) r.zero->step(q.lr, coef, found_inf);
  else r.optimizer->step(q.lr, found_inf, coef);
  queue_verdict_copy(q);
}

// After the update: the step's counters closed, and the verdict's copy to the host queued behind it.
void Trainer::queue_verdict_copy(QueuedStep& q) {
  Run& r = *run_;
  q.host_syncs = host_syncs() - q.host_syncs;
  q.comm_bytes = r.comm_bytes() - q.comm_bytes;
  q.ep_comm_bytes = (r.mesh ? r.mesh->ep_bytes_sent() : 0) - q.ep_comm_bytes;
  if (r.ep_traffic) q.ep_rows = *r.ep_traffic - q.ep_rows;
  // The verdict's copy to the host, queued behind the update (pinned on a GPU, so the copy does
  // not block); the mark after it is what finish_step waits for.
  // One buffer for the run: step N is finished (its buffer read) before N + 1's update is queued.
  // (A cudaHostAlloc per step would cost more than the read it serves.)
  if (!r.verdict_host.defined()) r.verdict_host = host_buffer(q.verdict.numel(), pin_for(r.dev.device), at::kDouble);
  q.host = r.verdict_host;
  q.host.copy_(q.verdict.to(at::kDouble), /*non_blocking=*/true);
  q.mark = r.timer->mark(Phase::Optimizer);
}

Trainer::StepOutcome Trainer::finish_step(QueuedStep& q) {
  Run& r = *run_;
  StepOutcome out;
  r.timer->wait(q.mark);  // the step's one host synchronisation: its update and its verdict's copy
  std::array<double, kNumPhases> waited{};
  out.phase_ms = r.timer->cut(q.mark, &waited);
  out.compute_wait_ms = waited[static_cast<size_t>(Phase::Forward)] + waited[static_cast<size_t>(Phase::Backward)];
  out.loss_scale = q.loss_scale;
  out.lr = q.lr;
  out.host_syncs = q.host_syncs;
  out.comm_bytes = q.comm_bytes;
  out.loss_tokens = q.loss_tokens;
  out.ep_comm_bytes = q.ep_comm_bytes;
  out.ep_rows = q.ep_rows;
  const double* h = q.host.data_ptr<double>();
  out.loss = h[0] / static_cast<double>(q.loss_copies);
  const bool nonfinite = h[1] > 0.0;
  out.norm = r.zero || r.pipe ? std::sqrt(h[q.norm_index]) / out.loss_scale : h[q.norm_index];
  if (cfg_.gpt.is_moe()) out.moe = moe_step_stats(h + 2, cfg_.gpt, q.moe_copies, cfg_.grad_accum * r.shape.dp);
  if (r.precision == Precision::FP16) {
    out.skipped = r.scaler->update(nonfinite);
  } else {
    // bf16 / fp32 (runtime/trainer/nonfinite_guard.h): skip, or stop naming where it came from.
    // The verdict is the same on every rank, so every rank takes the same branch (origin() is
    // collective over the host group).
    r.nonfinite->step_read(q.step, nonfinite);
    r.skipped_in_a_row = nonfinite ? r.skipped_in_a_row + 1 : 0;
    const std::string what = "step " + std::to_string(q.step + 1) + ": loss " + std::to_string(out.loss) +
                             ", gradient norm " + std::to_string(out.norm) + " is not finite";
    if (nonfinite && cfg_.on_nonfinite == "stop") {
      throw NumericsError(what + "; stopping with the update skipped (--on-nonfinite skip would skip such steps and go on); " +
                          r.nonfinite->origin(r.host_world.get()));
    }
    if (nonfinite && r.skipped_in_a_row >= cfg_.max_skipped_steps) {
      throw NumericsError(what + "; " + std::to_string(r.skipped_in_a_row) + " step(s) in a row skipped (--max-skipped-steps " +
                          std::to_string(cfg_.max_skipped_steps) + "): stopping without saving; " +
                          r.nonfinite->origin(r.host_world.get()));
    }
    out.skipped = nonfinite;
  }
  if (out.skipped != nonfinite) throw Error("the loss scaler skipped a step the kernel applied, or the reverse");
  if (!out.skipped) ++r.progress.updates;
  return out;
}

}  // namespace kiln
