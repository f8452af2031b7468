// models/rotary.cpp -- the rotary tables and their application (the math in the header).
#include "models/rotary.h"

#include <cmath>

#include <ATen/ATen.h>

#include "kernels/rope.h"


namespace kiln {

namespace {
// The frequencies, made with `opts` (its device: no copy from the host, which on a GPU would wait).
at::Tensor frequencies(const GPTConfig& cfg, const at::TensorOptions& opts) {
  const int64_t h = cfg.head_dim();
  // transformers: 1 / (base ** (arange(0, dim, 2, int64).float() / dim)), in fp32.
  at::Tensor inv = 1.0 / at::pow(at::scalar_tensor(cfg.rope_theta, opts), at::arange(0, h, 2, opts) / static_cast<double>(h));
  if (cfg.rope_factor != 0.0) {
    const double s = cfg.rope_factor, l = cfg.rope_low_freq_factor, u = cfg.rope_high_freq_factor;
    const double C = static_cast<double>(cfg.rope_original_context);
    const double low_wavelen = C / l, high_wavelen = C / u;
    const at::Tensor wavelen = 2.0 * M_PI / inv;
    at::Tensor scaled = at::where(wavelen > low_wavelen, inv / s, inv);
    const at::Tensor a = (C / wavelen - l) / (u - l);
    const at::Tensor smoothed = (1.0 - a) * scaled / s + a * scaled;
    const at::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
    inv = at::where(medium, smoothed, scaled);
  }
  return inv;
}
}  // namespace

RotaryEmbedding::RotaryEmbedding(const GPTConfig& cfg) : cfg_(cfg) {
  inv_freq_ = frequencies(cfg, at::TensorOptions().dtype(at::kFloat));
}

void RotaryEmbedding::ensure_tables(const c10::Device& device, at::ScalarType dtype) {
  if (!cos_.defined() || cos_.device() != device) {
    // Made on the device itself (a copy from pageable host memory would make the host wait for the
    // GPU, in the first step), by the same ops as inv_freq().
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
    // transformers: inv_freq[:, None] @ position[None, :] in fp32 (a product of one term: exact).
    const at::Tensor angles = at::outer(at::arange(cfg_.seq_len, f32), frequencies(cfg_, f32));  // [T, h/2]
    const at::Tensor emb = at::cat({angles, angles}, -1);                                   // [T, h]
    cos_ = emb.cos();
    sin_ = emb.sin();
    cos_cast_ = sin_cast_ = at::Tensor();
  }
  if (dtype == at::kFloat) return;
  if (!cos_cast_.defined() || cos_cast_.scalar_type() != dtype) {
    cos_cast_ = cos_.to(dtype);  // rounded as transformers' cos.to(q.dtype) is
    sin_cast_ = sin_.to(dtype);
  }
}

std::pair<at::Tensor, at::Tensor> RotaryEmbedding::apply(const at::Tensor& q, const at::Tensor& k,
                                                         const at::Tensor& positions) {
  ensure_tables(q.device(), q.scalar_type());
  const bool cast = q.scalar_type() != at::kFloat;
  const at::Tensor& cos = cast ? cos_cast_ : cos_;
  const at::Tensor& sin = cast ? sin_cast_ : sin_;
  return rope(q, k, cos, sin, positions, kernels);
}

}  // namespace kiln
