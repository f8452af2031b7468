// kernels/float8.h -- 8-bit floating-point products with dynamic scaling, tensorwise or rowwise
// (`--precision fp8`, `--fp8-recipe`, issue 52; docs/precision.md): the composite ops (the
// reference, `--kernels reference`) and the entry of the quantisation's kernels (kernels/float8.cu).
//
// A tensor x in float8 (e4m3: 4 exponent bits, 3 mantissa bits, largest 448; e5m2: 5 and 2,
// largest 57344) is kept as (q, s) with x ~ q * s:
//   s = max(amax(|x|), 1e-12) / fmax          (fp32, the dequantisation scale)
//   q = cast_f8(clamp(x / s, -fmax, fmax))    (round to nearest even)
// so the largest element lands on the format's largest value. Tensorwise: one amax for the whole
// tensor (torchao's tensorwise recipe). Rowwise (axiswise): one amax for each row of the product's
// operand along its contracted dim -- x [M, K] in the forward has M scales (amax over K) -- which
// keeps one outlier token or one large output row from flattening the rest (torchao's rowwise
// recipe, torchtitan's `float8.recipe_name = "rowwise"`).
//
// A linear layer y = x W^T + b (x [M, K], W [N, K], g = dL/dy [M, N]) in float8, as torchao's
// Float8Linear, each product one scaled GEMM accumulating in fp32:
//   forward   y  = (q_x q_W^T) s_x s_W + b          x, W in e4m3
//   backward  dX = (q_g q_W) s_g s_W,  dW = (q_g^T q_x) s_g s_x,  db = sum_rows(g)
//             g in Float8Scaling::grad_dtype (e5m2 by default: its range, as torchao's tensorwise
//             default; torchtitan's rowwise recipe takes e4m3 -- `--fp8-grad` chooses)
// Tensorwise: the operands are quantised once in the forward and kept for the backward (q_x, q_W:
// one byte an element, against two for bf16); g once. Rowwise: every product scales along its own
// non-contracted dims, so each operand is quantised for the product at hand from its 16-bit value
// (kept for the backward, as bf16's linear keeps it):
//   y:  x by rows (amax over K) [M, 1],   W by rows (over K) [N, 1]
//   dX: g by rows (over N) [M, 1],        W by columns (over N) [1, K]
//   dW: g by columns (over M) [1, N],     x by columns (over M) [1, K]
// Where a tensor is split over ranks, an amax over a split dim is the maximum over the group that
// holds the parts (Float8Scaling's reducers, one for each of the product's dims: m the tokens --
// cp's sequence; k the input features -- a row-parallel layer's; n the output features -- a
// column-parallel layer's): every rank then quantises with the scales one process would use.
// Tensorwise reduces over both of a tensor's dims; rowwise over the dim its scale runs along.
//
// The products: CUDA's at::_scaled_mm (cuBLASLt tensorwise; CUTLASS rowwise, which writes bf16 and
// takes e4m3 second operands -- ours are W and x -- and an e4m3 or e5m2 first). It takes its
// second operand column-major (the kept tensors are handed over transposed as views where the
// product wants it) and wants every contracted dim a multiple of 16: dW contracts over the rows
// (tokens), so x and g are quantised with zero rows appended up to one (no amax changes, nothing
// added to dW; the other products read the first rows) -- on every device, so the CPU's tests run
// that path. On the CPU LibTorch 2.11's _scaled_mm takes tensorwise scales only; a rowwise product
// there is the same arithmetic composed: the exact products of the 8-bit values summed in fp32,
// times both scales, plus the bias, rounded once (scaled_product's composite).
// Bytes: the quantisation's kernels read x once for the amax and once for the cast, writing one
// byte an element (kernels/float8.cu; the composite ops move about 33 bytes a bf16 element).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

#include "distributed/comm.h"
#include "kernels/float8_filter.h"  // float8_layer_eligible

namespace kiln {

struct Float8Tensor {
  at::Tensor data;   // float8 (e4m3 or e5m2), x's shape
  at::Tensor scale;  // fp32: a scalar (tensorwise), or x's shape with the dim the amax ran over kept as 1
  at::Tensor dequantized() const;  // data * scale in fp32
};

// amax of a tensor part (fp32, any shape: a scalar or a row of amaxes) -> the group's amax; empty:
// the tensor is whole here.
using AmaxReduce = std::function<at::Tensor(const at::Tensor&)>;

// A float8 layer's weight quantised once an optimizer step (Float8Scaling::cache): W changes only
// between steps, so the step's first forward quantises it -- both of the forms the layer's products
// take -- and every later micro-step's forward and backward (and a recomputation's) read them:
//   tensorwise  q: q_W [N, K] row-major (y's second operand, as q_W^T's view);
//               t: q_W in the column-major layout dX's product takes (its transpose, written once)
//   rowwise     q: W by rows ([N, 1] scales, y's);  t: W by columns ([1, K] scales, dX's)
// A step begins when the owner's clock moves (GPT::begin_float8_step, at each step's first
// micro-batch; inside --cuda-graph's capture too, so every replay's first micro-step requantises).
// Only under autograd: an evaluation or a sample, which may run between an update and the next
// step, quantises afresh. 2 bytes a weight element held from one step's first forward to the next's.
struct Float8WeightCache {
  std::shared_ptr<const int64_t> clock;  // the owner's step count
  int64_t at = -1;                       // the clock's value when q and t were made
  Float8Tensor q, t;
};

// How a linear layer's products run in float8 (off: LibTorch's / kernels/matmul.h's products).
struct Float8Scaling {
  bool on = false;
  bool rowwise = false;                           // the recipe: rowwise, or tensorwise
  bool fused = false;  // CUDA tensors: the quantisation's kernels (kernels/float8.cu); else the composite ops
  at::ScalarType grad_dtype = at::kFloat8_e5m2;  // the output gradient's format
  // The reductions of an amax over a split dim of the product (above): m the rows (tokens) of x
  // and g, k the columns of x and W, n the rows of W and the columns of g.
  AmaxReduce m, k, n;
  // Sequence parallelism's column layers (parallel/sequence_parallel.h, gathered_linear), tensorwise:
  // x comes as this rank's rows of the sequence [B, T/t, K] and the product takes the whole
  // [B, T, K]. The rank's rows are quantised with the group's amax (rows_amax, after m and k) and
  // gathered in 8 bits (gather_rows, on their bytes: half of bf16's traffic, and q_x is what the
  // backward keeps: no gather there); the input gradient is reduce-scattered back to the rank's
  // rows (scatter_rows, in x's dtype). Empty: x is whole.
  AmaxReduce rows_amax;
  std::function<at::Tensor(const at::Tensor&)> gather_rows, scatter_rows;
  // ZeRO-3's 8-bit gather (parallel/zero.h, "Float8 weights"), tensorwise: W's e4m3 bytes and its
  // scale as the engine gathered them -- each rank's shard quantised with the whole weight's amax,
  // so the values to_float8(W) gives, bit for bit. Set while the weight is gathered; null or its
  // data undefined: the layer quantises W itself. The layer then never reads W's own storage
  // (the engine leaves the 16-bit weight ungathered); W still takes dW.
  std::shared_ptr<Float8Tensor> weight8;
  // W's 8-bit forms kept for the optimizer step (above); null: quantised at every use. weight8,
  // where set, comes first.
  std::shared_ptr<Float8WeightCache> cache;
};

// On, tensorwise, e5m2 gradients, no reductions (a whole layer in one process).
inline Float8Scaling float8_tensorwise() {
  Float8Scaling s;
  s.on = true;
  return s;
}

// On, rowwise, e4m3 gradients (torchtitan's rowwise recipe), no reductions.
inline Float8Scaling float8_rowwise() {
  Float8Scaling s;
  s.on = true;
  s.rowwise = true;
  s.grad_dtype = at::kFloat8_e4m3fn;
  return s;
}

// The group's amax of a tensor whose parts its ranks hold: `before` (a reduction the tensor already
// takes, over another group; none when empty), then the maximum over `group` (an all-reduce of
// the fp32 amaxes -- one, or a row of them -- on the tensor's device).
AmaxReduce amax_over(std::shared_ptr<Communicator> group, AmaxReduce before = {});

// "e5m2" | "e4m3" -> the gradient's float8 dtype; ConfigError otherwise.
at::ScalarType float8_grad_dtype(const std::string& name);

// x quantised to `dtype` (at::kFloat8_e4m3fn or at::kFloat8_e5m2) with its tensorwise scale
// (amax reduced over a group by `reduce` when given). `fused`: on a CUDA tensor of fp32, bf16 or
// fp16, kiln's two kernels (kernels/float8.cu: the same values, bit for bit); else the composite ops.
Float8Tensor to_float8(const at::Tensor& x, at::ScalarType dtype, const AmaxReduce& reduce = {}, bool fused = false);

// x (2-D) quantised with one scale per slice along `dim`'s other dim: dim 1 -> a scale per row
// ([M, 1], the amax over the columns), dim 0 -> a scale per column ([1, K]); the amaxes reduced over
// a group by `reduce` when given. `fused` as to_float8's.
Float8Tensor to_float8_along(const at::Tensor& x, at::ScalarType dtype, int64_t dim, const AmaxReduce& reduce = {},
                             bool fused = false);

// a [M, K] and b [K, N] quantised with scales that are scalars or a's [M, 1] and b's [1, N]
// -> a b in fp32 times the scales (+ bias [N]), rounded once to `out`: _scaled_mm where it runs
// (CUDA; the CPU with scalar scales), else its composite (the CPU's rowwise products).
at::Tensor scaled_product(const Float8Tensor& a, const Float8Tensor& b, const at::Tensor& bias, at::ScalarType out);

// y = x W^T + b through float8 products (above), with autograd: x [..., K] (fp32 or 16-bit),
// W [N, K], b [N] or undefined -> [..., N] in x's dtype.
at::Tensor float8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = at::Tensor(),
                         const Float8Scaling& scaling = float8_tensorwise());

}  // namespace kiln
