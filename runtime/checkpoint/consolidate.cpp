// runtime/checkpoint/consolidate.cpp -- one whole tensor at a time: ZeRO, then tp, then pp; and back.
#include "runtime/checkpoint/consolidate.h"

#include <algorithm>
#include <memory>
#include <string>

#include <ATen/ATen.h>

#include "distributed/device.h"
#include "distributed/device_check.h"
#include "distributed/error.h"
#include "distributed/host_memory.h"
#include "distributed/mesh.h"
#include "models/gpt.h"
#include "optim/adamw.h"
#include "parallel/expert_parallel.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"
#include "parallel/zero.h"

namespace kiln {

namespace {
const char* part_name(CheckpointPart part) {
  switch (part) {
    case CheckpointPart::Param: return "parameter";
    case CheckpointPart::ExpAvg: return "exp_avg";
    case CheckpointPart::ExpAvgSq: return "exp_avg_sq";
    case CheckpointPart::Step: return "step";
  }
  return "?";
}
StatePart state_part(CheckpointPart part) {
  return part == CheckpointPart::ExpAvg ? StatePart::ExpAvg : part == CheckpointPart::ExpAvgSq ? StatePart::ExpAvgSq : StatePart::Param;
}
}  // namespace

WholeModel::WholeModel(GPT& model, AdamW* optimizer, ZeroEngine* zero, const Mesh* mesh, Communicator* host_world,
                       std::vector<int64_t> stage_blocks, c10::Device device)
    : model_(model), optimizer_(optimizer), zero_(zero), mesh_(mesh), host_(host_world),
      stage_blocks_(std::move(stage_blocks)), device_(device) {
  if (!zero_ && !optimizer_) throw Error("checkpoint: the model's state needs its AdamW or its ZeRO engine");
  // A model on the meta device gives the whole model's names and shapes without allocating.
  const GPT whole(model.config(), at::TensorOptions().device(at::kMeta));
  for (const auto& item : whole.named_parameters(/*recurse=*/true)) params_.emplace_back(item.key(), item.value().sizes().vec());
  for (const auto& item : model.named_parameters(/*recurse=*/true)) local_.emplace(item.key(), item.value());
  if (stage_blocks_.empty()) stage_blocks_ = {model.config().n_layer};
}

WholeModel::WholeModel(const WholeModel& live, const StateSnapshot& snap, const Mesh* host_mesh, Communicator* host_world)
    : model_(live.model_), optimizer_(live.optimizer_), zero_(live.zero_), mesh_(live.mesh_ ? host_mesh : nullptr),
      host_(host_world), stage_blocks_(live.stage_blocks_), device_(at::kCPU), params_(live.params_), local_(live.local_),
      snap_(&snap) {}

bool WholeModel::snapshot_kept() const {
  if (!mesh_) return true;
  const MeshCoord c = mesh_->coord();
  return c.cp == 0 && c.dp < std::max(1, mesh_->shape().ep);
}

void WholeModel::snapshot(StateSnapshot& into) {
  at::NoGradGuard no_grad;
  if (snap_) throw Error("checkpoint: a snapshot's view cannot take a snapshot");
  const bool keep = !zero_ && snapshot_kept();
  if (!into.pool.defined()) {
    int64_t total = 0;
    if (zero_) total = zero_->snapshot_numel();
    else if (keep)
      for (const auto& [name, p] : local_) total += 3 * p.numel() + 1;
    into.pool = host_buffer(std::max<int64_t>(total, 1), pin_for(device_), at::kFloat);
  }
  int64_t used = 0;
  auto alloc = [&](int64_t n) {
    if (used + n > into.pool.numel()) throw Error("checkpoint: the snapshot outgrew its pool");
    at::Tensor t = into.pool.narrow(0, used, n);
    used += n;
    return t;
  };
  if (zero_) {
    zero_->snapshot(into.zero, alloc);
  } else if (keep) {
    for (const auto& [name, p] : local_) {
      auto& slot = into.own[name];
      if (!slot[0].defined()) slot = {alloc(p.numel()).view(p.sizes()), alloc(p.numel()).view(p.sizes()), alloc(p.numel()).view(p.sizes()), alloc(1).view(std::vector<int64_t>{})};
      const CheckpointPart parts[4] = {CheckpointPart::Param, CheckpointPart::ExpAvg, CheckpointPart::ExpAvgSq, CheckpointPart::Step};
      for (size_t i = 0; i < 4; ++i) slot[i].copy_(own_state(p, parts[i]), /*non_blocking=*/true);
    }
  }
  synchronize(device_);  // the copies queued behind the step's update
}

at::Tensor WholeModel::state_of(const std::string& name, const at::Tensor& param, CheckpointPart part) const {
  if (!snap_) return own_state(param, part);
  const auto it = snap_->own.find(name);
  if (it == snap_->own.end()) throw Error("checkpoint: the snapshot lacks " + name);
  return it->second[part == CheckpointPart::Param ? 0 : part == CheckpointPart::ExpAvg ? 1 : part == CheckpointPart::ExpAvgSq ? 2 : 3];
}

at::Tensor WholeModel::zero_gather(const at::Tensor& param, CheckpointPart part) {
  if (!snap_) return zero_->gather_param(param, state_part(part));
  return zero_->gather_snapshot(snap_->zero, param, state_part(part), *mesh_->dp_cp(), mesh_->expert_dp().get());
}

const GPTConfig& WholeModel::config() const { return model_.config(); }

bool WholeModel::writer() const { return !mesh_ || mesh_->world()->rank() == 0; }

std::vector<int64_t> WholeModel::shape_of(const std::string& name, CheckpointPart part) const {
  if (part == CheckpointPart::Step) return {};
  for (const auto& [n, shape] : params_)
    if (n == name) return shape;
  throw Error("checkpoint: the model has no parameter " + name);
}

at::Tensor WholeModel::local_part(const std::string& name, const at::Tensor& param, CheckpointPart part) {
  if (zero_) {
    if (part == CheckpointPart::Step) {
      const int64_t steps = snap_ ? snap_->zero.steps : zero_->steps_taken();
      return to_device(at::full({}, static_cast<double>(steps), at::kFloat), device_);
    }
    return zero_gather(param, part);  // collective over dp
  }
  if (mesh_ && (mesh_->coord().dp != 0 || mesh_->coord().cp != 0)) return at::Tensor();  // dp and cp replicate it
  return state_of(name, param, part);
}

at::Tensor WholeModel::own_state(const at::Tensor& param, CheckpointPart part) const {
  // Parameters: the fp32 master where AdamW keeps one (16-bit working weights), so checkpoints
  // hold fp32 weights under every precision policy.
  if (part == CheckpointPart::Param) return optimizer_ ? optimizer_->state_of(param).master.detach() : param.detach();
  const auto st = optimizer_->state_of(param);
  return part == CheckpointPart::ExpAvg ? st.exp_avg : part == CheckpointPart::ExpAvgSq ? st.exp_avg_sq : st.step;
}

at::Tensor WholeModel::gather(const std::string& name, CheckpointPart part) {
  at::NoGradGuard no_grad;
  const MeshShape shape = mesh_ ? mesh_->shape() : MeshShape{};
  const MeshCoord me = mesh_ ? mesh_->coord() : MeshCoord{};
  const int stage = shape.pp > 1 ? pipeline_stage_of(name, stage_blocks_, static_cast<int>(shape.pp)) : 0;
  const std::vector<int64_t> whole_shape = shape_of(name, part);
  at::Tensor whole;  // on the stage's writer
  const bool ep_split = shape.ep > 1 && part != CheckpointPart::Step && is_expert_parameter(name);
  if (me.pp == stage && ep_split) {
    // Expert parallelism: the first ep group's experts (dp ranks [0, ep)), all-gathered along the
    // expert dimension onto dp rank 0 (under ZeRO, each of them first gathers its experts' shards
    // over its expert-data-parallel group, whose rank 0 it is).
    const auto it = local_.find(name);
    if (it == local_.end()) throw Error("checkpoint: this rank lacks parameter " + name);
    // ZeRO: each expert-data-parallel group's shards first, onto its rank 0 (dp rank < ep).
    const at::Tensor gathered = zero_ ? zero_gather(it->second, part) : at::Tensor();
    if (me.dp < shape.ep && me.cp == 0) {
      const at::Tensor mine = to_device((zero_ ? gathered : state_of(name, it->second, part)).contiguous(), device_);
      at::Tensor all = at::empty({shape.ep * mine.numel()}, mine.options());
      mesh_->ep()->all_gather(all, mine.reshape({-1}))->wait();
      if (me.dp == 0) whole = all.cpu().to(at::kFloat).view(whole_shape).contiguous();
    }
  } else if (me.pp == stage) {
    const auto it = local_.find(name);
    if (it == local_.end()) throw Error("checkpoint: stage " + std::to_string(stage) + " lacks parameter " + name);
    const at::Tensor* param = &it->second;
    const at::Tensor local = local_part(name, *param, part);  // defined on dp rank 0, cp rank 0
    if (me.dp == 0 && me.cp == 0) {
      if (shape.tp > 1 && part != CheckpointPart::Step && is_tensor_parallel(name)) {
        const at::Tensor mine = to_device(local.contiguous(), device_);
        at::Tensor all = at::empty({shape.tp * mine.numel()}, mine.options());
        mesh_->tp()->all_gather(all, mine.reshape({-1}))->wait();
        if (me.tp == 0) {
          const at::Tensor host = all.cpu();
          std::vector<at::Tensor> pieces;
          for (const auto& c : host.chunk(shape.tp, 0)) pieces.push_back(c.view(local.sizes()));
          whole = tp_assemble(name, pieces, whole_shape, model_.config()).contiguous();
        }
      } else if (me.tp == 0) {
        whole = local.to(at::kCPU, at::kFloat).contiguous();
      }
    }
  }
  const int writer_rank = stage * shape.dp * shape.cp * shape.tp;  // (stage, dp 0, cp 0, tp 0): distributed/mesh.h's order
  const int rank = mesh_ ? mesh_->world()->rank() : 0;
  if (writer_rank != 0 && (rank == 0 || rank == writer_rank)) {
    if (!host_) throw Error("checkpoint: gathering a pipeline stage needs the host group");
    if (rank == 0) {
      whole = at::empty(whole_shape, at::TensorOptions().dtype(at::kFloat));
      host_->send_recv({{P2POp::Kind::Recv, whole, writer_rank}})->wait();
    } else {
      host_->send_recv({{P2POp::Kind::Send, whole, 0}})->wait();
      whole = at::Tensor();
    }
  }
  if (rank == 0 && !whole.defined()) throw Error(std::string("checkpoint: no ") + part_name(part) + " of " + name + " reached rank 0");
  return rank == 0 ? whole : at::Tensor();
}

void WholeModel::load_local(const at::Tensor& param, CheckpointPart part, const at::Tensor& slice) {
  if (zero_) {
    if (part == CheckpointPart::Step) zero_->set_steps_taken(static_cast<int64_t>(slice.item<double>()));
    else zero_->load_param(param, state_part(part), slice);
    return;
  }
  at::Tensor dst = own_state(param, part);
  if (dst.sizes() != slice.sizes()) {
    throw Error(std::string("checkpoint: the ") + part_name(part) + " slice of this layout has another shape");
  }
  dst.copy_(slice);
  if (part == CheckpointPart::Param && dst.data_ptr() != param.data_ptr()) param.detach().copy_(dst);  // the working copy, rounded
  if (part == CheckpointPart::Step) optimizer_->set_steps_taken(static_cast<int64_t>(slice.item<double>()));
}

void WholeModel::scatter(const std::string& name, CheckpointPart part, const at::Tensor& whole) {
  at::NoGradGuard no_grad;
  const std::vector<int64_t> whole_shape = shape_of(name, part);
  at::Tensor t = whole;
  const bool multi = mesh_ && mesh_->world()->size() > 1;
  if (multi) {
    if (!host_) throw Error("checkpoint: loading over several ranks needs the host group");
    if (!writer()) t = at::empty(whole_shape, at::TensorOptions().dtype(at::kFloat));
    else t = whole.to(at::kFloat).contiguous();
    host_->broadcast(t, 0)->wait();
  }
  const auto it = local_.find(name);
  if (it == local_.end()) return;  // another stage's
  const at::Tensor* param = &it->second;
  const int64_t tp = mesh_ ? mesh_->shape().tp : 1, r = mesh_ ? mesh_->coord().tp : 0;
  const int64_t ep = mesh_ ? mesh_->shape().ep : 1;
  at::Tensor slice = part == CheckpointPart::Step ? t : tp_slice_of(name, t, model_.config(), tp, r);
  if (ep > 1 && part != CheckpointPart::Step) slice = ep_slice_of(name, slice, ep, mesh_->ep()->rank());
  load_local(*param, part, slice);
}

std::pair<double, double> weights_fingerprint(GPT& model, ZeroEngine* zero, const AdamW* optimizer, const Mesh* mesh,
                                              c10::Device device) {
  at::NoGradGuard no_grad;
  double sum = 0.0, sq = 0.0, expert_sum = 0.0, expert_sq = 0.0;  // experts: this rank's share under --ep
  const bool ep = mesh && mesh->shape().ep > 1;
  if (zero) {
    std::tie(sum, sq) = zero->param_moments();
  } else {
    for (const auto& item : model.named_parameters()) {
      if (ep && is_expert_parameter(item.key())) {
        const at::Tensor& p = optimizer && optimizer->has_masters() ? optimizer->state_of(item.value()).master : item.value();
        const at::Tensor flat = p.detach().reshape({-1}).to(at::kDouble);
        expert_sum += flat.sum().item<double>();
        expert_sq += flat.square().sum().item<double>();
        continue;
      }
      const at::Tensor& p = optimizer && optimizer->has_masters() ? optimizer->state_of(item.value()).master : item.value();
      const at::Tensor flat = p.detach().reshape({-1}).to(at::kDouble);
      int64_t start = 0;
      for (const auto& [length, weight] : count_weights(item.key(), item.value(), model)) {
        const at::Tensor piece = flat.narrow(0, start, length);
        start += length;
        if (weight == 0.0) continue;
        sum += piece.sum().item<double>() * weight;
        sq += piece.square().sum().item<double>() * weight;
      }
    }
  }
  if (!mesh) return {sum, sq};
  if (ep && !zero) {  // every expert once: the shares summed over the ep group (ZeRO's moments did it)
    auto e = to_device(at::tensor({expert_sum, expert_sq}, at::kDouble), device);
    mesh->ep()->all_reduce(e, ReduceOp::Sum)->wait();
    e = e.cpu() / static_cast<double>(mesh->shape().tp);  // equal on every tp rank: summed over tp below
    sum += e[0].item<double>();
    sq += e[1].item<double>();
  }
  auto t = to_device(at::tensor({sum, sq}, at::kDouble), device);
  if (!zero && mesh->shape().tp > 1) mesh->tp()->all_reduce(t, ReduceOp::Sum)->wait();
  if (mesh->shape().pp > 1) mesh->pp()->all_reduce(t, ReduceOp::Sum)->wait();
  t = t.cpu();
  return {t[0].item<double>(), t[1].item<double>()};
}

}  // namespace kiln
