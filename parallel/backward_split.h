// parallel/backward_split.h -- one backward pass in two halves, for a zero-bubble pipeline
// schedule (parallel/pipeline_zero_bubble.h): the input-gradient pass I, which the stage before
// waits for, and the weight-gradient pass W, which can wait. PyTorch's
// torch.distributed.pipelining does the same in Python (stage_backward_input / _weight).
//
// Given a stage's output y (its loss, or the activation sent on) with gradient dy, and its input
// x (the received activation, a leaf requiring grad):
//   graph     from y's node, every node of the graph, the ones that depend on x (a path to x's
//             AccumulateGrad), and for each parameter the "intermediate" nodes: walking from its
//             AccumulateGrad toward y, the first nodes that also depend on x (a matmul's
//             MmBackward, whose inputs are x's activation and the weight; a norm's backward).
//             Everything between a parameter and its intermediates (a transpose, autocast's cast
//             of the weight) depends on the parameter alone.
//   I         dx = torch::autograd::grad(y, x, dy), the graph kept; a pre-hook on each
//             intermediate copies the gradients it receives. The engine runs only what dx needs:
//             each intermediate computes its input's gradient, not its weight's.
//   W         for each group of parameters meeting the graph at the same intermediates (a
//             weight and its bias), one engine call from those intermediates, with their captured
//             gradients, to the group's AccumulateGrad edges (accumulating, as
//             backward(inputs=params) does): only the weight paths run -- one call for all would
//             also carry a later layer's gradient down the input path to earlier weights, counted
//             twice -- the gradients land through AccumulateGrad, so DDP's and ZeRO's hooks fire
//             there as in a fused backward, and the last call frees the graph.
// Cost: I + W do the work of one backward; W re-enters each intermediate once (a node computes
// only the outputs asked of it: mm, layer norm and the like). Memory: the graph -- the
// activations -- lives until W. Limits: a node that computes every output whatever is asked
// (a custom autograd function that ignores needs_input_grad: kiln's gelu_linear under selective
// recomputation) does its work twice; the reentrant checkpoint (--activation-checkpointing full)
// accumulates its block's weight gradients inside I (the trainer refuses that combination).
#pragma once

#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

namespace kiln {

class SplitBackward {
 public:
  // I: the gradient of `output` (dy: `output_grad`, or ones for a scalar when undefined) with
  // respect to `input` alone; `params`: the parameters whose gradients W will produce.
  // Returns dx (zeros when the output does not depend on the input).
  at::Tensor input_pass(const at::Tensor& output, const at::Tensor& output_grad, const at::Tensor& input,
                        const std::vector<at::Tensor>& params);
  // W: the parameters' gradients, accumulated; the graph freed. A no-op before an input pass.
  void weight_pass();

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace kiln
