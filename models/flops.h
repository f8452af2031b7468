// models/flops.h -- the model FLOPs per token, MFU's numerator.
//
// FLOPs per token (PaLM appendix B; nanoGPT, torchtitan and Megatron up to r0.x count alike):
//   F = 6 N + 12 L d T
// N: parameters less the position embedding (the tied output layer counted once), L layers,
// d model width, T sequence length. 6N is forward (2N) plus backward (4N) of every matrix
// multiply; 12 L d T is attention's QK^T and AV over the full T x T square, forward and
// backward. Causal attention only needs half of that square (Megatron since 2025 counts 6LdT);
// kiln keeps the full-square convention so its MFU compares with nanoGPT, torchtitan and PaLM.
// For gpt2-124m at T = 1024: N = 123,689,472, F = 855.4 MFLOP per token. Where the heads' width
// H h differs from d (Qwen3: GPTConfig::head_width), the attention term takes H h for d.
// The Llama family (models/gpt_config.h) is counted alike: N holds SwiGLU's three matrices, GQA's
// smaller K and V projections and an untied output layer; an untied token embedding is a lookup
// and is left out, as learned positions are (GPTConfig::num_params_non_embedding_pos).
// Mixture-of-Experts (models/moe.h): N is the ACTIVE count N_active (GPTConfig::
// num_active_params: each MoE layer's k experts and its router, not all E), the FLOPs a token
// really costs; the MoE dispatch's gathers, sorts and scatters are not counted (as the peers).
// gpt2-124m-moe (8 experts, top-2, every other block) at T = 1024: N_active = 152,060,928,
// F = 1,025.6 MFLOP per token, where all 322.9M parameters would claim 2,045.7.
//
//   MFU = tokens_per_s * F / (G * peak): the peak and G are distributed/device_peaks.h's and
// distributed/job_devices.h's. Recomputation (activation checkpointing) is never counted in F.
#pragma once

#include "models/gpt_config.h"

namespace kiln {

// F above, in FLOPs per trained token.
double flops_per_token(const GPTConfig& cfg);

}  // namespace kiln
