// models/linear_cross_entropy.cpp -- chunked output layer + cross-entropy with its gradient.
#include "models/linear_cross_entropy.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/autograd.h>

namespace kiln {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The dtype the products run in: autocast's for x's device when it is on, else x's own.
at::ScalarType compute_dtype_of(const at::Tensor& x) {
  const auto type = x.device().type();
  return at::autocast::is_autocast_enabled(type) ? at::autocast::get_autocast_dtype(type) : x.scalar_type();
}

struct LinearCrossEntropyFunction : public torch::autograd::Function<LinearCrossEntropyFunction> {
  // Runs with grad mode off (Function::apply), so whether a gradient is wanted is decided by the
  // caller (need_grad), where grad mode still says it: under evaluation's no-grad, wte keeps its
  // requires_grad, and only the mode tells that no backward will come.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& targets,
                            int64_t vocab, int64_t chunk_rows, bool need_grad) {
    const int64_t N = x.size(0), Vp = weight.size(0), V = vocab;
    // The products' operands, cast once to the compute dtype; autocast, still on here, then
    // leaves the products alone (their inputs are already in its dtype), and everything else
    // below runs in fp32 on fp32 tensors.
    const at::ScalarType dtype = compute_dtype_of(x);
    const at::Tensor xc = x.to(dtype), wc = weight.to(dtype);
    if (chunk_rows <= 0) chunk_rows = std::max<int64_t>(1, (int64_t{256} << 20) / (4 * Vp));

    at::Tensor G;  // dloss/dz in the compute dtype
    if (need_grad) {
      G = at::empty({N, Vp}, xc.options());
      if (Vp > V) G.narrow(1, V, Vp - V).zero_();
    }
    at::Tensor loss_sum = at::zeros({}, x.options().dtype(at::kFloat));
    const double inv_n = 1.0 / static_cast<double>(N);
    for (int64_t a = 0; a < N; a += chunk_rows) {
      const int64_t c = std::min(chunk_rows, N - a);
      const at::Tensor t = targets.narrow(0, a, c).unsqueeze(1);                 // [c, 1]
      at::Tensor z = at::mm(xc.narrow(0, a, c), wc.t());                          // [c, Vp], compute dtype
      at::Tensor zf = z.narrow(1, 0, V).to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);  // [c, V]
      const at::Tensor lse = at::logsumexp(zf, {1}, /*keepdim=*/true);           // [c, 1]
      loss_sum.add_((lse - zf.gather(1, t)).sum());
      if (need_grad) {
        zf.sub_(lse).exp_().mul_(inv_n);                                          // softmax / N
        zf.scatter_add_(1, t, at::full({c, 1}, -inv_n, zf.options()));            // - onehot / N
        G.narrow(0, a, c).narrow(1, 0, V).copy_(zf);
      }
    }
    if (need_grad) {
      at::Tensor gx = at::mm(G, wc).to(x.scalar_type());          // [N, d]
      at::Tensor gw = at::mm(G.t(), xc).to(weight.scalar_type());  // [Vp, d]
      ctx->save_for_backward({gx, gw});
    }
    return loss_sum.mul_(inv_n);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& g = grad_outputs[0];  // 0-dim: d(whatever backward started from)/dloss
    return {saved[0] * g.to(saved[0].scalar_type()), saved[1] * g.to(saved[1].scalar_type()), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor plain_linear_cross_entropy(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& targets,
                                      int64_t vocab) {
  auto lg = at::linear(x, weight);
  if (lg.size(-1) != vocab) lg = lg.narrow(-1, 0, vocab);
  // In fp32 whatever the compute precision: log-sum-exp over the vocabulary needs its range.
  return at::cross_entropy_loss(lg.to(at::kFloat), targets);
}

at::Tensor linear_cross_entropy(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& targets,
                                int64_t vocab, int64_t chunk_rows) {
  if (compute_dtype_of(x) == at::kHalf) return plain_linear_cross_entropy(x, weight, targets, vocab);
  const bool need_grad = at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad());
  return LinearCrossEntropyFunction::apply(x, weight, targets, vocab, chunk_rows, need_grad);
}

}  // namespace kiln
