// kernels/swiglu.cpp -- SwiGLU's entry: kiln's kernels on CUDA, the composite ops elsewhere.
#include "kernels/swiglu.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#ifdef KILN_WITH_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/cuda_dtype.h"
#include "kernels/swiglu_cuda.h"
#endif

namespace kiln {

namespace {

#ifdef KILN_WITH_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct FusedSwiGLU : public torch::autograd::Function<FusedSwiGLU> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h_in) {
    const at::Tensor h = h_in.contiguous();
    const int64_t F = h.size(-1) / 2, rows = F > 0 ? h.numel() / (2 * F) : 0;
    auto shape = h.sizes().vec();
    shape.back() = F;
    const c10::cuda::CUDAGuard guard(h.device());
    at::Tensor y = at::empty(shape, h.options());
    kernels::check_launch(kernels::swiglu_forward_cuda(kernels::dtype_of(h), h.data_ptr(), y.data_ptr(), rows, F,
                                                       c10::cuda::getCurrentCUDAStream(h.device().index()).stream()),
                          "swiglu forward");
    ctx->save_for_backward({h});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor h = ctx->get_saved_variables()[0];
    const at::Tensor dy = grads[0].to(h.scalar_type()).contiguous();
    const int64_t F = h.size(-1) / 2, rows = F > 0 ? h.numel() / (2 * F) : 0;
    const c10::cuda::CUDAGuard guard(h.device());
    at::Tensor dh = at::empty_like(h);
    kernels::check_launch(kernels::swiglu_backward_cuda(kernels::dtype_of(h), h.data_ptr(), dy.data_ptr(), dh.data_ptr(),
                                                        rows, F, c10::cuda::getCurrentCUDAStream(h.device().index()).stream()),
                          "swiglu backward");
    return {dh};
  }
};
#endif

}  // namespace

at::Tensor swiglu(const at::Tensor& h, Kernels kernels) {
#ifdef KILN_WITH_KERNELS
  if (kernels == Kernels::fused && h.is_cuda() && kernels::supported_dtype(h) && h.size(-1) % 2 == 0) {
    return FusedSwiGLU::apply(h);
  }
#endif
  const auto gate_up = h.chunk(2, -1);
  return at::silu(gate_up[0]) * gate_up[1];
}

}  // namespace kiln
