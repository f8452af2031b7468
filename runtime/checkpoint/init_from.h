// runtime/checkpoint/init_from.h -- `kiln train --init-from DIR`: the model's shape from DIR's config.json,
// so that the run can start from DIR's weights (fine-tuning).
//
// DIR is a Hugging Face GPT-2 directory (`GPT2LMHeadModel.save_pretrained(DIR)`: config.json and
// model.safetensors), a Llama-family one (runtime/checkpoint/hf_llama.h: its config.json keys and
// weights, sharded or not) or a kiln checkpoint (a step_N directory, or a save directory whose `latest`
// names one). This file does the part that comes before the run exists: it reads config.json and
// sets TrainConfig's model shape from it, before the config is validated. The weights themselves
// are read later, on every layout, by the checkpoint loader's own path (runtime/checkpoint/checkpoint.h:
// load_weights): rank 0 reads one tensor at a time and every rank keeps its slice (tp shards, pp
// stages, ZeRO-3 shards). The optimizer starts fresh and the run starts at step 0.
//
// From config.json (GPT2Config's keys; a key that is absent takes GPT2Config's default):
//   n_layer, n_head, n_embd, vocab_size   -> n_layer, n_head (= n_kv_head), d_model, vocab_size
//   n_positions                           -> seq_len, unless --seq-len is given: a smaller one
//                                            uses the first seq_len rows of wpe (nanoGPT's
//                                            crop_block_size); a larger one is refused
//   resid_pdrop, embd_pdrop, attn_pdrop   -> dropout, unless --dropout is given (it wins); kiln has
//                                            one dropout, so the three must then be equal
//   layer_norm_epsilon                    must be 1e-5: kiln's LayerNorm eps, which kiln's
//                                            checkpoints, resume and eval assume (no flag sets it)
//   activation_function                   gelu_new or gelu_pytorch_tanh (GELU, tanh approximation)
//   n_inner                               null or 4 n_embd
//   model_type "gpt2"; architectures (if given) GPT2LMHeadModel or GPT2Model;
//   tie_word_embeddings, scale_attn_weights true; scale_attn_by_inverse_layer_idx,
//   reorder_and_upcast_attn, add_cross_attention false
// Anything else in the list is refused with one line naming the key. Keys that do not change the
// forward pass (initializer_range, bos/eos ids, use_cache, summary_*, dtype...) are ignored.
// A kiln checkpoint of a grouped-query model has no config.json: its trainer_state.json's model
// shape and recorded dropout are used instead.
//
// Shape settings given by flags or --config (--model, --n-layer, --n-head, --n-kv-head,
// --d-model, --vocab-size) must agree with config.json: a contradiction is refused naming both.
//
// --resume: when --save-dir already holds a checkpoint, the run resumes it and --init-from is not
// used (it seeds only a fresh run); the console says so. The shape still comes from DIR, so a
// resumed run checks the checkpoint against it.
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/trainer/train_config.h"

namespace kiln {

// When config.init_from is set: resolves it (a save directory to its latest checkpoint), reads
// and checks its config.json, and sets config.gpt's shape and dropout from it. `given` holds the
// settings the command line and --config gave, by flag name ("n-layer", "seq-len", "dropout",
// "model", ...). Throws ConfigError with one line "<flag> DIR: <problem>". Does nothing when
// config.init_from is empty. `flag`: how the command names the directory (--init-from; kiln eval's
// and kiln sample's --checkpoint, which read a Hugging Face directory this way too).
void apply_init_from(const std::map<std::string, nlohmann::json>& given, TrainConfig& config,
                     const std::string& flag = "--init-from");

}  // namespace kiln
