// models/gpt_config.h -- the shape of a GPT model, its presets, and its sizes.
//
// GPT-2 architecture (Radford et al., 2019): learned position embeddings, pre-LayerNorm blocks,
// GELU (tanh approximation), biases everywhere, output layer tied to the token embedding.
// Grouped-query attention (Ainslie et al., 2023) through n_kv_head: n_head query heads share
// n_kv_head key/value heads (n_kv_head == n_head is ordinary multi-head attention, 1 is
// multi-query attention).
//
// Parameter count, with d = d_model, L = n_layer, V' = padded vocabulary, T = seq_len,
// h = d / n_head, kv = n_kv_head * h, F = 4d:
//   embeddings  V'd + Td
//   per block   2d (ln_1) + d(d + 2kv) + (d + 2kv) (c_attn) + d^2 + d (attn c_proj)
//               + 2d (ln_2) + dF + F (c_fc) + Fd + d (mlp c_proj)
//   final norm  2d
// gpt2-124m (V' = 50304) gives 124,475,904.
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

namespace kiln {

struct GPTConfig {
  int64_t n_layer = 4;         // transformer blocks
  int64_t n_head = 4;          // query heads
  int64_t n_kv_head = 4;       // key/value heads (divides n_head; 1 = multi-query)
  int64_t d_model = 128;       // residual stream width
  int64_t seq_len = 128;       // context length T (positions learned)
  int64_t vocab_size = 512;    // real vocabulary; token ids are in [0, vocab_size)
  double dropout = 0.0;        // dropout on attention probabilities and residual branches
  double layer_norm_eps = 1e-5;

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
  int64_t head_dim() const { return d_model / n_head; }
  int64_t mlp_hidden() const { return 4 * d_model; }
  bool is_moe() const { return n_experts > 0; }
  bool is_moe_layer(int64_t block) const { return is_moe() && block % moe_every == 0; }
  int64_t n_moe_layers() const { return is_moe() ? (n_layer + moe_every - 1) / moe_every : 0; }

  // Throws ConfigError naming the first field that does not fit.
  void validate() const;

  // All parameters (tied output layer counted once).
  int64_t num_params() const;
  // Parameters less the position embedding: the N of the FLOP formula (see models/flops.h).
  int64_t num_params_non_embedding_pos() const { return num_params() - seq_len * d_model; }
  // The parameters one token's forward uses: an MoE layer's k experts and its router, not all E
  // (equal to num_params() for a dense model).
  int64_t num_active_params() const;
  // The same less the position embedding: the N_active of the FLOP formula.
  int64_t num_active_params_non_embedding_pos() const { return num_active_params() - seq_len * d_model; }

  // A preset by name: tiny, tiny-moe, gpt2-124m, gpt2-124m-moe, gpt2-350m, gpt2-774m, gpt2-1.5b,
  // gpt3-6.7b. Throws ConfigError.
  static GPTConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();
};

}  // namespace kiln
