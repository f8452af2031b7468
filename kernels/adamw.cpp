// kernels/adamw.cpp -- AdamW's entry: kiln's one-pass kernel on CUDA, LibTorch's ops elsewhere.
#include "kernels/adamw.h"

#include <algorithm>
#include <stdexcept>

#include <ATen/ATen.h>

#ifdef KILN_WITH_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/adamw_cuda.h"
#include "kernels/cuda_dtype.h"
#endif

namespace kiln {

namespace {

bool same_sizes(const AdamWGroup& g) {
  const size_t n = g.params.size();
  return g.grads.size() == n && g.exp_avg.size() == n && g.exp_avg_sq.size() == n && g.steps.size() == n &&
         (g.working.empty() || g.working.size() == n);
}

bool scalar_on(const at::Tensor& t, const c10::Device& d) {
  return !t.defined() || (t.device() == d && t.scalar_type() == at::kFloat && t.numel() == 1);
}

}  // namespace

bool adamw_fused_eligible(const AdamWGroup& g, const at::Tensor& grad_factor, const at::Tensor& found_inf) {
#ifdef KILN_WITH_KERNELS
  if (g.params.empty() || !same_sizes(g)) return false;
  const c10::Device d = g.params.front().device();
  if (!d.is_cuda() || !scalar_on(grad_factor, d) || !scalar_on(found_inf, d)) return false;
  const at::ScalarType gt = g.grads.front().scalar_type();
  const at::ScalarType wt = g.working.empty() ? at::kBFloat16 : g.working.front().scalar_type();
  if (!kernels::supported_dtype(g.grads.front()) || (wt != at::kBFloat16 && wt != at::kHalf)) return false;
  auto fp32_here = [&](const at::Tensor& t, int64_t n) {
    return t.device() == d && t.scalar_type() == at::kFloat && t.is_contiguous() && t.numel() == n;
  };
  for (size_t i = 0; i < g.params.size(); ++i) {
    const int64_t n = g.params[i].numel();
    if (!fp32_here(g.params[i], n) || !fp32_here(g.exp_avg[i], n) || !fp32_here(g.exp_avg_sq[i], n) || !fp32_here(g.steps[i], 1))
      return false;
    const at::Tensor& gr = g.grads[i];
    if (gr.device() != d || gr.scalar_type() != gt || !gr.is_contiguous() || gr.numel() != n) return false;
    if (!g.working.empty()) {
      const at::Tensor& w = g.working[i];
      if (w.device() != d || w.scalar_type() != wt || !w.is_contiguous() || w.numel() != n) return false;
    }
  }
  return true;
#else
  (void)g, (void)grad_factor, (void)found_inf;
  return false;
#endif
}

void adamw_update(const AdamWGroup& g, const AdamWHyperParams& h, const at::Tensor& grad_factor, const at::Tensor& found_inf,
                  Kernels kernels, const at::Tensor& lr_tensor) {
  if (!same_sizes(g)) throw std::invalid_argument("adamw_update: the group's lists differ in length");
  if (g.params.empty()) return;
  at::NoGradGuard no_grad;
#ifdef KILN_WITH_KERNELS
  if (kernels == Kernels::fused && adamw_fused_eligible(g, grad_factor, found_inf) && scalar_on(lr_tensor, g.params.front().device())) {
    std::vector<kernels::AdamWTensor> t(g.params.size());
    for (size_t i = 0; i < t.size(); ++i) {
      t[i] = {g.params[i].data_ptr<float>(), g.grads[i].data_ptr(), g.exp_avg[i].data_ptr<float>(),
              g.exp_avg_sq[i].data_ptr<float>(), g.working.empty() ? nullptr : g.working[i].data_ptr(),
              g.steps[i].data_ptr<float>(), g.params[i].numel()};
    }
    const c10::Device d = g.params.front().device();
    const c10::cuda::CUDAGuard guard(d);
    const kernels::DType wt = g.working.empty() ? kernels::DType::bf16 : kernels::dtype_of(g.working.front());
    kernels::check_launch(
        kernels::adamw_cuda(kernels::dtype_of(g.grads.front()), wt, t.data(), static_cast<int64_t>(t.size()),
                            {h.lr, h.beta1, h.beta2, h.weight_decay, h.eps, lr_tensor.defined() ? lr_tensor.data_ptr<float>() : nullptr},
                            grad_factor.defined() ? grad_factor.data_ptr<float>() : nullptr,
                            found_inf.defined() ? found_inf.data_ptr<float>() : nullptr,
                            c10::cuda::getCurrentCUDAStream(d.index()).stream()),
        "adamw");
    return;
  }
#else
  (void)kernels;
#endif
  std::vector<at::Tensor> grads = g.grads;
  const bool fp32 = std::all_of(grads.begin(), grads.end(), [](const at::Tensor& t) { return t.scalar_type() == at::kFloat; });
  if (!fp32) {  // 16-bit gradients: fp32 copies, clipped (the originals are left as they were)
    for (auto& t : grads) t = t.to(at::kFloat);
  }
  if (grad_factor.defined()) at::_foreach_mul_(grads, grad_factor);
  const std::optional<at::Tensor> skip = found_inf.defined() ? std::optional<at::Tensor>(found_inf) : std::nullopt;
  if (lr_tensor.defined()) {
    at::_fused_adamw_(g.params, grads, g.exp_avg, g.exp_avg_sq, /*max_exp_avg_sqs=*/{}, g.steps, lr_tensor, h.beta1, h.beta2,
                      h.weight_decay, h.eps, /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt, skip);
  } else {
    at::_fused_adamw_(g.params, grads, g.exp_avg, g.exp_avg_sq, /*max_exp_avg_sqs=*/{}, g.steps, h.lr, h.beta1, h.beta2,
                      h.weight_decay, h.eps, /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt, skip);
  }
  if (!g.working.empty()) at::_foreach_copy_(g.working, g.params);
}

}  // namespace kiln
