// models/gpt_config.h -- the shape of a GPT model, its presets, and its sizes.
//
// One decoder, two families, chosen by the architecture fields below:
//   GPT-2 (Radford et al., 2019; the defaults): learned position embeddings, pre-LayerNorm
//     blocks, GELU (tanh approximation), biases everywhere, output layer tied to the token
//     embedding.
//   Llama (Touvron et al., 2023; Llama 3, Mistral, Qwen2): rotary position embeddings (Su et al.,
//     2021; position = rope, base rope_theta, Llama-3.1's frequency scaling through rope_factor
//     and the three after it), RMSNorm (norm = rmsnorm), a SwiGLU feed-forward (mlp = swiglu:
//     down(silu(gate x) * up x), width F = ffn_hidden), no biases (bias = none; Qwen2: bias = qkv,
//     on the query, key and value projections only), an output layer of its own
//     (tie_embeddings = false; Llama-3.2-1B and Qwen2-0.5B tie it).
// Grouped-query attention (Ainslie et al., 2023) through n_kv_head: n_head query heads share
// n_kv_head key/value heads (n_kv_head == n_head is ordinary multi-head attention, 1 is
// multi-query attention).
// Qwen3 (2025): the head width given apart from d_model / n_head (head_width; the attention's
// width H h then differs from d), and an RMSNorm over each query and key head before the rotary
// turn (qk_norm: weights [h] shared by the heads, q_norm and k_norm, the blocks' norms' epsilon).
// Mistral's sliding window (sliding_window W > 0): a query at i sees the keys at j with
// i - W < j <= i (transformers' sliding-window causal mask); it acts once the context exceeds W.
//
// Parameter count, with d = d_model, L = n_layer, V' = padded vocabulary, T = seq_len,
// h = head_dim() (d / n_head unless head_width gives it), a = n_head * h (d but for Qwen3's
// shapes), kv = n_kv_head * h, F = mlp_hidden(); n = 2d for a LayerNorm (weight and bias), d for
// an RMSNorm; [x] = x when the bias pattern gives that layer a bias, else 0:
//   embeddings  V'd (wte) + Td (wpe; learned positions only)
//   per block   n (ln_1) + d(a + 2kv) + [a + 2kv] (c_attn: q, k, v) + ad + [d] (attn c_proj)
//               + 2h (q_norm, k_norm; qk_norm only)
//               + n (ln_2) + feed-forward:  gelu    dF + [F] (c_fc) + Fd + [d] (c_proj)
//                                           swiglu  2dF + [2F] (c_fc: gate, up) + Fd + [d] (c_proj: down)
//   final norm  n
//   output      V'd when untied (lm_head), nothing when tied to wte
// Presets (the published counts, which these reproduce exactly; V' = V for all of them):
//   gpt2-124m    L 12, d 768, H 12, V 50257 (V' 50304)                              124,475,904
//   llama3-1b    Llama-3.2-1B: L 16, d 2048, H 32, KV 8, F 8192, V 128256, tied   1,235,814,400
//   llama3-8b    Llama-3-8B: L 32, d 4096, H 32, KV 8, F 14336, V 128256          8,030,261,248
//   llama3-70b   Llama-3-70B: L 80, d 8192, H 64, KV 8, F 28672, V 128256        70,553,706,496
//   mistral-7b   Mistral-7B-v0.1: L 32, d 4096, H 32, KV 8, F 14336, V 32000      7,241,732,096
//   qwen2-0.5b   Qwen2-0.5B: L 24, d 896, H 14, KV 2, F 4864, V 151936, qkv biases,
//                tied                                                                494,032,768
//   mixtral-8x7b Mixtral-8x7B-v0.1: mistral-7b's shape with 8 SwiGLU experts (top-2,
//                dropless) in every block, base 1e6                               46,702,792,704
//   qwen3-0.6b   Qwen3-0.6B: L 28, d 1024, H 16, KV 8, h 128 (a 2048), F 3072, V 151936,
//                q/k norms, tied, base 1e6                                           596,049,920
// Llama's feed-forward width rule (Meta's reference code): F = 2 (4d) / 3, times
// ffn_dim_multiplier, rounded up to a multiple of multiple_of (llama_ffn_hidden below): Llama-3-8B
// 1.3 and 1024 -> 14336, Llama-3-70B 1.3 and 4096 -> 28672, Llama-3.2-1B 1.5 and 256 -> 8192.
//
// Mixture-of-Experts (models/moe.h; n_experts > 0): block i's feed-forward is an MoE layer when
// i % moe_every == 0 (Megatron's moe_layer_freq: with moe_every 2 blocks 0, 2, 4, ... ), a dense
// MLP otherwise. An MoE layer holds E experts, each the dense MLP's shape, and a router W_g [E, d]
// (no bias): per MoE block dF + F + Fd + d becomes E (dF + F + Fd + d) + E d. A token runs k
// experts, so the ACTIVE parameters (those one token's forward multiplies by) count k experts and
// the router: per MoE block k (dF + F + Fd + d) + E d.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace kiln {

struct GPTConfig {
  int64_t n_layer = 4;         // transformer blocks
  int64_t n_head = 4;          // query heads
  int64_t n_kv_head = 4;       // key/value heads (divides n_head; 1 = multi-query)
  int64_t d_model = 128;       // residual stream width
  int64_t seq_len = 128;       // context length T (positions learned)
  int64_t vocab_size = 512;    // real vocabulary; token ids are in [0, vocab_size)
  double dropout = 0.0;        // dropout on attention probabilities and residual branches
  double layer_norm_eps = 1e-5;  // the norms' epsilon (LayerNorm's or RMSNorm's)

  // ---- the architecture (above): GPT-2's by default
  std::string position = "learned";  // learned (wpe) | rope (rotary; no position parameters)
  double rope_theta = 10000.0;       // rotary base
  // Llama-3.1's rotary frequency scaling (Hugging Face rope_scaling, rope_type "llama3"):
  // rope_factor 0 is none. Wavelengths past original_context / low_freq_factor are divided by
  // factor, those under original_context / high_freq_factor kept, those between interpolated.
  double rope_factor = 0.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_context = 8192;
  std::string norm = "layernorm";  // layernorm (weight, bias) | rmsnorm (weight)
  std::string mlp = "gelu";        // gelu (c_fc, c_proj) | swiglu (c_fc holds gate then up; c_proj is down)
  int64_t ffn_hidden = 0;          // feed-forward width F; 0: 4d for gelu, llama_ffn_hidden(d, 1, 256) for swiglu
  std::string bias = "all";        // all (every linear) | none | qkv (c_attn only, Qwen2's)
  bool tie_embeddings = true;      // the output layer is wte; false: a parameter of its own, lm_head
  int64_t head_width = 0;          // the head width h; 0: d_model / n_head (Qwen3 gives it apart)
  int64_t sliding_window = 0;      // Mistral's: a query sees the last W positions (itself included); 0: all before it
  bool qk_norm = false;            // RMSNorm over each query and key head before rotary (Qwen3's q_norm, k_norm)

  // ---- Mixture-of-Experts (models/moe.h); n_experts 0: every block dense
  int64_t n_experts = 0;              // experts per MoE layer E (0: a dense model)
  int64_t top_k = 2;                  // experts per token k, 1 <= k <= E
  int64_t moe_every = 1;              // MoE in blocks i with i % moe_every == 0, dense MLP elsewhere
  double moe_capacity_factor = 1.25;  // capacity per expert and sequence: ceil(cf k T / E); 0: dropless
  double moe_aux_loss_coef = 0.01;    // weight of Switch's load-balancing loss, per MoE layer
  double moe_z_loss_coef = 0.001;     // weight of ST-MoE's router z-loss, per MoE layer

  // Vocabulary rounded up to a multiple of 128 (for GEMM efficiency, as llm.c does). Logits
  // past vocab_size exist but never enter the loss.
  int64_t padded_vocab_size() const { return (vocab_size + 127) / 128 * 128; }
  int64_t head_dim() const { return head_width > 0 ? head_width : d_model / n_head; }
  // The attention's width: the query heads' n_head x head_dim() (c_attn's q rows, c_proj's input).
  int64_t attn_width() const { return n_head * head_dim(); }
  // F: ffn_hidden, or by the feed-forward's rule when 0.
  int64_t mlp_hidden() const;
  bool rope() const { return position == "rope"; }
  bool swiglu() const { return mlp == "swiglu"; }
  bool rmsnorm() const { return norm == "rmsnorm"; }
  bool qkv_bias() const { return bias != "none"; }  // c_attn's
  bool linear_bias() const { return bias == "all"; }  // every other linear layer's
  // The position embedding's parameters (Td for learned positions, 0 under rope).
  int64_t position_params() const { return rope() ? 0 : seq_len * d_model; }
  // Whether attention reaches back less than the whole context (a window shorter than seq_len).
  bool windowed() const { return sliding_window > 0 && sliding_window < seq_len; }
  // Whether this is GPT-2's architecture (every field above at its default).
  bool gpt2_architecture() const;
  // The architecture fields in a run's config record (and so its checkpoints), by their record
  // names: position, rope_theta, rope_factor, rope_low_freq_factor, rope_high_freq_factor,
  // rope_original_context, norm, norm_eps, mlp, ffn_hidden (F itself), bias, tie_embeddings, and
  // head_dim, qk_norm and sliding_window where they differ from the defaults.
  // Written only for a model that is not GPT-2's (a GPT-2 record stays as it was); read back key by
  // key, an absent key leaving the field as it is (GPT-2's default).
  void put_architecture(nlohmann::json& record) const;
  void take_architecture(const nlohmann::json& record);
  bool is_moe() const { return n_experts > 0; }
  bool is_moe_layer(int64_t block) const { return is_moe() && block % moe_every == 0; }
  int64_t n_moe_layers() const { return is_moe() ? (n_layer + moe_every - 1) / moe_every : 0; }

  // Throws ConfigError naming the first field that does not fit.
  void validate() const;

  // All parameters (tied output layer counted once).
  int64_t num_params() const;
  // The parameters a token multiplies by: all less the position embedding and, when the output
  // layer is untied, the token embedding (a lookup); the N of the FLOP formula (models/flops.h).
  int64_t num_params_non_embedding_pos() const { return num_params() - non_matmul_embedding_params(); }
  // The parameters one token's forward uses: an MoE layer's k experts and its router, not all E
  // (equal to num_params() for a dense model).
  int64_t num_active_params() const;
  // The same less the embeddings that are lookups: the N_active of the FLOP formula.
  int64_t num_active_params_non_embedding_pos() const { return num_active_params() - non_matmul_embedding_params(); }
  // Position embedding, and the token embedding when an untied lm_head is the output layer.
  int64_t non_matmul_embedding_params() const {
    return position_params() + (tie_embeddings ? 0 : padded_vocab_size() * d_model);
  }

  // A preset by name: tiny, tiny-moe, gpt2-124m, gpt2-124m-moe, gpt2-350m, gpt2-774m, gpt2-1.5b,
  // gpt3-6.7b; tiny-llama, llama3-1b, llama3-8b, llama3-70b, mistral-7b, qwen2-0.5b, tiny-mixtral,
  // mixtral-8x7b, tiny-qwen3, qwen3-0.6b. Throws ConfigError.
  static GPTConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();
};

// Llama's feed-forward width: multiple_of * ceil(int(int(8d / 3) * multiplier) / multiple_of).
int64_t llama_ffn_hidden(int64_t d_model, double multiplier, int64_t multiple_of);

}  // namespace kiln
