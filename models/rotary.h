// models/rotary.h -- rotary position embeddings (RoPE; Su et al., 2021, "RoFormer"), as the Llama
// family applies them, in Hugging Face transformers' layout.
//
// For a head of width h, frequencies inv_freq[i] = theta^(-2i / h), i < h/2 (fp32, as transformers
// computes them). The angle of position p is p * inv_freq[i]; the tables hold
//   cos[p] = cos(p * inv_freq) twice over, [h];  sin[p] likewise,
// and a query or key x [B, heads, T, h] at positions pos[T] becomes
//   x * cos[pos] + rotate_half(x) * sin[pos],   rotate_half([x1, x2]) = [-x2, x1]  (halves of h)
// -- each pair (x[i], x[i + h/2]) turned by its angle. This is the "rotate half" pairing of
// transformers' LlamaForCausalLM, whose q_proj / k_proj rows are permuted from Meta's interleaved
// checkpoints accordingly; weights in Hugging Face layout load with no permutation.
//
// Llama-3.1's frequency scaling (rope_type "llama3"; factor s, low / high frequency factors l, u,
// original context C): with wavelength w = 2 pi / inv_freq,
//   w > C / l:           inv_freq / s                       (long wavelengths: interpolated)
//   w < C / u:           inv_freq                           (short ones: kept)
//   between:             (1 - a) inv_freq / s + a inv_freq,  a = (C / w - l) / (u - l)
// computed as transformers' _compute_llama3_parameters does, in fp32.
//
// Cost: the tables are made once per run and device (fp32, [seq_len, h] each), and their copy in
// q's dtype once per dtype (under autocast q is 16-bit: transformers casts cos and sin to it on
// every call, kiln keeps the cast); applying them is elementwise work on q and k, no host work
// and no table-sized allocation per step.
#pragma once

#include <cstdint>
#include <utility>

#include <ATen/core/Tensor.h>

#include "kernels/kernel_choice.h"
#include "models/gpt_config.h"

namespace kiln {

class RotaryEmbedding {
 public:
  // Frequencies for the head width and the context of cfg (cfg.rope() must hold).
  explicit RotaryEmbedding(const GPTConfig& cfg);

  // q [B, H, T, h] and k [B, KV, T, h] turned by the angles of `positions` (int64 [T] on their
  // device, or [B, T]: each row its own; undefined: 0 .. T-1).
  std::pair<at::Tensor, at::Tensor> apply(const at::Tensor& q, const at::Tensor& k, const at::Tensor& positions = {});

  // kiln's kernel on CUDA (kernels/rope.h: one pass each way) or the composite ops
  // (GPT::set_kernels sets it).
  Kernels kernels = Kernels::reference;

  // The fp32 frequencies [h / 2] (tests compare them with transformers').
  const at::Tensor& inv_freq() const { return inv_freq_; }

 private:
  // The tables [context, h] on `device` in `dtype` (made on first use there; one device per run).
  void ensure_tables(const c10::Device& device, at::ScalarType dtype);

  GPTConfig cfg_;         // its rotary settings and context (the tables' rows)
  at::Tensor inv_freq_;  // fp32, CPU
  at::Tensor cos_, sin_;            // fp32
  at::Tensor cos_cast_, sin_cast_;  // the same in the dtype q last had (undefined: fp32, use cos_)
};

}  // namespace kiln
