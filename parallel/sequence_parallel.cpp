// parallel/sequence_parallel.cpp -- the row collectives as autograd functions, and the hooks.
#include "parallel/sequence_parallel.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/autograd.h>

#include <string>
#include <vector>

#include "distributed/error.h"
#include "kernels/matmul.h"
#include "models/gpt.h"
#include "parallel/group_capsule.h"
#include "parallel/tensor_parallel.h"

namespace kiln {

at::Tensor gather_rows(const at::Tensor& x, int64_t dim, Communicator& g) {
  const at::Tensor in = x.contiguous();
  std::vector<int64_t> shape{g.size()};
  for (auto s : in.sizes()) shape.push_back(s);
  at::Tensor out = at::empty(shape, in.options());  // [n, ...x]: rank r's x at out[r]
  g.all_gather(out, in)->wait();
  return out.movedim(0, dim).flatten(dim, dim + 1);  // rank-major along dim
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor gather_blocks(const at::Tensor& x, int64_t dim, Communicator& g) { return gather_rows(x, dim, g); }

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

// y = all_gather_rows(x) W^T + b, keeping x's rows (not the gathered whole) for backward, which
// gathers them again (Megatron's SP does the same: Korthikanti et al. s4.2.2). Under autocast x
// is cast to the compute dtype before the gather, as at::linear would cast it after; the input
// gradient is reduce-scattered in x's own dtype (the bytes plain tp's all-reduce moves).
// The backward computes only what its caller asks for (needs_input_grad: the graph task's own
// outputs): ZB-H1's input pass (parallel/backward_split.h) wants dX alone -- no gather, no dW --
// and its weight pass dW and db alone -- no dX, no reduce-scatter -- so the split backward moves
// the bytes of one backward, not of two.
struct GatheredLinear : public torch::autograd::Function<GatheredLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                            at::IValue group) {
    const auto type = x.device().type();
    const at::Tensor xc = at::autocast::is_autocast_enabled(type) ? x.to(at::autocast::get_autocast_dtype(type)) : x;
    const at::Tensor whole = gather_blocks(xc, 1, group_in(group));
    const at::Tensor y = linear_product(whole, w, b.numel() > 0 ? b : at::Tensor());
    ctx->save_for_backward({xc, w});
    ctx->saved_data["g"] = group;
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["b_dtype"] = b.numel() > 0 ? static_cast<int64_t>(b.scalar_type()) : int64_t{-1};
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &xc = saved[0], &w = saved[1];
    Communicator& g = group_in(ctx->saved_data["g"]);
    const at::Tensor dy = grads[0].contiguous();
    const at::Tensor dy2 = dy.reshape({-1, dy.size(-1)});
    at::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) {
      const auto x_dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
      dx = scatter_blocks(matmul_product(dy, w.to(dy.scalar_type())).to(x_dtype), 1, g);
    }
    if (ctx->needs_input_grad(1)) {
      const at::Tensor whole = gather_blocks(xc, 1, g);  // [B, T, K] again
      dw = matmul_product(dy2.t(), whole.reshape({-1, whole.size(-1)}).to(dy.scalar_type())).to(w.scalar_type());
    }
    const int64_t b_dtype = ctx->saved_data["b_dtype"].toInt();
    if (b_dtype >= 0 && ctx->needs_input_grad(2)) db = dy2.sum(0).to(static_cast<at::ScalarType>(b_dtype));
    return {dx, dw, db, at::Tensor()};
  }
};

}  // namespace

at::Tensor gathered_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                           const std::shared_ptr<Communicator>& group, const Float8Scaling* float8) {
  if (float8 != nullptr && float8->on) {
    const auto type = x.device().type();
    const at::Tensor xc = at::autocast::is_autocast_enabled(type) ? x.to(at::autocast::get_autocast_dtype(type)) : x;
    if (float8->rowwise) return linear_product(all_gather_rows(xc, 1, group), w, b, float8);
    Float8Scaling s = *float8;  // tensorwise: the rows gathered in 8 bits (kernels/float8.h)
    s.rows_amax = amax_over(group);
    s.gather_rows = [group](const at::Tensor& t) { return gather_blocks(t, 1, *group); };
    s.scatter_rows = [group](const at::Tensor& t) { return scatter_blocks(t, 1, *group); };
    return linear_product(xc, w, b, &s);
  }
  // No bias: an empty tensor stands for it (an autograd function's inputs must be defined).
  return GatheredLinear::apply(x, w, b.defined() ? b : at::empty({0}, w.options().requires_grad(false)), group_capsule(group));
}

at::Tensor all_gather_rows(const at::Tensor& x, int64_t dim, const std::shared_ptr<Communicator>& group) {
  return AllGatherRows::apply(x, dim, group_capsule(group));
}

at::Tensor reduce_scatter_rows(const at::Tensor& x, int64_t dim, const std::shared_ptr<Communicator>& group) {
  return ReduceScatterRows::apply(x, dim, group_capsule(group));
}

void sum_replicated_gradients_over_tp(GPT& model, const std::shared_ptr<Communicator>& tp, bool head_norms_only) {
  auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  for (const auto& item : model.named_parameters()) {
    if (is_tensor_parallel(item.key())) continue;
    if (head_norms_only && !ends_with(item.key(), "attn.q_norm.weight") && !ends_with(item.key(), "attn.k_norm.weight")) continue;
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
