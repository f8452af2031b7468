// runtime/consolidate.cpp -- ZeRO, then tp, then pp: the gathers of a checkpoint.
#include "runtime/consolidate.h"

#include <memory>

#include <ATen/ATen.h>

#include "models/gpt.h"
#include "optim/adamw.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"
#include "parallel/zero.h"
#include "runtime/device_check.h"
#include "runtime/mesh.h"

namespace kiln {

void consolidate_whole(GPT& model, AdamW* optimizer, ZeroEngine* zero, const Mesh& mesh, Communicator& host_world,
                       const std::vector<int64_t>& stage_blocks, const AdamWConfig& adam, GPT* whole, AdamW* whole_opt,
                       c10::Device device) {
  const MeshShape& shape = mesh.shape();
  const MeshCoord& c = mesh.coord();
  const bool first_dp = c.dp == 0, stage_writer = first_dp && c.tp == 0;
  std::shared_ptr<GPT> part_model, stage_model;
  std::unique_ptr<AdamW> part_opt_holder, stage_opt_holder;
  GPT* part = &model;
  AdamW* part_opt = optimizer;
  if (zero) {
    if (shape.tp == 1 && shape.pp == 1) {  // straight into the whole model (rank 0)
      part = whole;
      part_opt = whole_opt;
    } else if (first_dp) {
      part_model = std::make_shared<GPT>(model.config(), at::TensorOptions(), model.shard());
      part_opt_holder = std::make_unique<AdamW>(part_model->parameters(), adam);
      part = part_model.get();
      part_opt = part_opt_holder.get();
    } else {
      part = nullptr;
      part_opt = nullptr;
    }
    zero->consolidate(part, part_opt);
  }
  if (shape.tp > 1 && first_dp) {
    GPT* target = whole;  // rank 0: straight into the whole model
    AdamW* target_opt = whole_opt;
    if (!whole && stage_writer) {  // another stage's writer: its stage, tp = 1
      ModelShard st;
      st.block_begin = model.shard().block_begin;
      st.block_end = model.shard().block_end;
      st.embedding = model.shard().embedding;
      st.head = model.shard().head;
      stage_model = std::make_shared<GPT>(model.config(), at::TensorOptions(), st);
      stage_opt_holder = std::make_unique<AdamW>(stage_model->parameters(), adam);
      target = stage_model.get();
      target_opt = stage_opt_holder.get();
    }
    gather_to_whole(*part, *part_opt, target, target_opt, mesh.tp(), device);
    part = target;
    part_opt = target_opt;
  }
  if (shape.pp > 1) {
    std::vector<int> writers;  // world rank of (stage s, dp 0, tp 0)
    for (int s = 0; s < shape.pp; ++s) writers.push_back(s * shape.dp * shape.tp);
    gather_stages(stage_writer ? part : nullptr, stage_writer ? part_opt : nullptr, whole, whole_opt, stage_blocks,
                  writers, host_world);
  }
}

std::pair<double, double> weights_fingerprint(GPT& model, ZeroEngine* zero, const Mesh* mesh, c10::Device device) {
  at::NoGradGuard no_grad;
  double sum = 0.0, sq = 0.0;
  if (zero) {
    std::tie(sum, sq) = zero->param_moments();
  } else {
    for (const auto& item : model.named_parameters()) {
      const at::Tensor flat = item.value().detach().reshape({-1}).to(at::kDouble);
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
  auto t = to_device(at::tensor({sum, sq}, at::kDouble), device);
  if (!zero && mesh->shape().tp > 1) mesh->tp()->all_reduce(t, ReduceOp::Sum)->wait();
  if (mesh->shape().pp > 1) mesh->pp()->all_reduce(t, ReduceOp::Sum)->wait();
  t = t.cpu();
  return {t[0].item<double>(), t[1].item<double>()};
}

}  // namespace kiln
