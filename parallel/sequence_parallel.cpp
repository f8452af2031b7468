// parallel/sequence_parallel.cpp -- the row collectives as autograd functions, and the hooks.
#include "parallel/sequence_parallel.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <string>
#include <vector>

#include "models/gpt.h"
#include "parallel/group_capsule.h"
#include "parallel/tensor_parallel.h"
#include "runtime/error.h"

namespace kiln {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor gather_blocks(const at::Tensor& x, int64_t dim, Communicator& g) {
  const at::Tensor in = x.contiguous();
  std::vector<int64_t> shape{g.size()};
  for (auto s : in.sizes()) shape.push_back(s);
  at::Tensor out = at::empty(shape, in.options());  // [n, ...x]: rank r's x at out[r]
  g.all_gather(out, in)->wait();
  return out.movedim(0, dim).flatten(dim, dim + 1);  // rank-major along dim
}

at::Tensor scatter_blocks(const at::Tensor& x, int64_t dim, Communicator& g) {
  const int64_t n = g.size();
  if (x.size(dim) % n != 0) {
    throw Error("reduce_scatter_rows: " + std::to_string(x.size(dim)) + " rows do not divide over " + std::to_string(n) +
                " ranks of " + g.name());
  }
  const at::Tensor in = x.unflatten(dim, {n, x.size(dim) / n}).movedim(dim, 0).contiguous();  // [n, ...block]
  at::Tensor out = at::empty(in.sizes().slice(1), in.options());
  g.reduce_scatter(out, in, ReduceOp::Sum)->wait();
  return out;
}

struct AllGatherRows : public torch::autograd::Function<AllGatherRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t dim, at::IValue group) {
    ctx->saved_data["g"] = group;
    ctx->saved_data["dim"] = dim;
    return gather_blocks(x, dim, group_in(group));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {scatter_blocks(grads[0], ctx->saved_data["dim"].toInt(), group_in(ctx->saved_data["g"])), at::Tensor(),
            at::Tensor()};
  }
};

struct ReduceScatterRows : public torch::autograd::Function<ReduceScatterRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t dim, at::IValue group) {
    ctx->saved_data["g"] = group;
    ctx->saved_data["dim"] = dim;
    return scatter_blocks(x, dim, group_in(group));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {gather_blocks(grads[0], ctx->saved_data["dim"].toInt(), group_in(ctx->saved_data["g"])), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor all_gather_rows(const at::Tensor& x, int64_t dim, const std::shared_ptr<Communicator>& group) {
  return AllGatherRows::apply(x, dim, group_capsule(group));
}

at::Tensor reduce_scatter_rows(const at::Tensor& x, int64_t dim, const std::shared_ptr<Communicator>& group) {
  return ReduceScatterRows::apply(x, dim, group_capsule(group));
}

void sum_replicated_gradients_over_tp(GPT& model, const std::shared_ptr<Communicator>& tp) {
  for (const auto& item : model.named_parameters()) {
    if (is_tensor_parallel(item.key())) continue;
    at::Tensor p = item.value();
    std::weak_ptr<Communicator> group = tp;
    p.register_hook([group](const at::Tensor& grad) {
      auto g = group.lock();
      if (!g) throw Error("sequence parallelism: the tp group is gone before the backward pass");
      at::Tensor sum = grad.contiguous().clone();
      g->all_reduce(sum, ReduceOp::Sum)->wait();
      return sum;
    });
  }
}

}  // namespace kiln
