// kernels/gelu_mlp.cpp -- the GELU feed-forward's entry: cuBLASLt's epilogues on CUDA, the
// composite ops elsewhere.
#include "kernels/gelu_mlp.h"

#include <cstdint>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/autograd.h>

#include "kernels/matmul.h"
#ifdef KILN_WITH_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/cublaslt.h"
#include "kernels/cuda_dtype.h"
#endif

namespace kiln {

namespace {

at::Tensor composite(const at::Tensor& x, const at::Tensor& w_fc, const at::Tensor& b_fc, const at::Tensor& w_proj,
                     const at::Tensor& b_proj) {
  return linear_product(at::gelu(linear_product(x, w_fc, b_fc), "tanh"), w_proj, b_proj);
}

#ifdef KILN_WITH_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void lt(const kernels::LtProduct& p, const at::Tensor& like, const char* what) {
  const at::Tensor workspace = at::empty({static_cast<int64_t>(kernels::kCublasLtWorkspaceBytes)}, like.options().dtype(at::kByte));
  const std::string e = kernels::cublaslt_matmul(p, like.device().index(), workspace.data_ptr(), kernels::kCublasLtWorkspaceBytes,
                                                 c10::cuda::getCurrentCUDAStream(like.device().index()).stream());
  if (!e.empty()) throw Error(std::string("kiln kernel gelu_mlp ") + what + ": " + e);
}

struct FusedGeluMLP : public torch::autograd::Function<FusedGeluMLP> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w_fc, const at::Tensor& b_fc,
                            const at::Tensor& w_proj, const at::Tensor& b_proj) {
    const c10::cuda::CUDAGuard guard(x.device());
    const int64_t N = x.size(0), d = x.size(1), F = w_fc.size(0);
    at::Tensor h = at::empty({N, F}, x.options()), g = at::empty({N, F}, x.options());
    // Column-major: g^T [F x N] = w_fc (stored [F, d] row-major: d x F column-major, transposed) x^T.
    kernels::LtProduct p;
    p.type = kernels::dtype_of(x);
    p.trans_a = true;
    p.m = F, p.n = N, p.k = d;
    p.a = w_fc.data_ptr(), p.lda = d;
    p.b = x.data_ptr(), p.ldb = d;
    p.d = g.data_ptr(), p.ldd = F;
    p.epilogue = kernels::Epilogue::gelu_aux_bias;
    p.bias = b_fc.data_ptr();
    p.aux = h.data_ptr(), p.ld_aux = F;
    lt(p, x, "forward");
    const at::Tensor out = at::addmm(b_proj, g, w_proj.t());
    ctx->save_for_backward({x, w_fc, w_proj, h, g});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w_fc = saved[1], &w_proj = saved[2], &h = saved[3], &g = saved[4];
    const c10::cuda::CUDAGuard guard(x.device());
    const at::Tensor dout = grads[0].to(x.scalar_type()).contiguous();
    const int64_t N = x.size(0), d = x.size(1), F = w_fc.size(0);
    const at::Tensor db_proj = dout.sum(0), dw_proj = at::mm(dout.t(), g);
    // dh^T [F x N] = w_proj (stored [d, F] row-major: F x d column-major) dout^T, times gelu'(h).
    at::Tensor dh = at::empty({N, F}, x.options());
    kernels::LtProduct p;
    p.type = kernels::dtype_of(x);
    p.m = F, p.n = N, p.k = d;
    p.a = w_proj.data_ptr(), p.lda = F;
    p.b = dout.data_ptr(), p.ldb = d;
    p.d = dh.data_ptr(), p.ldd = F;
    p.epilogue = kernels::Epilogue::dgelu;
    p.aux = h.data_ptr(), p.ld_aux = F;
    lt(p, x, "backward");
    return {at::mm(dh, w_fc), at::mm(dh.t(), x), dh.sum(0), dw_proj, db_proj};
  }
};

// The fused path's conditions: CUDA, one 16-bit dtype for x and every parameter (autocast's, when
// it is on), contiguous 2-D operands, widths cuBLASLt's auxiliary output takes.
bool fusable(const at::Tensor& x, const at::Tensor& w_fc, const at::Tensor& b_fc, const at::Tensor& w_proj,
             const at::Tensor& b_proj) {
  if (!x.is_cuda() || x.dim() != 2 || !b_fc.defined() || !b_proj.defined()) return false;
  const auto t = x.scalar_type();
  if (t != at::kBFloat16 && t != at::kHalf) return false;
  if (at::autocast::is_autocast_enabled(at::kCUDA) && at::autocast::get_autocast_dtype(at::kCUDA) != t) return false;
  for (const at::Tensor* p : {&x, &w_fc, &b_fc, &w_proj, &b_proj}) {
    if (p->scalar_type() != t || !p->is_contiguous() || p->device() != x.device()) return false;
    if (reinterpret_cast<uintptr_t>(p->data_ptr()) % 16 != 0) return false;
  }
  return w_fc.size(0) % 8 == 0 && x.size(1) % 8 == 0 && kernels::cublaslt_unavailable().empty();
}
#endif

}  // namespace

at::Tensor gelu_mlp(const at::Tensor& x, const at::Tensor& w_fc, const at::Tensor& b_fc, const at::Tensor& w_proj,
                    const at::Tensor& b_proj, Kernels kernels) {
#ifdef KILN_WITH_KERNELS
  if (kernels == Kernels::fused && fusable(x, w_fc, b_fc, w_proj, b_proj)) return FusedGeluMLP::apply(x, w_fc, b_fc, w_proj, b_proj);
#endif
  return composite(x, w_fc, b_fc, w_proj, b_proj);
}

}  // namespace kiln
