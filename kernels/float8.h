// kernels/float8.h -- 8-bit floating-point products with dynamic tensorwise scaling
// (`--precision fp8`, issue 52; docs/precision.md): the composite ops, the reference for a fused
// amax-and-cast kernel to come.
//
// A tensor x in float8 (e4m3: 4 exponent bits, 3 mantissa bits, largest 448; e5m2: 5 and 2,
// largest 57344) is kept as (q, s) with x ~ q * s:
//   s = max(amax(|x|), 1e-12) / fmax          (fp32 scalar, the dequantisation scale)
//   q = cast_f8(clamp(x / s, -fmax, fmax))    (round to nearest even)
// so the largest element lands on the format's largest value (torchao's tensorwise recipe).
// Where a tensor is split over ranks (tp's weights, a row-parallel layer's input, a
// column-parallel layer's output gradient), amax is the maximum over the group that holds its
// parts (Float8Scaling's reducers): every rank then quantises with the scale one process would
// use, and the layouts stay equal to one process.
// A linear layer y = x W^T + b (x [M, K], W [N, K]) in float8, as torchao's Float8Linear:
//   forward   y  = (q_x q_W^T) s_x s_W + b                      x, W in e4m3
//   backward  dX = (q_g q_W) s_g s_W,  dW = (q_g^T q_x) s_g s_x,  db = sum_rows(g)
//             g = dL/dy in Float8Scaling::grad_dtype (e5m2 by default: its range, as torchao's
//             default; torchtitan's rowwise recipe takes e4m3 -- `--fp8-grad` chooses)
// each product one at::_scaled_mm accumulating in fp32 and writing the output dtype (x's; dW in
// fp32, then the weight's). The operands are quantised once in the forward and kept for the
// backward (q_x, q_W: one byte an element, against two for bf16). _scaled_mm takes its second
// operand column-major: the kept tensors are handed over transposed as views where the product
// wants it (on the CPU LibTorch 2.11 takes any layout and tensorwise scales only; rowwise scaling
// is CUDA's). CUDA's _scaled_mm also wants every contracted dim a multiple of 16: dW contracts
// over the rows (tokens), so x and g are quantised with zero rows appended up to one (no amax
// changes, nothing added to dW; the other products read the first rows) -- on every device, so
// the CPU's tests run that path. Bytes: the quantisation reads x once for amax and once for the
// cast.
#pragma once

#include <functional>
#include <string>

#include <ATen/core/Tensor.h>

#include "distributed/comm.h"

namespace kiln {

struct Float8Tensor {
  at::Tensor data;   // float8 (e4m3 or e5m2), x's shape
  at::Tensor scale;  // fp32 scalar: x ~ data * scale
  at::Tensor dequantized() const;  // data * scale in fp32
};

// amax of a tensor part (fp32 scalar) -> the group's amax; empty: the tensor is whole here.
using AmaxReduce = std::function<at::Tensor(const at::Tensor&)>;

// How a linear layer's products run in float8 (off: LibTorch's / kernels/matmul.h's products).
struct Float8Scaling {
  bool on = false;
  at::ScalarType grad_dtype = at::kFloat8_e5m2;  // the output gradient's format
  AmaxReduce x_amax, w_amax, g_amax;              // the split tensors' reductions (above)
};

// On, tensorwise, e5m2 gradients, no reductions (a whole layer in one process).
inline Float8Scaling float8_tensorwise() {
  Float8Scaling s;
  s.on = true;
  return s;
}

// The group's amax of a tensor whose parts its ranks hold: `before` (a reduction the tensor already
// takes, over another group; none when empty), then the maximum over `group` (an all-reduce of
// one fp32 scalar on the tensor's device).
AmaxReduce amax_over(std::shared_ptr<Communicator> group, AmaxReduce before = {});

// "e5m2" | "e4m3" -> the gradient's float8 dtype; ConfigError otherwise.
at::ScalarType float8_grad_dtype(const std::string& name);

// x quantised to `dtype` (at::kFloat8_e4m3fn or at::kFloat8_e5m2) with its tensorwise scale
// (amax reduced over a group by `reduce` when given).
Float8Tensor to_float8(const at::Tensor& x, at::ScalarType dtype, const AmaxReduce& reduce = {});

// y = x W^T + b through float8 products (above), with autograd: x [..., K] (fp32 or 16-bit),
// W [N, K], b [N] or undefined -> [..., N] in x's dtype.
at::Tensor float8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = at::Tensor(),
                         const Float8Scaling& scaling = float8_tensorwise());

// Whether a layer of W [N, K] takes float8 products: _scaled_mm wants K and N multiples of 16;
// `auto_filter` also leaves out the shapes where torchao measured no gain on an H100 for the
// tensorwise recipe: N <= 4096 with K <= 1024 (torchao's _auto_filter_for_tensorwise, which names
// weight.shape K, N -- the other way round). GPT-2 124M keeps only mlp.c_proj [768, 3072].
bool float8_layer_eligible(int64_t n, int64_t k, bool auto_filter);

}  // namespace kiln
