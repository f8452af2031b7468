// optim/precision.h -- the compute precision of a run, and the autocast scope of its forward.
//
// Mixed precision, as PyTorch AMP does it: parameters (the master weights), their gradients and
// AdamW's moments stay fp32; inside the forward, autocast runs matrix products and attention in
// bf16 or fp16 (from fp32 weights cast once per forward and cached until its end), while
// reductions, layer norms, softmax and the loss stay fp32. Backward mirrors the forward's
// dtypes, and every gradient reaching a parameter is cast back to fp32, so accumulation across
// micro-steps and the DDP all-reduce run in fp32. Bytes per parameter (model states):
//   fp32:  4 weight + 4 grad + 8 AdamW (m, v)                          = 16
//   bf16 / fp16: the same 16, plus the 2-byte cast copy of each weight held from forward to
//          backward (the matrix products save it)                      = 18 at the peak
// (Activations are the other, larger, part, and halve with bf16/fp16: docs/precision.md.)
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace kiln {

// FP8: bf16 autocast, the blocks' linear layers in float8 (kernels/float8.h; GPT::set_float8).
enum class Precision { FP32, BF16, FP16, FP8 };

// "fp32" | "bf16" | "fp16" | "fp8"; ConfigError otherwise.
Precision parse_precision(const std::string& name);
at::ScalarType compute_dtype(Precision p);
// --param-dtype / --reduce-dtype names: "fp32" | "bf16" | "fp16" (validated by TrainConfig).
at::ScalarType dtype_named(const std::string& name);

// The elements of the fp32 weights autocast casts to 16 bits and keeps from a forward to its
// backward (its cache holds each cast until the scope ends; the matrix products save them):
// every block's c_attn and c_fc weight and bias and both c_proj weights, and the c_proj biases
// when they go through the product (tensor_parallel = false: a row-parallel bias is added after
// the all-reduce). Not wte: the chunked loss casts it and lets it go within the forward
// (models/linear_cross_entropy.h) -- under tp and fp16 the plain at::linear does cache it, which
// this count leaves out. `named_numels`: the parameters' names (GPT::named_parameters) and sizes.
// Bytes: 2 x this, when fp32 working weights run under bf16 / fp16 autocast (kiln plan's
// cast_copies, plan/cost_model.h).
// Recomputation runs without the cast cache (parallel/activation_checkpoint.h): under full
// recomputation (blocks_recomputed) no block's cast outlives its forward, so the count is 0;
// under selective, the GELU feed-forward's c_proj goes through gelu_linear, which casts its
// weight (and bias) afresh (gelu_proj_recomputed): those are left out.
int64_t autocast_cached_numel(const std::vector<std::pair<std::string, int64_t>>& named_numels, bool tensor_parallel,
                              bool blocks_recomputed = false, bool gelu_proj_recomputed = false);

// Autocast on `device` with the precision's dtype while alive (nothing for fp32). The casts
// cached during the scope are dropped when the outermost scope ends.
class AutocastScope {
 public:
  AutocastScope(Precision p, c10::DeviceType device);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_;
  c10::DeviceType device_;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kFloat;
};

}  // namespace kiln
