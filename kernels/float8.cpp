// kernels/float8.cpp -- to_float8 and the float8 linear layer's autograd function (math in the header).
#include "kernels/float8.h"

#include <optional>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "distributed/error.h"

namespace kiln {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

double largest(at::ScalarType dtype) { return dtype == at::kFloat8_e4m3fn ? 448.0 : 57344.0; }

// a [M, K] x b [K, N] (b handed over column-major, as _scaled_mm wants on CUDA) with their scales.
at::Tensor scaled_product(const Float8Tensor& a, const at::Tensor& b_data, const at::Tensor& b_scale, at::ScalarType out) {
  const at::Tensor b_cols = b_data.t().contiguous().t();  // column-major [K, N]
  return at::_scaled_mm(a.data.contiguous(), b_cols, a.scale, b_scale, /*bias=*/std::nullopt, /*scale_result=*/std::nullopt, out);
}

// x [M, ...] with zero rows appended up to a multiple of 16: dW's product contracts over the M
// rows, and CUDA's _scaled_mm wants every contracted dim a multiple of 16. Zero rows change no
// amax and add nothing to dW; the other products read the first M rows. (On every device alike,
// so that the CPU's tests run this path.)
at::Tensor pad_rows16(const at::Tensor& x) {
  const int64_t pad = (16 - x.size(0) % 16) % 16;
  if (pad == 0) return x;
  return at::cat({x, at::zeros({pad, x.size(1)}, x.options())});
}

// The reducers travel to the backward in a capsule (a custom function's saved data holds IValues).
struct ScalingHolder : torch::CustomClassHolder {
  explicit ScalingHolder(Float8Scaling s) : scaling(std::move(s)) {}
  Float8Scaling scaling;
};

class Float8Linear : public torch::autograd::Function<Float8Linear> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, at::IValue scaling) {
    const Float8Scaling& s = static_cast<const ScalingHolder*>(scaling.toCapsule().get())->scaling;
    const at::Tensor x2 = x.reshape({-1, x.size(-1)});
    const int64_t M = x2.size(0);
    const Float8Tensor qx = to_float8(pad_rows16(x2), at::kFloat8_e4m3fn, s.x_amax), qw = to_float8(weight, at::kFloat8_e4m3fn, s.w_amax);
    const bool has_bias = bias.has_value() && bias->defined();
    ctx->save_for_backward({qx.data, qx.scale, qw.data, qw.scale});
    ctx->saved_data["dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["bias_dtype"] = has_bias ? static_cast<int64_t>(bias->scalar_type()) : int64_t{-1};
    ctx->saved_data["scaling"] = std::move(scaling);
    // y = q_x q_W^T + b: q_W^T [K, N] is the transposed view of q_W [N, K], column-major as it
    // is; the bias added in fp32 inside the product before its one rounding (cuBLASLt's epilogue)
    at::Tensor y = at::_scaled_mm(qx.data.narrow(0, 0, M), qw.data.t(), qx.scale, qw.scale,
                                  has_bias ? std::optional<at::Tensor>(bias->to(x.scalar_type())) : std::nullopt,
                                  std::nullopt, x.scalar_type());
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = weight.size(0);
    return y.view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Float8Tensor qx{saved[0], saved[1]}, qw{saved[2], saved[3]};
    const Float8Scaling& s = static_cast<const ScalingHolder*>(ctx->saved_data["scaling"].toCapsule().get())->scaling;
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    const auto wdtype = static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    const int64_t bias_dtype = ctx->saved_data["bias_dtype"].toInt();
    const at::Tensor& g = grads[0];
    const at::Tensor g2 = g.reshape({-1, g.size(-1)});  // [M, N]
    const int64_t M = g2.size(0);
    const Float8Tensor qg = to_float8(pad_rows16(g2), s.grad_dtype, s.g_amax);  // [M', N], as q_x [M', K]
    at::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) {
      std::vector<int64_t> shape(g.sizes().begin(), g.sizes().end());
      shape.back() = qx.data.size(1);
      dx = scaled_product({qg.data.narrow(0, 0, M), qg.scale}, qw.data, qw.scale, dtype).view(shape);  // [M, K]
    }
    if (ctx->needs_input_grad(1)) {
      const Float8Tensor qgt{qg.data.t().contiguous(), qg.scale};                         // [N, M']
      dw = scaled_product(qgt, qx.data, qx.scale, at::kFloat).to(wdtype);                 // [N, K]
    }
    if (bias_dtype >= 0 && ctx->needs_input_grad(2)) db = g2.sum(0, false, at::kFloat).to(static_cast<at::ScalarType>(bias_dtype));
    return {dx, dw, db, at::Tensor()};
  }
};

}  // namespace

AmaxReduce amax_over(std::shared_ptr<Communicator> group, AmaxReduce before) {
  return [group = std::move(group), before = std::move(before)](const at::Tensor& amax) {
    at::Tensor t = (before ? before(amax) : amax).contiguous().clone();
    group->all_reduce(t, ReduceOp::Max)->wait();
    return t;
  };
}

at::ScalarType float8_grad_dtype(const std::string& name) {
  if (name == "e5m2") return at::kFloat8_e5m2;
  if (name == "e4m3") return at::kFloat8_e4m3fn;
  throw ConfigError("--fp8-grad must be e5m2 or e4m3 (got '" + name + "')");
}

at::Tensor Float8Tensor::dequantized() const { return data.to(at::kFloat) * scale; }

Float8Tensor to_float8(const at::Tensor& x, at::ScalarType dtype, const AmaxReduce& reduce) {
  const double fmax = largest(dtype);
  at::Tensor amax = x.detach().abs().max().to(at::kFloat);
  if (reduce) amax = reduce(amax);
  const at::Tensor scale = amax.clamp_min(1e-12) / fmax;
  const at::Tensor data = (x.detach().to(at::kFloat) / scale).clamp(-fmax, fmax).to(dtype);
  return {data, scale};
}

at::Tensor float8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const Float8Scaling& scaling) {
  return Float8Linear::apply(x, weight, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt,
                             at::IValue::make_capsule(c10::make_intrusive<ScalingHolder>(scaling)));
}

bool float8_layer_eligible(int64_t n, int64_t k, bool auto_filter) {
  if (n % 16 != 0 || k % 16 != 0) return false;
  return !auto_filter || !(n <= 4096 && k <= 1024);
}

}  // namespace kiln
