// parallel/activation_checkpoint.h -- activation checkpointing (`--activation-checkpointing
// none|full|selective`): trade recomputation in backward for the activations autograd would
// otherwise keep between forward and backward. (LibTorch's C++ API has no torch.utils.checkpoint.)
//
// checkpoint(fn, inputs) is a reentrant checkpoint, as torch.utils.checkpoint with
// use_reentrant=True (Chen et al., 2016, "Training Deep Nets with Sublinear Memory Cost"):
//   forward:  y = fn(x) under no-grad; only x is saved (plus the RNG and autocast state).
//   backward: x' = x.detach().requires_grad_(); the RNG state of the forward is put back, fn is
//             run again with grad on and the forward's autocast state, the RNG state of before is
//             restored, and torch::autograd::backward(y', dy) runs inside the outer backward
//             ("reentrant"): parameter gradients accumulate into .grad through their own
//             AccumulateGrad nodes (so DDP's post-hooks on those nodes fire as without
//             checkpointing) and dx = x'.grad is returned.
// Dropout inside fn therefore draws the same masks in the recomputation as in the forward, and
// the RNG stream after backward is where it would be without checkpointing: gradients with and
// without checkpointing are bit-identical on the same kernels (tests/test_activation_checkpoint).
// The autocast cast cache is switched off while fn runs (forward and recomputation): before
// PyTorch's fix for issue #158232 a weight cast under no-grad was cached without a grad_fn, and a
// recomputation that found it would lose the weight's gradient. LibTorch 2.11 has the fix, so
// here this is a guard for other versions (the test of it passes with or without it on 2.11).
//
// Modes, per transformer block (B batch, T sequence, d = d_model, H heads, kv = n_kv_head * h):
//   none       nothing recomputed.
//   full       GPT::block_runner wraps each block in checkpoint(): the block keeps only its input
//              x [B, T, d]; the whole block (ln_1, c_attn, attention, c_proj, ln_2, MLP,
//              dropouts) is recomputed in backward: about one extra forward, +33% of the FLOPs.
//   selective  Megatron-LM's selective recomputation (Korthikanti et al., 2022, "Reducing
//              Activation Recomputation in Large Transformer Models"), plus the GELU:
//              - AttentionImpl::core wraps the attention core (scaled_dot_product_attention: QK^T,
//                softmax, dropout, attention x V) in checkpoint(): it keeps q, k, v (views of the
//                c_attn output) and recomputes the core in backward;
//              - MLPImpl::gelu_proj runs mlp.c_proj(gelu_tanh(h)) as gelu_linear(): it keeps h
//                and recomputes gelu(h) in backward; no GEMM is recomputed.
//              Everything else is kept as in `none`.
//
// Bytes kept per token per layer (counted by listing autograd's saved tensors of the block's ops,
// by storage; the CPU rows measured within 1% by tests/test_activation_checkpoint.cpp with malloc
// statistics; the tensor-by-tensor table is in docs/activation_checkpointing.md):
//   CPU, fp32, dropout > 0 (SDPA math path: scores materialised):
//     none       72d + 12HT + 16        (the 12HT: softmax output, dropout mask, dropped probs)
//     selective  48d + 8kv + 16         (= 56d + 16 for kv = d)
//     full        4d                    (the block input, fp32)
//   GPU, bf16 autocast, flash / cuDNN attention, dropout > 0 (derived, not measured here):
//     none       34d + 4kv + 4H + 16    (residual stream fp32; 1-byte dropout masks)
//     selective  26d + 4kv + 16         (the logsumexp 4H and the GELU output 8d dropped)
//     full        4d
//   plus, for full and for selective's attention core, a constant per layer: the CPU generator
//   state (5056 bytes) and, on CUDA, the CUDA generator's (16 bytes). With flash attention
//   nothing of size T^2 is ever kept, so selective recomputation buys little there; it matters
//   where the scores are materialised (the math path: CPU, dropout on CPU, unsupported shapes).
//
// Limits: use backward(), not torch::autograd::grad() (the recomputed graph accumulates into
// .grad, as the reentrant PyTorch checkpoint does). If no input requires grad, or grad mode is
// off, fn runs plainly (no checkpoint, nothing saved or recomputed). The recomputation must take
// the same kernels as the forward: a backend choice that depends on requires_grad (a GPU SDPA
// rule) would break RNG replay.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace kiln {

class GPT;

enum class ActivationCheckpointing { None, Full, Selective };

// "none" | "full" | "selective"; anything else throws ConfigError naming the flag and the choices.
ActivationCheckpointing parse_activation_checkpointing(const std::string& name);
std::string to_string(ActivationCheckpointing mode);

// Sets (or, for None, clears) the model's hooks: GPT::block_runner for Full; every block's
// AttentionImpl::core and MLPImpl::gelu_proj for Selective. Call it after tensor parallelism and
// before DDP / ZeRO (the torchtitan order). Calling it again replaces the previous mode. `opts`
// are passed to every checkpoint() (preserve_rng_state = false only to show what replay is for).
struct CheckpointOptions {
  bool preserve_rng_state = true;  // replay the forward's RNG state in the recomputation (default on)
};

void apply_activation_checkpointing(GPT& model, ActivationCheckpointing mode, CheckpointOptions opts = {});

// Reentrant checkpoint of fn over inputs (see above). fn must be a pure function of its inputs
// and of module parameters: it is called twice, and must draw random numbers the same way both
// times. Outputs are those of fn.
using CheckpointFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;
std::vector<at::Tensor> checkpoint(CheckpointFn fn, const std::vector<at::Tensor>& inputs,
                                   CheckpointOptions opts = {});
// One tensor in, one out.
at::Tensor checkpoint(std::function<at::Tensor(const at::Tensor&)> fn, const at::Tensor& input,
                      CheckpointOptions opts = {});

// y = gelu_tanh(h) W^T + b with h [..., K], W [N, K], b [N] -> [..., N], keeping h (not
// gelu(h)) for backward and recomputing gelu(h) there:
//   dg = dy W,  dh = gelu'(h) dg,  dW = dy^T gelu(h),  db = sum dy
// the same ATen calls, in the same dtypes, as autograd's backward of at::linear (under autocast
// too), so its gradients are bit-identical to the plain ops'. Keeps h only: K elements per row
// where the plain ops keep 2K (h for gelu's backward, gelu(h) for the GEMM's).
at::Tensor gelu_linear(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& bias);

}  // namespace kiln
