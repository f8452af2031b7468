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

struct FusedNorm : public torch::autograd::Function<FusedNorm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& weight, const at::Tensor& bias,
                            double eps, bool rms) {
    const at::Tensor x = x_in.contiguous();
    const at::Tensor w = paired_weight(weight, x);
    const at::Tensor b = bias.defined() ? bias.to(w.scalar_type()).contiguous() : at::Tensor();
    const int64_t d = w.size(0), rows = d > 0 ? x.numel() / d : 0;
    const c10::cuda::CUDAGuard guard(x.device());
    at::Tensor y = at::empty_like(x);
    const auto f32 = x.options().dtype(at::kFloat);
    at::Tensor mean = at::empty({rows}, f32), rstd = at::empty({rows}, f32);
    kernels::check_launch(
        kernels::norm_forward_cuda(kernels::dtype_of(x), kernels::dtype_of(w), x.data_ptr(), w.data_ptr(),
                                   b.defined() ? b.data_ptr() : nullptr, y.data_ptr(), mean.data_ptr<float>(),
                                   rstd.data_ptr<float>(), rows, static_cast<int>(d), static_cast<float>(eps), rms,
                                   c10::cuda::getCurrentCUDAStream(x.device().index()).stream()),
        "norm forward");
    ctx->save_for_backward({x, w, mean, rstd});
    ctx->saved_data["rms"] = rms;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &mean = saved[2], &rstd = saved[3];
    const bool rms = ctx->saved_data["rms"].toBool();
    const at::Tensor dy = grads[0].to(x.scalar_type()).contiguous();
    const int64_t d = w.size(0), rows = mean.size(0);
    const c10::cuda::CUDAGuard guard(x.device());
    at::Tensor dx = ctx->needs_input_grad(0) ? at::empty_like(x) : at::Tensor();
    at::Tensor dw = ctx->needs_input_grad(1) ? at::empty_like(w) : at::Tensor();
    at::Tensor db = ctx->needs_input_grad(2) ? at::empty_like(w) : at::Tensor();  // false without a bias
    at::Tensor scratch;
    if (dw.defined() || db.defined())
      scratch = at::empty({kernels::norm_backward_scratch_floats(rows, static_cast<int>(d))}, mean.options());
    kernels::check_launch(
        kernels::norm_backward_cuda(kernels::dtype_of(x), kernels::dtype_of(w), x.data_ptr(), dy.data_ptr(), w.data_ptr(),
                                    mean.data_ptr<float>(), rstd.data_ptr<float>(), dx.defined() ? dx.data_ptr() : nullptr,
                                    dw.defined() ? dw.data_ptr() : nullptr, db.defined() ? db.data_ptr() : nullptr,
                                    scratch.defined() ? scratch.data_ptr<float>() : nullptr, rows, static_cast<int>(d),
                                    rms, c10::cuda::getCurrentCUDAStream(x.device().index()).stream()),
        "norm backward");
    return {dx, dw, db, at::Tensor(), at::Tensor()};
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

}  // namespace kiln
