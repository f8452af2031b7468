// parallel/tensor_parallel.cpp -- the autograd functions and the layers.
#include "parallel/tensor_parallel.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/autograd.h>

namespace kiln {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group travels to backward in a capsule (ctx->saved_data holds IValues only).
struct GroupHolder : torch::CustomClassHolder {
  explicit GroupHolder(std::shared_ptr<Communicator> c) : comm(std::move(c)) {}
  std::shared_ptr<Communicator> comm;
};
at::IValue capsule(const std::shared_ptr<Communicator>& tp) {
  return at::IValue::make_capsule(c10::make_intrusive<GroupHolder>(tp));
}
Communicator& group_of(AutogradContext* ctx) {
  return *c10::static_intrusive_pointer_cast<GroupHolder>(ctx->saved_data["tp"].toCapsule())->comm;
}

// A summed copy of t over the group (t itself is left alone).
at::Tensor all_reduced(const at::Tensor& t, Communicator& tp, ReduceOp op = ReduceOp::Sum) {
  at::Tensor out = t.contiguous().clone();
  tp.all_reduce(out, op)->wait();
  return out;
}

struct CopyToTp : public torch::autograd::Function<CopyToTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::IValue tp) {
    ctx->saved_data["tp"] = std::move(tp);
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_reduced(grads[0], group_of(ctx)), at::Tensor()};
  }
};

struct ReduceFromTp : public torch::autograd::Function<ReduceFromTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::IValue tp) {
    ctx->saved_data["tp"] = tp;
    return all_reduced(x, *c10::static_intrusive_pointer_cast<GroupHolder>(tp.toCapsule())->comm);
  }
  static variable_list backward(AutogradContext* /*ctx*/, variable_list grads) { return {grads[0], at::Tensor()}; }
};

// Cross-entropy over vocabulary-split logits (the header has the math).
struct VocabParallelCrossEntropy : public torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets,
                            int64_t vocab_start, at::IValue tp_capsule) {
    auto& tp = *c10::static_intrusive_pointer_cast<GroupHolder>(tp_capsule.toCapsule())->comm;
    const int64_t rows = logits.size(1);
    const at::Tensor z = logits.to(at::kFloat);
    const at::Tensor m = all_reduced(std::get<0>(z.max(1)), tp, ReduceOp::Max);
    const at::Tensor shifted = z - m.unsqueeze(1);
    at::Tensor local = targets - vocab_start;
    const at::Tensor outside = local.lt(0).logical_or(local.ge(rows));
    local = local.masked_fill(outside, 0);
    const at::Tensor target_logit = shifted.gather(1, local.unsqueeze(1)).squeeze(1).masked_fill(outside, 0.0);
    const at::Tensor e = shifted.exp();
    // The target logits and the sums of exponentials in one all-reduce.
    const at::Tensor both = all_reduced(at::stack({target_logit, e.sum(1)}), tp);
    const at::Tensor sum_exp = both[1];
    const at::Tensor loss = (sum_exp.log() - both[0]).mean();
    ctx->save_for_backward({e / sum_exp.unsqueeze(1), local, outside});
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& softmax = saved[0];
    const at::Tensor& local = saved[1];
    const at::Tensor& outside = saved[2];
    const int64_t n = softmax.size(0);
    // d loss / d z = (softmax - onehot(target)) / N, the one-hot only where this rank holds it.
    at::Tensor onehot = at::zeros_like(softmax).scatter_(1, local.unsqueeze(1), 1.0);
    onehot.masked_fill_(outside.unsqueeze(1), 0.0);
    at::Tensor dz = (softmax - onehot) * (grads[0] / static_cast<double>(n));
    return {dz.to(static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt())), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor copy_to_tp(const at::Tensor& x, const std::shared_ptr<Communicator>& tp) {
  return CopyToTp::apply(x, capsule(tp));
}

at::Tensor reduce_from_tp(const at::Tensor& x, const std::shared_ptr<Communicator>& tp) {
  return ReduceFromTp::apply(x, capsule(tp));
}

at::Tensor column_parallel_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                  const std::shared_ptr<Communicator>& tp) {
  return at::linear(copy_to_tp(x, tp), weight, bias);
}

at::Tensor row_parallel_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                               const std::shared_ptr<Communicator>& tp) {
  at::Tensor y = reduce_from_tp(at::linear(x, weight), tp);
  return bias.defined() ? y + bias : y;
}

at::Tensor vocab_parallel_embedding(const at::Tensor& ids, const at::Tensor& table, int64_t vocab_start,
                                    const std::shared_ptr<Communicator>& tp) {
  at::Tensor local = ids - vocab_start;
  const at::Tensor outside = local.lt(0).logical_or(local.ge(table.size(0)));
  local = local.masked_fill(outside, 0);
  at::Tensor partial = at::embedding(table, local).masked_fill(outside.unsqueeze(-1), 0.0);
  return reduce_from_tp(partial, tp);
}

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, int64_t vocab_start,
                                        const std::shared_ptr<Communicator>& tp) {
  return VocabParallelCrossEntropy::apply(logits, targets, vocab_start, capsule(tp));
}

}  // namespace kiln
