// models/linear_cross_entropy.cpp -- chunked output layer + cross-entropy with its gradient.
#include "models/linear_cross_entropy.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>

#include "kernels/classifier.h"
#include "kernels/matmul.h"

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
                            int64_t vocab, int64_t chunk_rows, bool need_grad, Kernels kernels, bool logits16) {
    const int64_t N = x.size(0), Vp = weight.size(0), V = vocab;
    // The products' operands, cast once to the compute dtype (autocast's when it is on).
    const at::ScalarType dtype = compute_dtype_of(x);
    const at::Tensor xc = x.to(dtype), wc = weight.to(dtype);
    // Everything below is in the compute dtype already: autocast off, so that no op of the loop
    // (a log-softmax on its fp32 list) gets an extra cast pass over the logits.
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    if (chunk_rows <= 0) chunk_rows = std::max<int64_t>(1, (int64_t{256} << 20) / (4 * Vp));

    // G = softmax - onehot over the real columns, unscaled (in [-1, 1]: nothing underflows) and
    // rounded once to the compute dtype; the products apply 1/N (cuBLAS's alpha, in fp32).
    at::Tensor G;
    if (need_grad) G = at::empty({N, Vp}, xc.options());
    at::Tensor loss_sum = at::zeros({}, x.options().dtype(at::kFloat));
    const double inv_n = 1.0 / static_cast<double>(N);
    // 16-bit operands, fp32 logits: the log-softmax then reads them as they are -- three passes
    // (LibTorch's log-softmax cannot read bf16 into fp32, "conversion is supported for Half type
    // only", seen on an H200: a bf16 product would need an upcast pass). On CUDA mm's out_dtype
    // (cuBLAS accumulates in fp32 and stores fp32); the CPU has no such mm, so there the operands
    // are upcast instead -- W once, x a chunk at a time: neither is logits-sized -- and multiplied
    // in fp32: the same products of 16-bit values, accumulated in fp32.
    // 16-bit logits (logits16, a bf16 compute dtype): the product writes z in bf16, as autocast's
    // plain linear does (the peers' numerics), and three passes read it in bf16 -- the row
    // statistics, the loss from them, the gradient into G's rows (kernels/classifier.h's
    // two-pass functions, tp's): half the product's write and of the classifier's reads.
    logits16 = logits16 && dtype == at::kBFloat16;
    const bool fp32_product = dtype != at::kFloat && !logits16;
    const at::Tensor w32 = fp32_product && !x.is_cuda() ? wc.to(at::kFloat) : at::Tensor();
    const at::Tensor one = logits16 && need_grad ? at::ones({}, x.options().dtype(at::kFloat)) : at::Tensor();
    for (int64_t a = 0; a < N; a += chunk_rows) {
      const int64_t c = std::min(chunk_rows, N - a);
      const at::Tensor t = targets.narrow(0, a, c).unsqueeze(1);  // [c, 1]
      if (logits16) {
        const at::Tensor z = matmul_product(xc.narrow(0, a, c), wc.t());  // [c, Vp] bf16
        const auto [m, se] = softmax_row_stats(z, V, kernels);
        const at::Tensor lse = m + se.log();
        loss_sum.add_((lse - z.gather(1, t).squeeze(1).to(at::kFloat)).sum());
        if (need_grad) softmax_xent_grad(z, V, lse, t.squeeze(1), one, kernels, G.narrow(0, a, c));
        continue;
      }
      // pass 1: the logits [c, Vp] in fp32
      const at::Tensor xa = xc.narrow(0, a, c);
      at::Tensor z = !fp32_product ? at::mm(xa, wc.t()) : x.is_cuda() ? at::mm(xa, wc.t(), at::kFloat) : at::mm(xa.to(at::kFloat), w32.t());
      // passes 2 and 3 (kernels/classifier.h): the loss of the chunk's rows and their rows of G --
      // log-softmax and exp composite, or kiln's kernel reading z twice on CUDA
      loss_sum.add_(softmax_cross_entropy_rows(z, t, V, need_grad ? G.narrow(0, a, c) : at::Tensor(), kernels));
    }
    if (need_grad) {
      // dloss/dx = (1/N) G W, dloss/dW = (1/N) G^T x: beta 0, so the uninitialised outputs are
      // never read. Both rounded to the compute dtype, then to x's and W's own.
      at::Tensor gx, gw;
      if (upcast_product(G, wc)) {
        // The CPU's 16-bit products by the fp32 GEMM (kernels/matmul.h), a chunk of G's rows at a
        // time (no fp32 copy of all of G): dW's fp32 sum over the chunks is rounded once.
        const at::Tensor wf = w32.defined() ? w32 : wc.to(at::kFloat);
        gx = at::empty({N, xc.size(1)}, xc.options());
        at::Tensor gw32 = at::zeros({Vp, xc.size(1)}, xc.options().dtype(at::kFloat));
        for (int64_t a = 0; a < N; a += chunk_rows) {
          const int64_t c = std::min(chunk_rows, N - a);
          const at::Tensor Gc = G.narrow(0, a, c).to(at::kFloat);
          gx.narrow(0, a, c).copy_(at::addmm(at::empty({c, xc.size(1)}, Gc.options()), Gc, wf, 0.0, inv_n));
          gw32.addmm_(Gc.t(), xc.narrow(0, a, c).to(at::kFloat), 1.0, inv_n);
        }
        gx = gx.to(x.scalar_type());
        gw = gw32.to(xc.scalar_type()).to(weight.scalar_type());
      } else {
        gx = at::addmm(at::empty({N, xc.size(1)}, xc.options()), G, wc, 0.0, inv_n).to(x.scalar_type());
        gw = at::addmm(at::empty({Vp, xc.size(1)}, xc.options()), G.t(), xc, 0.0, inv_n).to(weight.scalar_type());
      }
      ctx->save_for_backward({gx, gw});
    }
    return loss_sum.mul_(inv_n);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& g = grad_outputs[0];  // 0-dim: d(whatever backward started from)/dloss
    return {saved[0] * g.to(saved[0].scalar_type()), saved[1] * g.to(saved[1].scalar_type()), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor plain_linear_cross_entropy(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& targets,
                                      int64_t vocab) {
  auto lg = linear_product(x, weight);
  if (lg.size(-1) != vocab) lg = lg.narrow(-1, 0, vocab);
  // In fp32 whatever the compute precision: log-sum-exp over the vocabulary needs its range.
  return at::cross_entropy_loss(lg.to(at::kFloat), targets);
}

at::Tensor linear_cross_entropy(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& targets,
                                int64_t vocab, int64_t chunk_rows, Kernels kernels, bool logits16) {
  if (compute_dtype_of(x) == at::kHalf) return plain_linear_cross_entropy(x, weight, targets, vocab);
  const bool need_grad = at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad());
  return LinearCrossEntropyFunction::apply(x, weight, targets, vocab, chunk_rows, need_grad, kernels, logits16);
}

}  // namespace kiln
