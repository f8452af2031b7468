// parallel/expert_parallel.cpp -- the all_to_all autograd function, the dispatch, the slicer,
// the expert gradients' scaling and norm.
#include "parallel/expert_parallel.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/autograd.h>

#include "distributed/comm.h"
#include "distributed/device_check.h"
#include "distributed/error.h"
#include "optim/grad_clip.h"
#include "parallel/group_capsule.h"
#include "parallel/tensor_parallel.h"

namespace kiln {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Rows of x exchanged: in_splits[j] rows to rank j, out_splits[j] rows from it.
at::Tensor exchanged(const at::Tensor& x, const std::vector<int64_t>& out_splits, const std::vector<int64_t>& in_splits,
                     Communicator& group) {
  int64_t rows = 0;
  for (int64_t n : out_splits) rows += n;
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] = rows;
  at::Tensor out = at::empty(shape, x.options());
  group.all_to_all(out, x.contiguous(), out_splits, in_splits)->wait();
  return out;
}

// all_to_all forward; the reverse all_to_all backward (the splits swapped).
struct AllToAllRows : public torch::autograd::Function<AllToAllRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::vector<int64_t> out_splits,
                            std::vector<int64_t> in_splits, at::IValue group) {
    ctx->saved_data["out"] = out_splits;
    ctx->saved_data["in"] = in_splits;
    ctx->saved_data["group"] = group;
    return exchanged(x, out_splits, in_splits, group_in(group));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto out_splits = ctx->saved_data["out"].toIntVector(), in_splits = ctx->saved_data["in"].toIntVector();
    return {exchanged(grads[0], in_splits, out_splits, group_in(ctx->saved_data["group"])), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool is_expert_parameter(const std::string& name) {
  return ends_with(name, "moe.fc_w") || ends_with(name, "moe.fc_b") || ends_with(name, "moe.proj_w") || ends_with(name, "moe.proj_b");
}

at::Tensor all_to_all_rows(const at::Tensor& x, const std::vector<int64_t>& out_splits, const std::vector<int64_t>& in_splits,
                           const std::shared_ptr<Communicator>& group) {
  return AllToAllRows::apply(x, out_splits, in_splits, group_capsule(group));
}

ModelShard make_expert_parallel(ModelShard shard, const GPTConfig& cfg, const std::shared_ptr<Communicator>& ep,
                                std::shared_ptr<ExpertTraffic> traffic) {
  const int64_t n = ep->size(), E = cfg.n_experts;
  if (!cfg.is_moe()) throw ConfigError("--ep " + std::to_string(n) + " divides the experts of an MoE model: give --n-experts");
  if (E % n != 0) throw ConfigError("--ep " + std::to_string(n) + " does not divide the experts (--n-experts " + std::to_string(E) + ")");
  auto ops = std::make_shared<LayerOps>(*shard.ops);
  ops->expert_split = n;
  ops->expert_rank = ep->rank();
  const int64_t local = E / n;
  // The counts, on the device: to rank j the counts of its experts; from rank j, c[j][l] for this
  // rank's expert l.
  ops->exchange_counts = [ep, n, local](const at::Tensor& counts) {
    const at::Tensor mine = counts.to(at::kLong).contiguous();
    at::Tensor theirs = at::empty({n * local}, mine.options());
    ep->all_to_all(theirs, mine, {}, {})->wait();
    return theirs;
  };
  ops->dispatch_experts = [ep, n, local, traffic](const at::Tensor& rows, const std::vector<int64_t>& counts,
                                                  const std::vector<int64_t>& c, const at::Tensor& c_device,
                                                  const LayerOps::ExpertRunner& run_local) {
    if (static_cast<int64_t>(c.size()) != n * local || static_cast<int64_t>(counts.size()) != n * local ||
        c_device.numel() != n * local)
      throw Error("expert parallelism: the dispatch needs all E counts and the exchanged ones");
    std::vector<int64_t> send(static_cast<size_t>(n), 0);
    for (int64_t e = 0; e < n * local; ++e) send[static_cast<size_t>(e / local)] += counts[static_cast<size_t>(e)];
    const int64_t* cj = c.data();  // [n, local], row j from rank j
    std::vector<int64_t> recv(static_cast<size_t>(n), 0), local_counts(static_cast<size_t>(local), 0);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t l = 0; l < local; ++l) {
        recv[static_cast<size_t>(j)] += cj[j * local + l];
        local_counts[static_cast<size_t>(l)] += cj[j * local + l];
      }
    const at::Tensor arrived = all_to_all_rows(rows, recv, send, ep);  // ordered (j, l)
    if (traffic) {
      traffic->rows_sent += rows.size(0);
      traffic->rows_received += arrived.size(0);
    }
    // (j, l) -> (l, j): each local expert's rows consecutive. Built on the device from the
    // exchanged counts (a host-built index would be a pageable copy, which waits for the
    // all_to_all just queued): each arrived row's key l n + j, repeated c[j][l] times in arrival
    // order, and a stable sort of the keys lists the rows by (l, j), in arrival order within a block.
    const at::Tensor block = at::arange(n * local, c_device.options());
    const at::Tensor keys = block.remainder(local).mul_(n).add_(at::div(block, local, "floor"));
    const at::Tensor row_keys = at::repeat_interleave(keys, c_device, /*dim=*/0, /*output_size=*/arrived.size(0));
    const at::Tensor by_expert = std::get<1>(at::sort(row_keys, /*stable=*/true, /*dim=*/0, /*descending=*/false));
    const at::Tensor out = run_local(arrived.index_select(0, by_expert), local_counts);
    // Back to (j, l) order, then home.
    const at::Tensor back = at::zeros({arrived.size(0), out.size(1)}, out.options()).index_copy(0, by_expert, out);
    return all_to_all_rows(back, send, recv, ep);
  };
  shard.ops = std::move(ops);
  return shard;
}

at::Tensor ep_slice_of(const std::string& name, const at::Tensor& w, int64_t ep, int64_t rank) {
  if (ep <= 1 || !is_expert_parameter(name)) return w;
  const int64_t local = w.size(0) / ep;
  return w.narrow(0, rank * local, local);
}

GPT::TensorSlicer ep_slicer(int64_t ep, int64_t rank) {
  return [ep, rank](const std::string& name, const at::Tensor& whole) { return ep_slice_of(name, whole, ep, rank); };
}

void scale_expert_gradients(const std::vector<at::Tensor>& expert_grads, int64_t ep) {
  std::vector<at::Tensor> defined;
  for (const auto& g : expert_grads)
    if (g.defined()) defined.push_back(g);
  if (!defined.empty() && ep > 1) at::_foreach_mul_(defined, 1.0 / static_cast<double>(ep));
}

at::Tensor grad_norm_ep(GPT& model, double grad_scale, const std::shared_ptr<Communicator>& ep,
                        const std::shared_ptr<Communicator>& tp, const GradOf& grad_at) {
  at::NoGradGuard no_grad;
  at::Tensor first;  // a gradient, for the device and dtype of the zeros below
  std::vector<std::pair<at::Tensor, double>> pieces[3];  // tp-split, replicated, experts
  for (const auto& item : model.named_parameters()) {
    const at::Tensor g = grad_of(grad_at, item.value());
    if (!g.defined()) continue;
    if (!first.defined()) first = g;
    const bool split = tp && is_tensor_parallel(item.key());
    const int kind = split ? 0 : is_expert_parameter(item.key()) ? 2 : 1;
    if (!split) {
      pieces[kind].push_back({g, 1.0});
      continue;
    }
    for (const auto& piece : tp_weighted_pieces(item.key(), g, model)) pieces[kind].push_back(piece);
  }
  at::Tensor sq[3];
  for (int kind = 0; kind < 3; ++kind) sq[kind] = weighted_sq_norm(pieces[kind]);
  // A rank without gradients still joins both all-reduces (its peers wait in them), with zeros on
  // the run's device.
  const auto params = model.parameters();
  const auto opts = (first.defined() ? first : params.front()).options().dtype(at::kDouble);
  for (auto& t : sq)
    if (!t.defined()) t = at::zeros({}, opts);
  at::Tensor split_sum = sq[0].reshape({1}).clone(), expert_sum = sq[2].reshape({1}).clone();
  if (tp) tp->all_reduce(split_sum, ReduceOp::Sum)->wait();
  ep->all_reduce(expert_sum, ReduceOp::Sum)->wait();
  at::Tensor total = (split_sum[0] + sq[1] + expert_sum[0]).sqrt().to(at::kFloat);
  if (grad_scale != 1.0) total = total / grad_scale;
  return total;
}

}  // namespace kiln
