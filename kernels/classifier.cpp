// kernels/classifier.cpp -- the fused classifier's entry: kiln's kernel on CUDA, the composite ops
// elsewhere (the reference, which is the CPU's path).
#include "kernels/classifier.h"

#include <limits>

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

}  // namespace kiln
