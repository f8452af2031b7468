// parallel/pipeline.cpp -- a pipeline stage running the 1F1B, interleaved or ZB-H1 schedule, the
// tied-embedding sync, and the checkpoint gather of the stages.
#include "parallel/pipeline.h"

#include <algorithm>
#include <map>
#include <set>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "distributed/device.h"
#include "distributed/device_check.h"
#include "distributed/error.h"
#include "models/gpt.h"
#include "optim/adamw.h"
#include "optim/grad_clip.h"
#include "parallel/backward_split.h"
#include "parallel/expert_parallel.h"
#include "parallel/p2p.h"
#include "parallel/pipeline_interleaved.h"
#include "parallel/pipeline_layout.h"
#include "parallel/pipeline_zero_bubble.h"
#include "parallel/tensor_parallel.h"

namespace kiln {

ModelShard pipeline_stage_shard(ModelShard base, const std::vector<int64_t>& block_counts, int stage, int stages) {
  const auto starts = pipeline_block_starts(block_counts);
  const int virtual_stages = static_cast<int>(block_counts.size());
  if (stages < 1 || virtual_stages % stages != 0 || stage < 0 || stage >= stages) {
    throw Error("pipeline: stage " + std::to_string(stage) + " of " + std::to_string(stages) + " over " +
                std::to_string(virtual_stages) + " virtual stages");
  }
  base.chunks.clear();
  for (int v = stage; v < virtual_stages; v += stages)  // chunk c = virtual stage c x stages + stage
    base.chunks.push_back({starts[static_cast<size_t>(v)], starts[static_cast<size_t>(v) + 1]});
  base.embedding = stage == 0;
  base.head = stage + 1 == stages;
  return base;
}

// One micro-batch's tensors on this stage, from its forward to its backward.
struct PipelineStage::Slot {
  at::Tensor input;        // the received activation (a leaf requiring grad); undefined on the first stage
  at::Tensor output;       // the stage output sent on (or, on the last stage, the loss)
  at::Tensor output_grad;  // its gradient, received from the next stage
  at::Tensor input_grad;   // ZB-H1: the input pass's dx (a fused backward leaves it in input.grad())
};

PipelineStage::PipelineStage(GPT& model, std::shared_ptr<Communicator> pp, c10::Device device, int64_t micro_batch,
                             Precision precision, bool zero_bubble)
    : model_(model), pp_(std::move(pp)), device_(device), micro_batch_(micro_batch), precision_(precision),
      stage_(pp_->rank()), stages_(pp_->size()), chunks_(static_cast<int>(model_.shard().chunks.size())),
      zero_bubble_(zero_bubble) {
  const ModelShard& s = model_.shard();
  if (s.embedding != first() || s.head != last() || chunks_ < 1 || (chunks_ > 1 && stages_ < 2) ||
      (zero_bubble_ && chunks_ > 1)) {
    throw Error("pipeline: the model is not stage " + std::to_string(stage_) + "'s part (build it with pipeline_stage_shard)");
  }
}

at::Tensor PipelineStage::local(const at::Tensor& ids) const {
  const LayerOps& ops = *model_.shard().ops;
  return ops.local_tokens ? ops.local_tokens(ids) : ids;  // --cp: the rank's two chunks of each sequence
}

at::ScalarType PipelineStage::residual_dtype() const {
  const auto params = model_.parameters();
  return params.empty() ? at::kFloat : params.front().scalar_type();
}

std::vector<PipeAction> PipelineStage::schedule(int micros, bool forward_only) const {
  if (chunks_ > 1) {
    return forward_only ? interleaved_forward_only(stages_, stage_, chunks_, micros)
                        : interleaved_one_f_one_b(stages_, stage_, chunks_, micros);
  }
  if (forward_only) return kiln::forward_only(stages_, stage_, micros);
  return zero_bubble_ ? zb_h1(stages_, stage_, micros) : one_f_one_b(stages_, stage_, micros);
}

Batch PipelineStage::batch_for(int chunk, int micro, const std::function<Batch(int)>& batch, bool non_blocking) const {
  Batch b;
  // --document-mask: every stage's attention needs the tokens' documents (GPT::set_documents).
  if (first_chunk(chunk) || last_chunk(chunk) || model_.needs_mask()) {
    b = batch(micro);
    b.inputs = to_device(b.inputs, device_, non_blocking);
    b.targets = to_device(b.targets, device_, non_blocking);
  }
  return b;
}

at::Tensor PipelineStage::train(int micros, const std::function<Batch(int)>& batch, double backward_factor,
                                const PipelineHooks& hooks) {
  const GPTConfig& cfg = model_.config();
  const std::vector<int64_t> shape{micro_batch_, cfg.seq_len / model_.shard().ops->seq_split, cfg.d_model};  // --sp: the rank's rows
  const auto act = at::TensorOptions().dtype(residual_dtype()).device(device_);
  auto loss_sum = at::zeros({}, act.dtype(at::kFloat));
  std::map<MicroChunk, Slot> live;  // (micro-batch, chunk) forwarded and not yet backwarded (or not yet sent back)
  std::map<int, SplitBackward> weights_due;  // ZB-H1: micro-batches through their input pass, not their weight pass
  const std::vector<at::Tensor> params = zero_bubble_ ? model_.parameters() : std::vector<at::Tensor>{};
  max_live_ = 0;
  auto count_live = [&] {  // after a forward: the micro-batches whose graphs the stage holds
    size_t n = live.size();
    if (zero_bubble_) {  // ZB-H1: a micro-batch's graph lives until its weight pass
      std::set<int> held;
      for (const auto& item : live) held.insert(item.first.first);
      for (const auto& item : weights_due) held.insert(item.first);
      n = held.size();
    }
    max_live_ = std::max(max_live_, static_cast<int>(n));
  };

  auto outgoing = [&](const PipeTransfer& t) -> at::Tensor {
    Slot& s = live.at({t.micro, t.chunk});
    if (t.kind == PipeTransfer::Kind::SendActivation) return s.output.detach().contiguous();
    at::Tensor g = s.input_grad.defined() ? s.input_grad : s.input.grad();
    if (!g.defined()) g = at::zeros(shape, act);  // the chunk's output does not depend on its input
    return g.contiguous();
  };

  for (const PipeAction& a : schedule(micros, /*forward_only=*/false)) {
    const MicroChunk key{a.micro, a.chunk};
    switch (a.type) {
      case PipeAction::Type::Exchange: {
        StageTransfers in = exchange(*pp_, stage_, a.transfers, outgoing, shape, act);
        for (auto& [k, x] : in.activations) live[k].input = x.requires_grad_(true);
        for (auto& [k, g] : in.grads) live.at(k).output_grad = g;
        for (const auto& t : a.transfers)
          if (t.kind == PipeTransfer::Kind::SendGrad) live.erase({t.micro, t.chunk});  // done on this chunk
        break;
      }
      case PipeAction::Type::Forward: {
        if (hooks.before_forward) hooks.before_forward(a.micro, a.chunk);
        Slot& s = live[key];
        const Batch b = batch_for(a.chunk, a.micro, batch, /*non_blocking=*/true);
        AutocastScope autocast(precision_, device_.type());
        if (model_.needs_mask()) model_.set_documents(b.inputs);  // the whole sequence's, as GPT::loss
        at::Tensor y = model_.run_blocks(first_chunk(a.chunk) ? model_.embed(local(b.inputs)) : s.input, a.chunk);
        if (last_chunk(a.chunk)) {
          s.output = model_.head_loss(y, local(b.targets));
          loss_sum += s.output.detach().to(at::kFloat);
        } else {
          s.output = y;
        }
        count_live();
        break;
      }
      case PipeAction::Type::BackwardInput: {  // ZB-H1: dx now, the weights' gradients at the W
        Slot& s = live.at(key);
        const at::Tensor out = last_chunk(a.chunk) ? s.output * backward_factor : s.output;
        s.input_grad = weights_due[a.micro].input_pass(out, last_chunk(a.chunk) ? at::Tensor() : s.output_grad, s.input, params);
        s.output = at::Tensor();
        s.output_grad = at::Tensor();
        break;
      }
      case PipeAction::Type::BackwardWeight: {
        if (hooks.before_backward) hooks.before_backward(a.micro, a.chunk);
        weights_due.at(a.micro).weight_pass();
        weights_due.erase(a.micro);
        if (hooks.after_backward) hooks.after_backward(a.micro, a.chunk);
        break;
      }
      case PipeAction::Type::Backward: {
        if (hooks.before_backward) hooks.before_backward(a.micro, a.chunk);
        Slot& s = live.at(key);
        if (last_chunk(a.chunk)) (s.output * backward_factor).backward();
        else torch::autograd::backward({s.output}, {s.output_grad});
        s.output = at::Tensor();
        s.output_grad = at::Tensor();
        if (hooks.after_backward) hooks.after_backward(a.micro, a.chunk);
        if (first_chunk(a.chunk)) live.erase(key);  // nothing to send back
        break;
      }
    }
    if (hooks.after_action) hooks.after_action(a.type);
  }
  if (!live.empty() || !weights_due.empty())
    throw Error("pipeline: the schedule left " + std::to_string(live.size() + weights_due.size()) + " micro-batch chunk(s) unfinished");
  return loss_sum;
}

at::Tensor PipelineStage::evaluate(int micros, const std::function<Batch(int)>& batch) {
  at::NoGradGuard no_grad;
  const GPTConfig& cfg = model_.config();
  const std::vector<int64_t> shape{micro_batch_, cfg.seq_len / model_.shard().ops->seq_split, cfg.d_model};  // --sp: the rank's rows
  const auto act = at::TensorOptions().dtype(residual_dtype()).device(device_);
  auto loss_sum = at::zeros({}, act.dtype(at::kFloat));
  std::map<MicroChunk, at::Tensor> outputs, inputs;
  auto outgoing = [&](const PipeTransfer& t) { return outputs.at({t.micro, t.chunk}).contiguous(); };
  for (const PipeAction& a : schedule(micros, /*forward_only=*/true)) {
    if (a.type == PipeAction::Type::Exchange) {
      for (auto& [k, x] : exchange(*pp_, stage_, a.transfers, outgoing, shape, act).activations) inputs[k] = x;
      for (const auto& t : a.transfers)
        if (t.kind == PipeTransfer::Kind::SendActivation) outputs.erase({t.micro, t.chunk});
      continue;
    }
    if (a.type != PipeAction::Type::Forward) continue;
    const MicroChunk key{a.micro, a.chunk};
    const Batch b = batch_for(a.chunk, a.micro, batch, /*non_blocking=*/false);
    AutocastScope autocast(precision_, device_.type());
    if (model_.needs_mask()) model_.set_documents(b.inputs);
    at::Tensor y = model_.run_blocks(first_chunk(a.chunk) ? model_.embed(local(b.inputs)) : inputs.at(key), a.chunk);
    inputs.erase(key);
    if (last_chunk(a.chunk)) loss_sum += model_.head_loss(y, local(b.targets)).to(at::kFloat);
    else outputs[key] = y.to(residual_dtype());
  }
  return loss_sum;
}

void PipelineStage::sync_tied_embedding(at::Tensor grad) {
  if (stages_ == 1 || !(first() || last())) return;
  if (!model_.config().tie_embeddings) return;  // an untied lm_head: nothing shared between the stages
  at::NoGradGuard no_grad;
  const int peer = first() ? stages_ - 1 : 0;
  // Under ZeRO-3 with --offload all the reduced shard lives on the host: it crosses through a
  // device copy (the communicators take device memory only) and the peer's is added back there.
  const bool on_host = grad.is_cpu() && (!device_.is_cpu() || is_host_memory(grad));
  at::Tensor mine = on_host ? to_device(grad, device_) : grad.contiguous();
  at::Tensor other = at::empty_like(mine);
  pp_->send_recv({{P2POp::Kind::Send, mine, peer}, {P2POp::Kind::Recv, other, peer}})->wait();
  grad.add_(on_host ? other.to(grad.device()) : other);
}

std::vector<std::pair<int64_t, double>> count_weights(const std::string& name, const at::Tensor& local, const GPT& model) {
  const ModelShard& shard = model.shard();
  if (name == "wte" && shard.head && !shard.embedding) return {{local.numel(), 0.0}};  // the tied copy
  if (shard.tp == 1) return {{local.numel(), 1.0}};
  if (!is_tensor_parallel(name)) return {{local.numel(), 1.0 / static_cast<double>(shard.tp)}};
  std::vector<std::pair<int64_t, double>> runs;
  for (const auto& [piece, weight] : tp_weighted_pieces(name, local, model)) runs.push_back({piece.numel(), weight});
  return runs;
}

at::Tensor pipeline_grad_sq_norm_share(GPT& model, int64_t replicas, const GradOf& grad_at) {
  at::NoGradGuard no_grad;
  std::vector<std::pair<at::Tensor, double>> pieces;
  const double ep = static_cast<double>(model.shard().ops->expert_split);
  for (const auto& item : model.named_parameters()) {
    const at::Tensor g = grad_of(grad_at, item.value());
    if (!g.defined()) continue;
    // Expert parallelism: an expert's reduced gradient is on dp / ep ranks, not dp.
    const double copies = ep > 1.0 && is_expert_parameter(item.key()) ? ep : 1.0;
    const at::Tensor flat = g.reshape({-1});
    int64_t start = 0;
    for (const auto& [length, weight] : count_weights(item.key(), g, model)) {
      pieces.push_back({flat.narrow(0, start, length), weight * copies});
      start += length;
    }
  }
  at::Tensor total = weighted_sq_norm(pieces);
  if (!total.defined()) {
    const auto params = model.parameters();
    total = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(params.empty() ? at::kCPU : params[0].device()));
  }
  return total / static_cast<double>(replicas);
}

int pipeline_stage_of(const std::string& name, const std::vector<int64_t>& block_counts, int stages) {
  const auto starts = pipeline_block_starts(block_counts);
  const int virtual_stages = static_cast<int>(block_counts.size());
  if (name == "wte" || name == "wpe") return 0;
  if (name.rfind("ln_f.", 0) == 0 || name == "lm_head") return stages - 1;
  if (name.rfind("h.", 0) == 0) {
    const int64_t i = std::stoll(name.substr(2));
    for (int v = 0; v < virtual_stages; ++v)
      if (i >= starts[static_cast<size_t>(v)] && i < starts[static_cast<size_t>(v) + 1]) return v % stages;
  }
  throw Error("pipeline: no stage holds parameter " + name);
}

}  // namespace kiln
