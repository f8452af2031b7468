// kernels/float8.cpp -- to_float8 and the float8 linear layer's autograd function (math in the header).
#include "kernels/float8.h"

#include <algorithm>
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "distributed/error.h"

#ifdef KILN_WITH_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/cuda_dtype.h"
#include "kernels/float8_cuda.h"
#endif

namespace kiln {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

double largest(at::ScalarType dtype) { return dtype == at::kFloat8_e4m3fn ? 448.0 : 57344.0; }

// b as the column-major [K, N] _scaled_mm wants for its second operand (a view when it is one).
at::Tensor column_major(const at::Tensor& b) {
  if (b.stride(0) == 1 && b.stride(1) == b.size(0)) return b;
  return b.t().contiguous().t();
}

// `first`, then `second` (either may be empty).
AmaxReduce then(const AmaxReduce& first, const AmaxReduce& second) {
  if (!first) return second;
  if (!second) return first;
  return [first, second](const at::Tensor& t) { return second(first(t)); };
}

// x [M, ...] with zero rows appended up to a multiple of 16: dW's product contracts over the M
// rows, and CUDA's _scaled_mm wants every contracted dim a multiple of 16. Zero rows change no
// amax and add nothing to dW; the other products read the first M rows. (On every device alike,
// so that the CPU's tests run this path.)
at::Tensor pad_rows16(const at::Tensor& x) {
  const int64_t pad = x.size(0) == 0 ? 16 : (16 - x.size(0) % 16) % 16;  // no rows: 16 zero rows (an amax needs one)
  if (pad == 0) return x;
  return at::cat({x, at::zeros({pad, x.size(1)}, x.options())});
}

// The reducers travel to the backward in a capsule (a custom function's saved data holds IValues).
struct ScalingHolder : torch::CustomClassHolder {
  explicit ScalingHolder(Float8Scaling s) : scaling(std::move(s)) {}
  Float8Scaling scaling;
};

// The rowwise recipe's products (the header): y's in the forward, dX's and dW's in the backward,
// each operand quantised along the product's non-contracted dim from its 16-bit value. The rowwise
// GEMM writes bf16 (CUTLASS's f8f8bf16; its bias bf16); the result is then cast to `out`.
// W by rows (y's operand) and by columns (dX's).
Float8Tensor rowwise_w_rows(const at::Tensor& w, const Float8Scaling& s) { return to_float8_along(w, at::kFloat8_e4m3fn, 1, s.k, s.fused); }
Float8Tensor rowwise_w_cols(const at::Tensor& w, const Float8Scaling& s) { return to_float8_along(w, at::kFloat8_e4m3fn, 0, s.n, s.fused); }

at::Tensor rowwise_forward(const at::Tensor& x2, const Float8Tensor& qw, const at::Tensor& bias, const Float8Scaling& s, at::ScalarType out) {
  const Float8Tensor qx = to_float8_along(x2, at::kFloat8_e4m3fn, 1, s.k, s.fused);
  return scaled_product(qx, {qw.data.t(), qw.scale.t()}, bias.defined() ? bias.to(at::kBFloat16) : bias, at::kBFloat16).to(out);  // [M, K] [K, N]
}

at::Tensor rowwise_dx(const at::Tensor& g2, const Float8Tensor& qw, const Float8Scaling& s, at::ScalarType out) {
  const Float8Tensor qg = to_float8_along(g2, s.grad_dtype, 1, s.n, s.fused);
  return scaled_product(qg, qw, at::Tensor(), at::kBFloat16).to(out);  // [M, N] [N, K]
}

// W's forms for this optimizer step (Float8WeightCache): made by the step's first forward, kept.
const Float8WeightCache& refreshed(Float8WeightCache& c, const at::Tensor& w, const Float8Scaling& s) {
  if (c.at == *c.clock && c.q.data.defined() && c.q.data.sizes() == w.sizes()) return c;
  if (s.rowwise) {
    c.q = rowwise_w_rows(w, s);
    c.t = rowwise_w_cols(w, s);
  } else {
    c.q = to_float8(w, at::kFloat8_e4m3fn, then(s.n, s.k), s.fused);
    c.t = {column_major(c.q.data), c.q.scale};  // the transpose dX's product takes, written once
  }
  c.at = *c.clock;
  return c;
}

at::Tensor rowwise_dw(const at::Tensor& g2, const at::Tensor& x2, const Float8Scaling& s, at::ScalarType out) {
  const Float8Tensor qg = to_float8_along(pad_rows16(g2), s.grad_dtype, 0, s.m, s.fused);      // [M', N], scales [1, N]
  const Float8Tensor qx = to_float8_along(pad_rows16(x2), at::kFloat8_e4m3fn, 0, s.m, s.fused);  // [M', K], scales [1, K]
  return scaled_product({qg.data.t().contiguous(), qg.scale.t()}, qx, at::Tensor(), at::kBFloat16).to(out);  // [N, M'] [M', K]
}

// ZeRO-3's gathered q_W (Float8Scaling::weight8), checked against the layer's W.
Float8Tensor gathered_weight(const Float8Tensor& q, const at::Tensor& weight) {
  if (q.data.sizes() != weight.sizes() || q.data.scalar_type() != at::kFloat8_e4m3fn || q.scale.dim() != 0)
    throw Error("float8: the gathered 8-bit weight does not match the layer's weight");
  return q;
}

class Float8Linear : public torch::autograd::Function<Float8Linear> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, at::IValue scaling) {
    const Float8Scaling& s = static_cast<const ScalingHolder*>(scaling.toCapsule().get())->scaling;
    const at::Tensor x2 = x.reshape({-1, x.size(-1)});
    const int64_t M = x2.size(0);
    const bool has_bias = bias.has_value() && bias->defined();
    ctx->saved_data["dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["bias_dtype"] = has_bias ? static_cast<int64_t>(bias->scalar_type()) : int64_t{-1};
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = weight.size(0);
    if (s.rowwise) {
      if (s.weight8 && s.weight8->data.defined()) throw Error("float8: a gathered 8-bit weight is tensorwise (rowwise requantises W along its columns)");
      const Float8WeightCache* c = s.cache ? &refreshed(*s.cache, weight, s) : nullptr;
      const at::Tensor y = rowwise_forward(x2, c ? c->q : rowwise_w_rows(weight, s), has_bias ? *bias : at::Tensor(), s, x.scalar_type()).view(shape);
      // the 16-bit x, requantised along its columns for dW; W's columns kept for dX where the
      // step keeps them, else W, requantised there
      if (c) ctx->save_for_backward({x2, c->t.data, c->t.scale});
      else ctx->save_for_backward({x2, weight});
      ctx->saved_data["scaling"] = std::move(scaling);
      return y;
    }
    Float8Tensor qx;
    int64_t rows = M;
    if (s.gather_rows) {
      // This rank's rows quantised with the whole sequence's scale, then their bytes gathered
      // (float8 -> uint8 views: the collectives' dtype).
      const Float8Tensor mine = to_float8(x, at::kFloat8_e4m3fn, then(then(s.m, s.k), s.rows_amax), s.fused);
      const at::Tensor whole = s.gather_rows(mine.data.view(at::kByte));  // [B, T, K]
      shape.assign(whole.sizes().begin(), whole.sizes().end());
      shape.back() = weight.size(0);
      const at::Tensor whole2 = whole.reshape({-1, whole.size(-1)});
      rows = whole2.size(0);
      qx = {pad_rows16(whole2).view(at::kFloat8_e4m3fn), mine.scale};
    } else {
      qx = to_float8(pad_rows16(x2), at::kFloat8_e4m3fn, then(s.m, s.k), s.fused);
    }
    // q_W: ZeRO-3's gathered bytes, the step's kept copy, or quantised here; dX's operand is its
    // column-major transpose (kept for the step, or made in backward)
    Float8Tensor qw, qw_dx;
    if (s.weight8 && s.weight8->data.defined()) {
      qw = qw_dx = gathered_weight(*s.weight8, weight);
    } else if (s.cache) {
      const Float8WeightCache& c = refreshed(*s.cache, weight, s);
      qw = c.q;
      qw_dx = c.t;
    } else {
      qw = qw_dx = to_float8(weight, at::kFloat8_e4m3fn, then(s.n, s.k), s.fused);
    }
    ctx->save_for_backward({qx.data, qx.scale, qw_dx.data, qw_dx.scale});
    ctx->saved_data["scaling"] = std::move(scaling);
    // y = q_x q_W^T + b: q_W^T [K, N] is the transposed view of q_W [N, K], column-major as it
    // is; the bias added in fp32 inside the product before its one rounding (cuBLASLt's epilogue)
    return scaled_product({qx.data.narrow(0, 0, rows), qx.scale}, {qw.data.t(), qw.scale},
                          has_bias ? bias->to(x.scalar_type()) : at::Tensor(), x.scalar_type())
        .view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Float8Scaling& s = static_cast<const ScalingHolder*>(ctx->saved_data["scaling"].toCapsule().get())->scaling;
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    const auto wdtype = static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    const int64_t bias_dtype = ctx->saved_data["bias_dtype"].toInt();
    const at::Tensor& g = grads[0];
    const at::Tensor g2 = g.reshape({-1, g.size(-1)});  // [M, N]
    const int64_t M = g2.size(0);
    std::vector<int64_t> shape(g.sizes().begin(), g.sizes().end());
    at::Tensor dx, dw, db;
    if (s.rowwise) {
      const at::Tensor& x2 = saved[0];
      shape.back() = x2.size(1);
      if (ctx->needs_input_grad(0)) {
        const Float8Tensor qw = saved.size() == 3 ? Float8Tensor{saved[1], saved[2]} : rowwise_w_cols(saved[1], s);
        dx = rowwise_dx(g2, qw, s, dtype).view(shape);
      }
      if (ctx->needs_input_grad(1)) dw = rowwise_dw(g2, x2, s, wdtype);
    } else {
      const Float8Tensor qx{saved[0], saved[1]}, qw{saved[2], saved[3]};
      // q_g [M', N], as q_x [M', K]. A backward split in two passes (parallel/backward_split.h:
      // ZB-H1's input pass asks for dX alone, the weight pass later for dW) quantises g -- and
      // all-reduces its amax over tp -- in the first and keeps it here for the second.
      Float8Tensor qg;
      if (ctx->saved_data.count("qg")) {
        qg = {ctx->saved_data["qg"].toTensor(), ctx->saved_data["qg_scale"].toTensor()};
        ctx->saved_data.erase("qg");
        ctx->saved_data.erase("qg_scale");
      } else {
        qg = to_float8(pad_rows16(g2), s.grad_dtype, then(s.m, s.n), s.fused);
        if (ctx->needs_input_grad(0) != ctx->needs_input_grad(1)) {  // one half now, the other in a later pass
          ctx->saved_data["qg"] = qg.data;
          ctx->saved_data["qg_scale"] = qg.scale;
        }
      }
      shape.back() = qx.data.size(1);
      if (ctx->needs_input_grad(0)) {
        dx = scaled_product({qg.data.narrow(0, 0, M), qg.scale}, qw, at::Tensor(), dtype).view(shape);  // [M, N] [N, K]
        if (s.scatter_rows) dx = s.scatter_rows(dx);  // the whole sequence's -> this rank's rows, summed over the group
      }
      if (ctx->needs_input_grad(1)) dw = scaled_product({qg.data.t().contiguous(), qg.scale}, qx, at::Tensor(), at::kFloat).to(wdtype);  // [N, M'] [M', K]
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

namespace {

// The amax and the cast of x [rows, cols] along `along` (0 all, 1 each row, 2 each column), the
// amax reduced by `reduce`: kiln's kernels on CUDA when `fused`, else the composite ops.
Float8Tensor quantise(const at::Tensor& x, at::ScalarType dtype, int along, const AmaxReduce& reduce, bool fused) {
  const double fmax = largest(dtype);
  const at::Tensor xd = x.detach();
#ifdef KILN_WITH_KERNELS
  if (fused && xd.is_cuda() && kernels::supported_dtype(xd) && xd.dim() >= 1) {
    const at::Tensor xc = xd.contiguous();
    const int64_t cols = along == 0 ? std::max<int64_t>(xc.numel(), 1) : xc.size(-1), rows = xc.numel() / cols;
    const std::vector<int64_t> shape = along == 0 ? std::vector<int64_t>{} : along == 1 ? std::vector<int64_t>{rows, 1}
                                                                                         : std::vector<int64_t>{1, cols};
    const auto a = static_cast<kernels::Along>(along);
    const c10::cuda::CUDAGuard guard(xc.device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(xc.device().index()).stream();
    at::Tensor amax = at::zeros(shape, xc.options().dtype(at::kFloat));
    kernels::check_launch(kernels::float8_amax_cuda(kernels::dtype_of(xc), xc.data_ptr(), rows, cols, a, amax.data_ptr<float>(), stream),
                          "float8 amax");
    if (reduce) amax = reduce(amax);
    const at::Tensor scale = amax.clamp_min(1e-12) / fmax;
    at::Tensor data = at::empty(xc.sizes(), xc.options().dtype(dtype));
    const auto format = dtype == at::kFloat8_e4m3fn ? kernels::Float8Format::e4m3 : kernels::Float8Format::e5m2;
    kernels::check_launch(kernels::float8_cast_cuda(kernels::dtype_of(xc), xc.data_ptr(), rows, cols, a, scale.contiguous().data_ptr<float>(),
                                                    format, data.data_ptr(), stream),
                          "float8 cast");
    return {data, scale};
  }
#else
  (void)fused;
#endif
  at::Tensor amax = along == 0 ? xd.abs().max() : xd.abs().amax({along == 1 ? 1 : 0}, /*keepdim=*/true);
  amax = amax.to(at::kFloat);
  if (reduce) amax = reduce(amax);
  const at::Tensor scale = amax.clamp_min(1e-12) / fmax;
  const at::Tensor data = (xd.to(at::kFloat) / scale).clamp(-fmax, fmax).to(dtype);
  return {data, scale};
}

}  // namespace

Float8Tensor to_float8(const at::Tensor& x, at::ScalarType dtype, const AmaxReduce& reduce, bool fused) {
  return quantise(x, dtype, 0, reduce, fused);
}

Float8Tensor to_float8_along(const at::Tensor& x, at::ScalarType dtype, int64_t dim, const AmaxReduce& reduce, bool fused) {
  if (x.dim() != 2 || (dim != 0 && dim != 1)) throw Error("to_float8_along: a 2-D tensor and dim 0 or 1");
  return quantise(x, dtype, dim == 1 ? 1 : 2, reduce, fused);
}

at::Tensor scaled_product(const Float8Tensor& a, const Float8Tensor& b, const at::Tensor& bias, at::ScalarType out) {
  const int64_t M = a.data.size(0), K = a.data.size(1), N = b.data.size(1);
  if (M == 0 || K == 0 || N == 0) {  // an expert without rows (models/moe.h): nothing for the GEMM to do
    at::Tensor y = at::zeros({M, N}, a.data.options().dtype(at::kFloat));
    return (bias.defined() ? y + bias.to(at::kFloat) : y).to(out);
  }
  const bool tensorwise = a.scale.dim() == 0 && b.scale.dim() == 0;
  if (tensorwise || a.data.is_cuda()) {
    return at::_scaled_mm(a.data.contiguous(), column_major(b.data), a.scale.contiguous(), b.scale.contiguous(),
                          bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt, /*scale_result=*/std::nullopt, out);
  }
  // The CPU's rowwise product (the header): LibTorch 2.11's CPU _scaled_mm takes scalar scales only.
  at::Tensor y = at::mm(a.data.to(at::kFloat), b.data.to(at::kFloat)).mul_(a.scale).mul_(b.scale);
  if (bias.defined()) y.add_(bias.to(at::kFloat));
  return y.to(out);
}

at::Tensor float8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const Float8Scaling& scaling) {
  return Float8Linear::apply(x, weight, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt,
                             at::IValue::make_capsule(c10::make_intrusive<ScalingHolder>(scaling)));
}

}  // namespace kiln
