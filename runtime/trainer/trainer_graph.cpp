// runtime/trainer/trainer_graph.cpp -- --cuda-graph: the step captured once as two CUDA graphs and
// replayed (distributed/cuda_graph.h).
//
// A kiln step on a GPU is a few thousand kernel launches with no host read among them (the step
// reads its verdict once, behind the next step's forward and backward: trainer_step.cpp). At
// gpt2-124m's micro-batch 16 the device still stood idle between kernels ~3 ms a step (the
// profile, issue 49): the host's launch cost, where the kernels are short. A graph launches them
// all at once. The step becomes two graphs, so that the loop keeps its order (trainer_loop.cpp:
// forward and backward of N, the read of N - 1, the update of N):
//   step graph    the gradients zeroed, the micro-batches' forward and backward (reading the
//                 device copies of the batches: each replay's are copied in first), the gradient
//                 norm, the verdict [loss, non-finite, norm]
//   update graph  found_inf and the clip factor from the verdict, AdamW (the rate read from a
//                 device scalar filled in before each replay: the schedule moves, the graph not)
// The run computes on one non-default stream from set-up on (distributed/cuda_graph.h's
// use_side_stream: autograd's AccumulateGrad nodes, which main grads' hooks hold across steps, run
// on the stream they were made on, and must be the captured one's). Steps first_step and
// first_step + 1 run eagerly (LibTorch's lazy initialisation, cuBLAS's workspaces and heuristics,
// the gradients' first allocation); first_step + 2 is captured, then
// replayed, as every step after it. Dropout draws afresh each replay: the graph reads the CUDA
// generator's seed and offset when it is replayed, and the step's seed is set before it (the
// same masks as the eager step). What runs between steps -- evaluations, samples, saves, the
// host's reads -- runs eagerly on the same tensors. The graphed step is the eager step's kernels
// in the eager step's order, so a run is the same with or without graphs (gpu.graph: bit for bit
// under --deterministic).
//
// What a replay cannot redo is refused before the run (TrainConfig::validate_cuda_graph, and the
// device and the world of one at set-up); the record's phase split puts the step graph's time in
// the forward (fwd_ms holds forward, backward and the norm) and the update's in the optimizer.
#include "runtime/trainer/trainer.h"
#include "runtime/trainer/trainer_run.h"

#include <ATen/ATen.h>

#include "distributed/error.h"
#include "optim/grad_clip.h"

namespace kiln {

void Trainer::build_graphs() {
  Run& r = *run_;
  if (!cfg_.cuda_graph) return;
  // Masked targets pick the loss's rows on the host (models/gpt.h, head_loss): not capturable.
  if (r.loader && r.loader->masked())
    throw ConfigError("--cuda-graph does not take data with a target mask (kiln prep --chat): the loss picks its rows on the host");
  if (!r.dev.device.is_cuda()) throw ConfigError("--cuda-graph needs a CUDA device (this run computes on " + r.dev.device.str() + ")");
  if (proc_.world_size > 1 || r.ddp || r.zero || r.pipe) {
    throw ConfigError("--cuda-graph runs one process without a data-parallel reduction (this run has " +
                      std::to_string(proc_.world_size) + " rank(s)" + (r.ddp ? ", DDP" : "") + ")");
  }
  // One stream for the whole run: the eager warm-up steps, the capture and the replays (and what
  // runs between them), so that every AccumulateGrad node is the captured stream's.
  use_side_stream(r.dev.device.index());
  r.graphs = std::make_unique<StepGraphs>();
  r.graphs->lr = at::zeros({}, at::TensorOptions().device(r.dev.device).dtype(at::kFloat));
}

Trainer::QueuedStep Trainer::forward_backward_graphed(int64_t step) {
  Run& r = *run_;
  StepGraphs& g = *r.graphs;
  QueuedStep out;
  begin_step(out, step);  // the host's part: counters and the dropout seed the replay reads
  out.graphed = true;
  // This step's micro-batches into the tensors the graph reads (pinned host memory: no wait).
  const std::vector<Batch> batches = r.prefetch->take(step);
  if (g.batches.empty()) {
    for (const Batch& b : batches) {
      g.batches.push_back({at::empty(b.inputs.sizes(), b.inputs.options().device(r.dev.device)),
                           at::empty(b.targets.sizes(), b.targets.options().device(r.dev.device))});
    }
  }
  for (size_t i = 0; i < batches.size(); ++i) {
    g.batches[i].inputs.copy_(batches[i].inputs, /*non_blocking=*/true);
    g.batches[i].targets.copy_(batches[i].targets, /*non_blocking=*/true);
  }
  if (!g.step.captured()) {
    r.timer->pause(true);  // the capture's marks would be events that never run
    try {
      g.step.capture(r.dev.device.index(), [&] {
        zero_gradients();
        g.loss_sum = run_micro_batches(step, out.loss_scale / static_cast<double>(cfg_.grad_accum), &g.batches);
        finish_reductions();
        queue_verdict(out, g.loss_sum, gradient_norm(out.loss_scale));
      });
    } catch (...) {
      r.timer->pause(false);
      throw;
    }
    r.timer->pause(false);
    g.verdict = out.verdict;
    g.norm_index = out.norm_index;
    g.loss_copies = out.loss_copies;
    g.moe_copies = out.moe_copies;
  }
  g.step.replay();
  out.verdict = g.verdict;
  out.norm_index = g.norm_index;
  out.loss_copies = g.loss_copies;
  out.moe_copies = g.moe_copies;
  if (r.nonfinite) r.nonfinite->note_local_loss(out.step, g.loss_sum);  // after the replay, on its loss
  r.timer->mark(Phase::Forward);
  return out;
}

void Trainer::queue_update_graphed(QueuedStep& q) {
  Run& r = *run_;
  StepGraphs& g = *r.graphs;
  q.lr = r.schedule->at(r.progress.updates);
  g.lr.fill_(q.lr);  // before the replay, on the same stream: the update reads it there
  const int64_t taken = r.optimizer->steps_taken();
  if (!g.update.captured()) {
    g.update.capture(r.dev.device.index(), [&] {
      const at::Tensor found_inf = (g.verdict[1] > 0).to(at::kFloat);
      const at::Tensor coef = clip_factor(g.verdict[g.norm_index], cfg_.grad_clip, q.loss_scale);
      r.optimizer->step(q.lr, found_inf, coef, g.lr);
    });
  }
  g.update.replay();
  r.optimizer->set_steps_taken(taken + 1);  // the host's count: the capture's own call does not run again
  queue_verdict_copy(q);
}

}  // namespace kiln
