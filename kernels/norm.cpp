// kernels/norm.cpp -- the norms' entry: kiln's kernels on CUDA, the composite ops elsewhere.
#include "kernels/norm.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#ifdef KILN_WITH_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/cuda_dtype.h"
#include "kernels/norm_cuda.h"
#endif

namespace kiln {

namespace {

at::Tensor composite(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps, bool rms) {
  if (rms) return at::rms_norm(x, {weight.size(0)}, weight, eps);
  return at::layer_norm(x, {weight.size(0)}, weight, bias, eps);
}

#ifdef KILN_WITH_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The weight in a dtype the kernels pair with x's: its own, or fp32 (the gradient autograd
// receives is cast back to the parameter's dtype).
at::Tensor paired_weight(const at::Tensor& w, const at::Tensor& x) {
  return w.scalar_type() == x.scalar_type() || w.scalar_type() == at::kFloat ? w.contiguous()
                                                                             : w.to(at::kFloat).contiguous();
}

struct Forward {
  at::Tensor sum, y, mean, rstd, w;  // sum: x + res (undefined without res)
};

// The forward kernel over x (or s = x + res when res is defined, written to sum).
Forward launch_forward(const at::Tensor& x, const at::Tensor& res, const at::Tensor& weight, const at::Tensor& bias,
                       double eps, bool rms) {
  Forward f;
  f.w = paired_weight(weight, x);
  const at::Tensor b = bias.defined() ? bias.to(f.w.scalar_type()).contiguous() : at::Tensor();
  const int64_t d = f.w.size(0), rows = d > 0 ? x.numel() / d : 0;
  const c10::cuda::CUDAGuard guard(x.device());
  f.y = at::empty_like(x);
  if (res.defined()) f.sum = at::empty_like(x);
  const auto f32 = x.options().dtype(at::kFloat);
  f.mean = at::empty({rows}, f32);
  f.rstd = at::empty({rows}, f32);
  kernels::check_launch(
      kernels::norm_forward_cuda(kernels::dtype_of(x), kernels::dtype_of(f.w), x.data_ptr(),
                                 res.defined() ? res.data_ptr() : nullptr, res.defined() ? f.sum.data_ptr() : nullptr,
                                 f.w.data_ptr(), b.defined() ? b.data_ptr() : nullptr, f.y.data_ptr(),
                                 f.mean.data_ptr<float>(), f.rstd.data_ptr<float>(), rows, static_cast<int>(d),
                                 static_cast<float>(eps), rms, c10::cuda::getCurrentCUDAStream(x.device().index()).stream()),
      "norm forward");
  return f;
}

// The backward kernels: dx (plus dsum when defined) where want_dx, dw and db where asked.
variable_list launch_backward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& mean, const at::Tensor& rstd,
                              const at::Tensor& dy, const at::Tensor& dsum, bool rms, bool want_dx, bool want_dw,
                              bool want_db) {
  const int64_t d = w.size(0), rows = mean.size(0);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor dx = want_dx ? at::empty_like(x) : at::Tensor();
  at::Tensor dw = want_dw ? at::empty_like(w) : at::Tensor();
  at::Tensor db = want_db ? at::empty_like(w) : at::Tensor();
  at::Tensor scratch;
  if (dw.defined() || db.defined())
    scratch = at::empty({kernels::norm_backward_scratch_floats(rows, static_cast<int>(d))}, mean.options());
  kernels::check_launch(
      kernels::norm_backward_cuda(kernels::dtype_of(x), kernels::dtype_of(w), x.data_ptr(), dy.data_ptr(),
                                  dsum.defined() ? dsum.data_ptr() : nullptr, w.data_ptr(), mean.data_ptr<float>(),
                                  rstd.data_ptr<float>(), dx.defined() ? dx.data_ptr() : nullptr,
                                  dw.defined() ? dw.data_ptr() : nullptr, db.defined() ? db.data_ptr() : nullptr,
                                  scratch.defined() ? scratch.data_ptr<float>() : nullptr, rows, static_cast<int>(d), rms,
                                  c10::cuda::getCurrentCUDAStream(x.device().index()).stream()),
      "norm backward");
  return {dx, dw, db};
}

struct FusedNorm : public torch::autograd::Function<FusedNorm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& weight, const at::Tensor& bias,
                            double eps, bool rms) {
    const at::Tensor x = x_in.contiguous();
    Forward f = launch_forward(x, at::Tensor(), weight, bias, eps, rms);
    ctx->save_for_backward({x, f.w, f.mean, f.rstd});
    ctx->saved_data["rms"] = rms;
    return f.y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &mean = saved[2], &rstd = saved[3];
    const at::Tensor dy = grads[0].to(x.scalar_type()).contiguous();
    auto g = launch_backward(x, w, mean, rstd, dy, at::Tensor(), ctx->saved_data["rms"].toBool(), ctx->needs_input_grad(0),
                             ctx->needs_input_grad(1), ctx->needs_input_grad(2));  // (2): false without a bias
    return {g[0], g[1], g[2], at::Tensor(), at::Tensor()};
  }
};

// s = x + r and norm(s), both outputs: backward ds (s's gradient from the residual stream) +
// the norm's dx in one pass, the same tensor for x and r (the add passes it through).
struct FusedAddNorm : public torch::autograd::Function<FusedAddNorm> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& r_in, const at::Tensor& weight,
                               const at::Tensor& bias, double eps, bool rms) {
    const at::Tensor x = x_in.contiguous(), r = r_in.contiguous();
    Forward f = launch_forward(x, r, weight, bias, eps, rms);
    ctx->save_for_backward({f.sum, f.w, f.mean, f.rstd});
    ctx->saved_data["rms"] = rms;
    return {f.sum, f.y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &s = saved[0], &w = saved[1], &mean = saved[2], &rstd = saved[3];
    const bool want_dx = ctx->needs_input_grad(0) || ctx->needs_input_grad(1);
    at::Tensor dy = grads[1].defined() ? grads[1].to(s.scalar_type()).contiguous() : at::zeros_like(s);
    const at::Tensor dsum = grads[0].defined() ? grads[0].to(s.scalar_type()).contiguous() : at::Tensor();
    auto g = launch_backward(s, w, mean, rstd, dy, dsum, ctx->saved_data["rms"].toBool(), want_dx, ctx->needs_input_grad(2),
                             ctx->needs_input_grad(3));
    return {ctx->needs_input_grad(0) ? g[0] : at::Tensor(), ctx->needs_input_grad(1) ? g[0] : at::Tensor(), g[1], g[2],
            at::Tensor(), at::Tensor()};
  }
};
#endif

}  // namespace

at::Tensor norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps, bool rms,
                Kernels kernels) {
#ifdef KILN_WITH_KERNELS
  if (kernels == Kernels::fused && x.is_cuda() && kernels::supported_dtype(x)) {
    return FusedNorm::apply(x, weight, rms ? at::Tensor() : bias, eps, rms);
  }
#endif
  return composite(x, weight, bias, eps, rms);
}

bool add_norm_fused(const at::Tensor& x, const at::Tensor& r, Kernels kernels) {
#ifdef KILN_WITH_KERNELS
  return kernels == Kernels::fused && x.is_cuda() && kernels::supported_dtype(x) && r.scalar_type() == x.scalar_type() &&
         r.device() == x.device() && r.sizes() == x.sizes();
#else
  (void)x, (void)r, (void)kernels;
  return false;
#endif
}

std::pair<at::Tensor, at::Tensor> add_norm(const at::Tensor& x, const at::Tensor& r, const at::Tensor& weight,
                                           const at::Tensor& bias, double eps, bool rms, Kernels kernels) {
#ifdef KILN_WITH_KERNELS
  if (add_norm_fused(x, r, kernels)) {
    auto out = FusedAddNorm::apply(x, r, weight, rms ? at::Tensor() : bias, eps, rms);
    return {out[0], out[1]};
  }
#endif
  const at::Tensor s = x + r;
  return {s, norm(s, weight, bias, eps, rms, kernels)};
}

}  // namespace kiln
