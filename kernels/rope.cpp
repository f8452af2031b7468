// kernels/rope.cpp -- the rotary embedding's entry: kiln's kernel on CUDA, the composite ops
// elsewhere.
#include "kernels/rope.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#ifdef KILN_WITH_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/cuda_dtype.h"
#include "kernels/rope_cuda.h"
#endif

namespace kiln {

namespace {

#ifdef KILN_WITH_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// x [B, H, T, h] (last dimension contiguous) -> y contiguous, turned by +angle or (backward) -angle.
at::Tensor turn(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions,
                bool backward) {
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  kernels::check_launch(
      kernels::rope_cuda(kernels::dtype_of(x), x.data_ptr(), x.size(0), x.size(1), x.size(2), x.size(3), x.stride(0),
                         x.stride(1), x.stride(2), cos.data_ptr(), sin.data_ptr(),
                         positions.defined() ? positions.data_ptr<int64_t>() : nullptr, y.data_ptr(), backward,
                         c10::cuda::getCurrentCUDAStream(x.device().index()).stream()),
      backward ? "rope backward" : "rope forward");
  return y;
}

struct FusedRope : public torch::autograd::Function<FusedRope> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            const at::Tensor& positions) {
    ctx->save_for_backward({cos, sin, positions});
    return turn(x, cos, sin, positions, /*backward=*/false);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor dy = grads[0].to(saved[0].scalar_type()).contiguous();
    return {turn(dy, saved[0], saved[1], saved[2], /*backward=*/true), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};
#endif

}  // namespace

#ifdef KILN_WITH_KERNELS
namespace {
// What the kernel takes: [B, heads, T, h] on CUDA, h even and contiguous, the tables of x's dtype
// and contiguous on x's device (with the positions).
bool fusable(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions) {
  return x.is_cuda() && x.dim() == 4 && kernels::supported_dtype(x) && x.stride(3) == 1 && x.size(3) % 2 == 0 &&
         cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type() && cos.is_contiguous() &&
         sin.is_contiguous() && cos.size(1) == x.size(3) && cos.device() == x.device() && sin.device() == x.device() &&
         (!positions.defined() || (positions.dim() == 1 && positions.device() == x.device()));
}
}  // namespace
#endif

std::pair<at::Tensor, at::Tensor> rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                       const at::Tensor& sin, const at::Tensor& positions, Kernels kernels) {
#ifdef KILN_WITH_KERNELS
  if (kernels == Kernels::fused && fusable(q, cos, sin, positions) && fusable(k, cos, sin, positions)) {
    const at::Tensor p = positions.defined() ? positions.contiguous() : positions;
    return {FusedRope::apply(q, cos, sin, p), FusedRope::apply(k, cos, sin, p)};
  }
#endif
  const int64_t T = q.size(2);
  // Positions per row ([B, T]: --document-positions restart): the tables' rows [B, 1, T, h],
  // broadcast over the heads.
  auto rows = [&](const at::Tensor& table) {
    if (!positions.defined()) return table.narrow(0, 0, T);
    if (positions.dim() == 1) return table.index_select(0, positions);
    return table.index_select(0, positions.reshape({-1})).view({positions.size(0), 1, T, table.size(1)});
  };
  const at::Tensor c = rows(cos), s = rows(sin);
  auto turn = [&](const at::Tensor& x) {
    const auto halves = x.chunk(2, -1);
    return x * c + at::cat({-halves[1], halves[0]}, -1) * s;
  };
  return {turn(q), turn(k)};
}

}  // namespace kiln
