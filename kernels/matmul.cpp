// kernels/matmul.cpp -- 16-bit products on the CPU through the fp32 GEMM (kernels/matmul.h).
#include "kernels/matmul.h"

#include <optional>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>

namespace kiln {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool is16(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

at::Tensor f32(const at::Tensor& t) { return t.to(at::kFloat); }

// x [..., K] W [N, K] (+ b), 16-bit on the CPU, with the backward's products the same way.
struct CpuLinear16 : public torch::autograd::Function<CpuLinear16> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const std::optional<at::Tensor>& b) {
    const bool has_bias = b.has_value() && b->defined();
    const int64_t N = w.size(0), K = w.size(1);
    const at::Tensor x2 = f32(x.reshape({-1, K})), wt = f32(w).t();
    const at::Tensor y = has_bias ? at::addmm(f32(*b), x2, wt) : at::mm(x2, wt);
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = N;
    ctx->save_for_backward({x, w});
    ctx->saved_data["bias"] = has_bias;
    return y.to(x.scalar_type()).view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    const int64_t N = w.size(0), K = w.size(1);
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);  // fp32 products stay fp32
    const at::Tensor dy = f32(grads[0].reshape({-1, N}));
    at::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) dx = at::mm(dy, f32(w)).to(x.scalar_type()).view(x.sizes());
    if (ctx->needs_input_grad(1)) dw = at::mm(dy.t(), f32(x.reshape({-1, K}))).to(w.scalar_type());
    if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2)) db = dy.sum(0).to(w.scalar_type());
    return {dx, dw, db};
  }
};

}  // namespace

bool upcast_product(const at::Tensor& a, const at::Tensor& b) {
  return a.is_cpu() && b.is_cpu() && is16(a.scalar_type()) && a.scalar_type() == b.scalar_type();
}

at::Tensor linear_product(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const Float8Scaling* float8) {
  if (float8 != nullptr && float8->on) {
    const auto type = x.device().type();
    at::Tensor xc = x, bc = bias;
    if (at::autocast::is_autocast_enabled(type)) {
      const at::ScalarType t = at::autocast::get_autocast_dtype(type);
      xc = at::autocast::cached_cast(t, x, type);
      if (bias.defined()) bc = at::autocast::cached_cast(t, bias, type);
    }
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    return float8_linear(xc, weight, bc, *float8);
  }
  if (!x.is_cpu()) return at::linear(x, weight, bias);
  // The dtype at::linear would multiply in: CPU autocast's for eligible (fp32) operands.
  at::Tensor xc = x, wc = weight, bc = bias;
  const bool autocast = at::autocast::is_autocast_enabled(at::kCPU);
  if (autocast) {
    const at::ScalarType t = at::autocast::get_autocast_dtype(at::kCPU);
    if (!is16(t)) return at::linear(x, weight, bias);
    xc = at::autocast::cached_cast(t, x, at::kCPU);
    wc = at::autocast::cached_cast(t, weight, at::kCPU);
    if (bias.defined()) bc = at::autocast::cached_cast(t, bias, at::kCPU);
  }
  if (!upcast_product(xc, wc) || (bc.defined() && bc.scalar_type() != xc.scalar_type())) {
    return at::linear(x, weight, bias);
  }
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  return CpuLinear16::apply(xc, wc, bc.defined() ? std::optional<at::Tensor>(bc) : std::nullopt);
}

at::Tensor matmul_product(const at::Tensor& a, const at::Tensor& b) {
  if (!upcast_product(a, b)) return at::matmul(a, b);
  return at::matmul(f32(a), f32(b)).to(a.scalar_type());
}

at::Tensor addmm_product(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double beta, double alpha) {
  if (!upcast_product(a, b) || c.scalar_type() != a.scalar_type()) return at::addmm(c, a, b, beta, alpha);
  const at::Tensor c32 = beta == 0.0 ? at::empty(c.sizes(), c.options().dtype(at::kFloat)) : f32(c);
  return at::addmm(c32, f32(a), f32(b), beta, alpha).to(a.scalar_type());
}

}  // namespace kiln
