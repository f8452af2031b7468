// runtime/checkpoint/hf_llama.h -- Hugging Face Llama-family directories (LlamaForCausalLM,
// MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM) as kiln models: their config.json as a GPTConfig, and
// their weights, one kiln parameter at a time (`kiln train --init-from DIR`, `kiln eval
// --checkpoint DIR`; docs/models.md); and kiln's own checkpoints of the family written in the
// same layout (runtime/checkpoint/checkpoint.cpp), so that from_pretrained loads them.
//
// config.json (transformers 4.x or 5.x keys) -> GPTConfig:
//   model_type llama | mistral | qwen2 | qwen3 | mixtral; architectures, if given, the matching *ForCausalLM
//   qwen3: head_dim kept as given (GPTConfig::head_width, where it is not hidden_size / heads),
//          q_norm / k_norm per block (qk_norm), no biases (attention_bias true is refused)
//   mixtral: num_local_experts, num_experts_per_tok, router_aux_loss_coef -> a dropless MoE of
//            SwiGLU experts in every block (router_jitter_noise must be 0)
//   num_hidden_layers, num_attention_heads, num_key_value_heads (default: the heads),
//   hidden_size, intermediate_size, vocab_size    -> n_layer, n_head, n_kv_head, d_model,
//                                                    ffn_hidden, vocab_size
//   max_position_embeddings                       -> seq_len, unless --seq-len gives a shorter one
//   rms_norm_eps                                  -> norm_eps
//   rope_theta (4.x) or rope_parameters.rope_theta (5.x)
//   rope_scaling (4.x) / rope_parameters (5.x): rope_type "default" (or absent) or "llama3"
//                                                    (factor, low_freq_factor, high_freq_factor,
//                                                    original_max_position_embeddings)
//   tie_word_embeddings (default false)           -> tie_embeddings
//   the bias pattern: llama attention_bias / mlp_bias false -> none; both true -> all;
//                     qwen2 -> qkv (its q, k, v projections carry biases)
//   hidden_act "silu"; head_dim, if given: the heads' width (Qwen3's differs from hidden_size / heads)
//   attention_dropout                             -> dropout (unless --dropout)
//   mistral, mixtral: sliding_window (null: none)    -> sliding_window (it acts where the context exceeds it)
// Refused with one line naming the key and its value: another model_type, a rope type kiln does not implement (linear, dynamic, yarn, longrope...), another hidden_act,
// a bias pattern kiln has not built (attention biases without MLP ones), Qwen's per-layer
// sliding window (use_sliding_window true).
//
// Weights: model.safetensors, or the shards model.safetensors.index.json's weight_map lists (what
// save_pretrained writes above its shard size). Each kiln parameter is made of the tensors
// hf_llama_sources names, their rows concatenated (docs/models.md has the table): c_attn from
// q_proj, k_proj, v_proj; mlp.c_fc from gate_proj and up_proj; wte / lm_head padded to the
// padded vocabulary with zero rows. Read one parameter at a time by rank 0, as kiln's own
// checkpoints are. Every tensor of the files must be used (rotary inv_freq buffers aside), and
// each one's shape is checked before anything is allocated.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/gpt_config.h"
#include "runtime/checkpoint/safetensors.h"

namespace kiln {

class NonFiniteTensors;  // runtime/checkpoint/finite_check.h

// Whether config.json's model_type is one of the family's (llama, mistral, qwen2, qwen3) -- or mixtral,
// which hf_llama_config refuses with its own line.
bool is_hf_llama_family(const nlohmann::json& config);

// The model of config.json, checked (above). `where` starts every error line; *dropout is
// attention_dropout.
GPTConfig hf_llama_config(const nlohmann::json& config, const std::string& where, double* dropout);

// For each kiln parameter of a model of shape cfg, the Hugging Face tensors it is made of, in row
// order.
std::map<std::string, std::vector<std::string>> hf_llama_sources(const GPTConfig& cfg);

// A directory's safetensors, one file or the shards of its index, read one tensor at a time.
class HfWeightFiles {
 public:
  // Throws ConfigError / DataError naming the file for a missing or malformed one.
  explicit HfWeightFiles(const std::string& dir);
  std::vector<TensorSpec> specs() const;
  bool contains(const std::string& name) const { return where_.count(name) > 0; }
  const TensorSpec& spec(const std::string& name) const;
  at::Tensor read(const std::string& name) const;
  // The name (within the directory) of the file that holds tensor `name`.
  std::string file_of(const std::string& name) const;
  int64_t bytes() const { return bytes_; }

 private:
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::map<std::string, const SafetensorsReader*> where_;
  int64_t bytes_ = 0;
};

// Checks the files' tensors against a model of shape cfg: every source there with the shape it
// must have (floating dtype), and no tensor left unused. Throws ConfigError naming the first
// missing, misshapen or unexpected tensor.
void match_hf_llama(const GPTConfig& cfg, const HfWeightFiles& files);

// Kiln parameter `kiln_name` (whole, `shape`) from its sources: fp32, rows concatenated, the
// vocabulary's padding rows zero. Each source that is not finite is noted in `bad`
// (runtime/checkpoint/finite_check.h).
at::Tensor read_hf_llama(const HfWeightFiles& files, const std::string& kiln_name, const std::vector<std::string>& sources,
                         const std::vector<int64_t>& shape, NonFiniteTensors& bad);

// ---- out: kiln's checkpoints of the family, in the same layout (runtime/checkpoint/checkpoint.h)
// One Hugging Face tensor of a kiln parameter: its name and shape, and the rows [row, row + rows)
// of the whole kiln parameter it holds (the vocabulary's padding rows are in none).
struct HfPiece {
  std::string name;
  std::vector<int64_t> shape;
  int64_t row = 0;
};
std::vector<HfPiece> hf_llama_pieces(const GPTConfig& cfg, const std::string& kiln_name);
// The kiln tensor as the rows its pieces index: itself, or an MoE expert tensor [E, R, C] as [E R, C].
at::Tensor hf_rows_view(const at::Tensor& whole);

// The config.json transformers loads a kiln model of the family with: Qwen2ForCausalLM for the
// q/k/v-bias pattern, LlamaForCausalLM otherwise (Mistral's architecture is Llama's without a
// sliding window); the shape, rms_norm_eps, the rotary settings under both transformers 5.x's key
// (rope_parameters) and 4.x's (rope_theta, rope_scaling), tie_word_embeddings, the biases, bos =
// `eot` (the token that opens documents; -1: none) and eos = `ends` (the ids kiln sample ends at:
// Llama 3's <|end_of_text|> and <|eot_id|>, a list where there are several; empty: eot), dtype
// float32, and "prefix": `prefix` (null when empty): the document token as text
// (Tokenizer::eot_text: Llama 3's "<|begin_of_text|>"), which transformers' text-generation
// pipeline puts before every prompt, as kiln sample does (hf_gpt2_config's, for the family).
nlohmann::json hf_llama_config_json(const GPTConfig& cfg, int64_t eot, const std::vector<int64_t>& ends = {},
                                    const std::string& prefix = "");
// Its generation_config.json: bos, eos (as config.json's), pad = bos, and max_new_tokens
// (runtime/checkpoint/hf_gpt2.h: hf_max_new_tokens).
nlohmann::json hf_llama_generation_config(const GPTConfig& cfg, int64_t eot, const std::vector<int64_t>& ends = {});

// Tensors of these byte sizes (in order) into shards as save_pretrained makes them: a new shard
// when the next tensor would take the current one past max_bytes (a tensor larger than that has a
// shard of its own). Returns each tensor's shard index (0-based).
std::vector<int> hf_shard_of(const std::vector<int64_t>& bytes, int64_t max_bytes);
// "model-00002-of-00005.safetensors" (shard 1 of 5).
std::string hf_shard_name(int shard, int shards);

}  // namespace kiln
