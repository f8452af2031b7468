// runtime/checkpoint/hf_gpt2.h -- kiln's GPT weights in Hugging Face transformers' GPT2LMHeadModel layout.
//
// A checkpoint's model.safetensors holds the weights under the names and layout that
// `GPT2LMHeadModel.from_pretrained(dir)` loads, beside a config.json from hf_gpt2_config().
// The mapping, for every block N (d = d_model, V = vocab_size, V' = padded vocabulary):
//
//   kiln parameter            [shape]          HF tensor                                  [shape]
//   wte                       [V', d]          transformer.wte.weight                     [V, d]  (first V rows)
//   wpe                       [T, d]           transformer.wpe.weight                     [T, d]
//   h.N.ln_1.{weight,bias}    [d]              transformer.h.N.ln_1.{weight,bias}         [d]
//   h.N.attn.c_attn.weight    [d + 2kv, d]     transformer.h.N.attn.c_attn.weight         [d, d + 2kv]  (transposed)
//   h.N.attn.c_attn.bias      [d + 2kv]        transformer.h.N.attn.c_attn.bias           [d + 2kv]
//   h.N.attn.c_proj.weight    [d, d]           transformer.h.N.attn.c_proj.weight         [d, d]        (transposed)
//   h.N.ln_2.*, h.N.mlp.c_fc.*, h.N.mlp.c_proj.*   likewise (c_fc [d, 4d], mlp.c_proj [4d, d] in HF)
//   ln_f.{weight,bias}        [d]              transformer.ln_f.{weight,bias}             [d]
//
// HF's Conv1D computes y = x W + b with W [in, out]; kiln's Linear y = x W^T + b with W [out, in]:
// the same numbers, transposed. c_attn's output is [q | k | v], heads in contiguous slices of
// head_dim, in both. The output layer lm_head.weight is tied to transformer.wte.weight
// (tie_word_embeddings) and is not stored: transformers re-ties it when the file lacks it, as
// save_pretrained() itself writes GPT-2. The vocabulary padding rows of wte (V..V') are not
// stored; kiln keeps them zero, and loading sets them to zero.
//
// MoE models' expert tensors keep kiln's names and layout ("transformer.h.N.moe.fc_w" [E, F, d],
// not transposed); GPT2LMHeadModel has no such layer, and hf_gpt2_config() refuses them.
// Grouped-query models (n_kv_head != n_head) have no GPT2LMHeadModel equivalent: their weights
// map to the same names (c_attn is then [d, d + 2kv]), but hf_gpt2_config() refuses them.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/gpt.h"
#include "runtime/checkpoint/safetensors.h"

namespace kiln {

// The model's current weights under HF names and layout: fp32, CPU, contiguous, in kiln's
// parameter order. The tensors are copies (they never alias the model's parameters), so the
// model may keep training while they are written. The model may live on any device.
NamedTensors to_hf_gpt2(const GPT& model);

// The same from kiln parameter names (GPT::named_parameters(): "wte", "h.0.ln_1.weight", ...)
// for a model of shape `cfg`, e.g. parameters gathered from shards. Throws ConfigError naming a
// missing parameter or one whose shape does not match `cfg`.
NamedTensors to_hf_gpt2(const GPTConfig& cfg, const std::map<std::string, at::Tensor>& kiln_params);

// One parameter at a time (a checkpoint streamed tensor by tensor). kiln_name: a whole-model
// parameter name ("wte", "h.3.mlp.c_fc.weight"); t: that whole parameter in kiln's layout.
std::string hf_name_of(const std::string& kiln_name);
std::vector<int64_t> hf_shape_of(const std::string& kiln_name, at::IntArrayRef kiln_shape, const GPTConfig& cfg);
// Whether the HF tensor is the kiln tensor itself, or its first rows (wte): not transposed.
bool hf_rows_of_kiln(const std::string& kiln_name);
// t as the HF file stores it (a view: rows cut, or transposed; the writer makes it contiguous).
at::Tensor to_hf_layout(const std::string& kiln_name, const at::Tensor& t, const GPTConfig& cfg);
// An HF tensor in kiln's layout, fp32 (vocabulary padding rows zero): a new tensor.
at::Tensor from_hf_layout(const std::string& kiln_name, const at::Tensor& hf, const GPTConfig& cfg);

// Checks a file's tensors (names, dtypes, shapes) against a model of shape `cfg` as load_hf_gpt2
// does, without their data except an "lm_head.weight" (compared with the embedding through
// `read`, which reads a tensor of the file by name). Returns, for each kiln parameter name, the
// name of its tensor in the file ("transformer." prefix or not). Throws the same ConfigErrors.
std::map<std::string, std::string> match_hf_gpt2(const GPTConfig& cfg, const std::vector<TensorSpec>& file,
                                                 const std::function<at::Tensor(const std::string&)>& read);

// Copies HF-layout tensors into the model's parameters (on the model's device; vocabulary padding
// rows set to zero), converting floating dtypes to the parameter's. Names may carry the
// "transformer." prefix (GPT2LMHeadModel) or not (GPT2Model, as openai-community/gpt2's files);
// "lm_head.weight" is accepted only when it equals transformer.wte.weight (tied), and the causal
// mask buffers "h.N.attn.bias" / "h.N.attn.masked_bias" of old GPT-2 files are ignored, as
// transformers ignores them. Throws ConfigError naming the first missing tensor, a tensor whose
// shape differs ("checkpoint tensor 'transformer.h.3.mlp.c_fc.weight' has shape [128, 512], this
// model expects [128, 384]"), a non-floating tensor, or the first unexpected extra tensor. Checks
// everything before it copies anything: on a throw the model is unchanged.
void load_hf_gpt2(GPT& model, const std::map<std::string, at::Tensor>& tensors);

// The safetensors metadata to write with these tensors: {"format": "pt"}. transformers 4.x refuses a
// safetensors file whose metadata lacks "format" (5.x no longer checks); more keys may be added.
std::map<std::string, std::string> hf_safetensors_metadata();

// Whether GPT2LMHeadModel can express the model (false for grouped-query attention).
bool hf_gpt2_compatible(const GPTConfig& cfg);

// The config.json that GPT2LMHeadModel needs for a model of shape `cfg`: model_type "gpt2",
// architectures, n_embd, n_layer, n_head, n_inner, n_positions = n_ctx = seq_len, vocab_size (the
// real vocabulary), layer_norm_epsilon, activation_function "gelu_new" (GELU, tanh approximation),
// resid/embd/attn_pdrop = dropout, tie_word_embeddings true, bos = eos = `eot` (the tokenizer's
// end-of-text id, which the checkpoint's tokenizer.json holds; -1: vocab_size - 1, which is 50256
// for GPT-2's vocabulary), torch_dtype / dtype float32, and "prefix": `prefix` (null when empty):
// with a tokenizer, its end-of-text token as text (Tokenizer::eot_text, "<|endoftext|>"), which
// transformers' text-generation pipeline puts before every prompt, as kiln sample puts eot. Throws
// ConfigError for a grouped-query model (see hf_gpt2_compatible), which GPT2LMHeadModel cannot load.
nlohmann::json hf_gpt2_config(const GPTConfig& cfg, int64_t eot = -1, const std::string& prefix = "");

// The new tokens generate() and the pipeline make when the call gives no length: a quarter of the
// context, at most 256 (the pipeline's own default). transformers' defaults (256 new tokens) ran
// past a small model's positions (IndexError); a total max_length bounded them, but made every
// call that gives max_new_tokens warn that both are set: max_new_tokens does not. A prompt of up
// to three quarters of the context, prefix included, stays within it.
int64_t hf_max_new_tokens(const GPTConfig& cfg);

// generation_config.json beside it: bos = eos = pad = the end-of-text id, and max_new_tokens
// (hf_max_new_tokens).
nlohmann::json hf_generation_config(const GPTConfig& cfg, int64_t eot = -1);

}  // namespace kiln
