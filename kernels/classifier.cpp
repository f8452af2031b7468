// kernels/classifier.cpp -- the fused classifier's entry: kiln's kernel on CUDA, the composite ops
// elsewhere (the reference, which is the CPU's path).
#include "kernels/classifier.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include <ATen/ATen.h>

#ifdef KILN_WITH_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/classifier_cuda.h"
#include "kernels/cuda_dtype.h"
#endif

namespace kiln {

at::Tensor softmax_cross_entropy_rows(at::Tensor z, const at::Tensor& targets, int64_t vocab, at::Tensor grad,
                                      Kernels kernels) {
  const int64_t Vp = z.size(1);
#ifdef KILN_WITH_KERNELS
  // (targets on z's device: the kernel reads them there; a host tensor takes the composite path,
  // whose gather names the mismatch)
  if (kernels == Kernels::fused && z.is_cuda() && z.scalar_type() == at::kFloat && z.is_contiguous() &&
      targets.device() == z.device() && targets.scalar_type() == at::kLong &&
      (!grad.defined() || (kernels::supported_dtype(grad) && grad.stride(1) == 1))) {
    const c10::cuda::CUDAGuard guard(z.device());
    const at::Tensor t = targets.reshape({-1}).contiguous();
    const int64_t c = z.size(0);
    at::Tensor loss_rows = at::empty({c}, z.options());
    kernels::check_launch(kernels::softmax_xent_cuda(z.data_ptr<float>(), Vp, t.data_ptr<int64_t>(), c, vocab, Vp - vocab,
                                                     loss_rows.data_ptr<float>(),
                                                     grad.defined() ? kernels::dtype_of(grad) : kernels::DType::f32,
                                                     grad.defined() ? grad.data_ptr() : nullptr,
                                                     grad.defined() ? grad.stride(0) : 0,
                                                     c10::cuda::getCurrentCUDAStream(z.device().index()).stream()),
                          "softmax cross-entropy");
    return loss_rows.sum();
  }
#endif
  // The padding columns at -inf: they drop out of the log-sum-exp and their softmax is 0, so the
  // padding rows of W get a zero gradient, with no copy of the real columns.
  if (Vp > vocab) z.narrow(1, vocab, Vp - vocab).fill_(-std::numeric_limits<double>::infinity());
  const at::Tensor lsm = at::_log_softmax(z, 1, false);  // [c, Vp] fp32
  const at::Tensor lt = lsm.gather(1, targets);          // [c, 1]: log p of the targets
  if (grad.defined()) {
    at::exp_out(grad, lsm);                                  // softmax, rounded once
    grad.scatter_(1, targets, at::expm1(lt).to(grad.scalar_type()));  // p - 1 at the targets, from fp32
  }
  return lt.sum().neg_();
}

namespace {
#ifdef KILN_WITH_KERNELS
bool rows_fused(const at::Tensor& z, Kernels kernels) {
  return kernels == Kernels::fused && z.is_cuda() && z.dim() == 2 && z.is_contiguous() && kernels::supported_dtype(z);
}
#endif
}  // namespace

std::pair<at::Tensor, at::Tensor> softmax_row_stats(const at::Tensor& z, int64_t cols, Kernels kernels) {
  const int64_t N = z.size(0);
  const auto f32 = z.options().dtype(at::kFloat);
#ifdef KILN_WITH_KERNELS
  if (rows_fused(z, kernels)) {
    const c10::cuda::CUDAGuard guard(z.device());
    at::Tensor m = at::empty({N}, f32), s = at::empty({N}, f32);
    kernels::check_launch(kernels::softmax_row_stats_cuda(kernels::dtype_of(z), z.data_ptr(), z.size(1), N, cols,
                                                          m.data_ptr<float>(), s.data_ptr<float>(),
                                                          c10::cuda::getCurrentCUDAStream(z.device().index()).stream()),
                          "softmax row stats");
    return {m, s};
  }
#else
  (void)kernels;
#endif
  if (cols <= 0) return {at::full({N}, -std::numeric_limits<float>::infinity(), f32), at::zeros({N}, f32)};
  const at::Tensor zr = z.narrow(1, 0, cols).to(at::kFloat);
  const at::Tensor m = std::get<0>(zr.max(1));
  return {m, (zr - m.unsqueeze(1)).exp().sum(1)};
}

at::Tensor softmax_xent_grad(const at::Tensor& z, int64_t cols, const at::Tensor& lse, const at::Tensor& local_targets,
                             const at::Tensor& scale, Kernels kernels, at::Tensor out) {
  const int64_t N = z.size(0), width = z.size(1);
  cols = std::clamp<int64_t>(cols, 0, width);
  if (out.defined() && (out.dim() != 2 || out.size(0) != N || out.size(1) != width || out.stride(1) != 1 ||
                        out.scalar_type() != z.scalar_type() || out.device() != z.device())) {
    throw std::invalid_argument("softmax_xent_grad: out must be [N, width] of z's dtype and device with unit column stride");
  }
#ifdef KILN_WITH_KERNELS
  if (rows_fused(z, kernels) && lse.device() == z.device() && local_targets.device() == z.device() &&
      scale.device() == z.device() && lse.scalar_type() == at::kFloat && scale.scalar_type() == at::kFloat &&
      local_targets.scalar_type() == at::kLong) {
    const c10::cuda::CUDAGuard guard(z.device());
    at::Tensor g = out.defined() ? out : at::empty_like(z);
    const at::Tensor l = lse.contiguous(), t = local_targets.contiguous();
    kernels::check_launch(kernels::softmax_xent_grad_cuda(kernels::dtype_of(z), z.data_ptr(), width, N, cols, width - cols,
                                                          l.data_ptr<float>(), t.data_ptr<int64_t>(), scale.data_ptr<float>(),
                                                          g.data_ptr(), g.stride(0),
                                                          c10::cuda::getCurrentCUDAStream(z.device().index()).stream()),
                          "softmax cross-entropy gradient");
    return g;
  }
#endif
  at::Tensor g = at::zeros({N, width}, z.options().dtype(at::kFloat));
  if (cols > 0) {
    const at::Tensor x = z.narrow(1, 0, cols).to(at::kFloat) - lse.unsqueeze(1);
    at::Tensor p = x.exp();
    const at::Tensor held = local_targets.ge(0).logical_and(local_targets.lt(cols));
    const at::Tensor t = local_targets.masked_fill(held.logical_not(), 0).unsqueeze(1);
    const at::Tensor at_target = at::where(held.unsqueeze(1), at::expm1(x.gather(1, t)), p.gather(1, t));
    p.scatter_(1, t, at_target);
    g.narrow(1, 0, cols).copy_(p * scale);
  }
  if (out.defined()) return out.copy_(g);
  return g.to(z.scalar_type());
}

}  // namespace kiln
