// models/rotary.cpp -- the rotary tables and their application (the math in the header).
#include "models/rotary.h"

#include <cmath>

#include <ATen/ATen.h>

#include "distributed/device_check.h"

namespace kiln {

RotaryEmbedding::RotaryEmbedding(const GPTConfig& cfg) : context_(cfg.seq_len) {
  const int64_t h = cfg.head_dim();
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  // transformers: 1 / (base ** (arange(0, dim, 2, int64).float() / dim)), in fp32.
  inv_freq_ = 1.0 / at::pow(at::scalar_tensor(cfg.rope_theta, f32), at::arange(0, h, 2, f32) / static_cast<double>(h));
  if (cfg.rope_factor != 0.0) {
    const double s = cfg.rope_factor, l = cfg.rope_low_freq_factor, u = cfg.rope_high_freq_factor;
    const double C = static_cast<double>(cfg.rope_original_context);
    const double low_wavelen = C / l, high_wavelen = C / u;
    const at::Tensor wavelen = 2.0 * M_PI / inv_freq_;
    at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq_ / s, inv_freq_);
    const at::Tensor a = (C / wavelen - l) / (u - l);
    const at::Tensor smoothed = (1.0 - a) * scaled / s + a * scaled;
    const at::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
    inv_freq_ = at::where(medium, smoothed, scaled);
  }
}

void RotaryEmbedding::ensure_tables(const c10::Device& device) {
  if (cos_.defined() && cos_.device() == device) return;
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  // transformers: inv_freq[:, None] @ position[None, :] in fp32 (a product of one term: exact).
  const at::Tensor angles = at::outer(at::arange(context_, f32), inv_freq_);  // [T, h/2]
  const at::Tensor emb = at::cat({angles, angles}, -1);                        // [T, h]
  cos_ = to_device(emb.cos(), device);
  sin_ = to_device(emb.sin(), device);
}

std::pair<at::Tensor, at::Tensor> RotaryEmbedding::apply(const at::Tensor& q, const at::Tensor& k,
                                                         const at::Tensor& positions) {
  ensure_tables(q.device());
  const int64_t T = q.size(2);
  at::Tensor c = positions.defined() ? cos_.index_select(0, positions) : cos_.narrow(0, 0, T);
  at::Tensor s = positions.defined() ? sin_.index_select(0, positions) : sin_.narrow(0, 0, T);
  c = c.to(q.scalar_type());
  s = s.to(q.scalar_type());
  auto turn = [&](const at::Tensor& x) {
    const auto halves = x.chunk(2, -1);
    return x * c + at::cat({-halves[1], halves[0]}, -1) * s;
  };
  return {turn(q), turn(k)};
}

}  // namespace kiln
