// models/float8.cpp -- to_float8 and the float8 linear layer's autograd function (math in the header).
#include "models/float8.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

namespace kiln {

namespace {

double largest(at::ScalarType dtype) { return dtype == at::kFloat8_e4m3fn ? 448.0 : 57344.0; }

// a [M, K] x b [K, N] (b handed over column-major, as _scaled_mm wants on CUDA) with their scales.
at::Tensor scaled_product(const Float8Tensor& a, const at::Tensor& b_data, const at::Tensor& b_scale, at::ScalarType out) {
  const at::Tensor b_cols = b_data.t().contiguous().t();  // column-major [K, N]
  return at::_scaled_mm(a.data.contiguous(), b_cols, a.scale, b_scale, /*bias=*/std::nullopt, /*scale_result=*/std::nullopt, out);
}

class Float8Linear : public torch::autograd::Function<Float8Linear> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight) {
    const at::Tensor x2 = x.reshape({-1, x.size(-1)});
    const Float8Tensor qx = to_float8(x2, at::kFloat8_e4m3fn), qw = to_float8(weight, at::kFloat8_e4m3fn);
    ctx->save_for_backward({qx.data, qx.scale, qw.data, qw.scale});
    ctx->saved_data["dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    // y = q_x q_W^T: q_W^T [K, N] is the transposed view of q_W [N, K], column-major as it is
    at::Tensor y = at::_scaled_mm(qx.data, qw.data.t(), qx.scale, qw.scale, std::nullopt, std::nullopt, x.scalar_type());
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = weight.size(0);
    return y.view(shape);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Float8Tensor qx{saved[0], saved[1]}, qw{saved[2], saved[3]};
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    const auto wdtype = static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    const at::Tensor& g = grads[0];
    const at::Tensor g2 = g.reshape({-1, g.size(-1)});  // [M, N]
    const Float8Tensor qg = to_float8(g2, at::kFloat8_e5m2);
    const at::Tensor dx = scaled_product(qg, qw.data, qw.scale, dtype);                                         // [M, K]
    const Float8Tensor qgt{qg.data.t().contiguous(), qg.scale};                                              // [N, M]
    const at::Tensor dw = scaled_product(qgt, qx.data, qx.scale, at::kFloat).to(wdtype);                      // [N, K]
    std::vector<int64_t> shape(g.sizes().begin(), g.sizes().end());
    shape.back() = qx.data.size(1);
    return {dx.view(shape), dw};
  }
};

}  // namespace

at::Tensor Float8Tensor::dequantized() const { return data.to(at::kFloat) * scale; }

Float8Tensor to_float8(const at::Tensor& x, at::ScalarType dtype) {
  const double fmax = largest(dtype);
  const at::Tensor amax = x.detach().abs().max().to(at::kFloat);
  const at::Tensor scale = amax.clamp_min(1e-12) / fmax;
  const at::Tensor data = (x.detach().to(at::kFloat) / scale).clamp(-fmax, fmax).to(dtype);
  return {data, scale};
}

at::Tensor float8_linear(const at::Tensor& x, const at::Tensor& weight) { return Float8Linear::apply(x, weight); }

}  // namespace kiln
