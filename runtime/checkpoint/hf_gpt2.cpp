// runtime/checkpoint/hf_gpt2.cpp -- the kiln <-> GPT2LMHeadModel weight mapping and config.json.
#include "runtime/checkpoint/hf_gpt2.h"

#include <algorithm>
#include <set>
#include <vector>

#include <ATen/ATen.h>

#include "distributed/error.h"

namespace kiln {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

// How one kiln parameter is stored in the HF file.
struct HfSlot {
  std::string hf_name;
  bool transposed;  // Linear [out, in] <-> Conv1D [in, out]
  bool vocab_rows;  // wte: only the first vocab_size rows are stored
};

HfSlot hf_slot(const std::string& kiln_name) {
  if (kiln_name == "wte") return {"transformer.wte.weight", false, true};
  if (kiln_name == "wpe") return {"transformer.wpe.weight", false, false};
  const bool linear = ends_with(kiln_name, ".c_attn.weight") || ends_with(kiln_name, ".c_proj.weight") ||
                      ends_with(kiln_name, ".c_fc.weight");
  return {"transformer." + kiln_name, linear, false};
}

// The HF shape of a kiln parameter of shape `s`.
std::vector<int64_t> hf_shape(const HfSlot& slot, at::IntArrayRef s, const GPTConfig& cfg) {
  std::vector<int64_t> out(s.begin(), s.end());
  if (slot.transposed) std::swap(out[0], out[1]);
  if (slot.vocab_rows) out[0] = cfg.vocab_size;
  return out;
}

// A kiln parameter as the HF tensor: fp32, CPU, contiguous, a copy.
at::Tensor to_hf_tensor(const HfSlot& slot, const at::Tensor& p, const GPTConfig& cfg) {
  at::Tensor t = p.detach();
  if (slot.vocab_rows) t = t.narrow(0, 0, cfg.vocab_size);
  if (slot.transposed) t = t.t();
  at::Tensor out = at::empty(t.sizes(), at::TensorOptions().dtype(at::kFloat));
  out.copy_(t);
  return out;
}

// "transformer.h.N.attn.bias" / ".attn.masked_bias": old GPT-2 files' causal-mask buffers.
bool is_mask_buffer(const std::string& name) {
  return starts_with(name, "transformer.h.") && (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias"));
}

}  // namespace

NamedTensors to_hf_gpt2(const GPT& model) {
  NamedTensors out;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const HfSlot slot = hf_slot(item.key());
    out.emplace_back(slot.hf_name, to_hf_tensor(slot, item.value(), model.config()));
  }
  return out;
}

NamedTensors to_hf_gpt2(const GPTConfig& cfg, const std::map<std::string, at::Tensor>& kiln_params) {
  // A model on the meta device gives the names and shapes without allocating anything.
  GPT shape_model(cfg, at::TensorOptions().device(at::kMeta));
  NamedTensors out;
  std::set<std::string> seen;
  for (const auto& item : shape_model.named_parameters(/*recurse=*/true)) {
    auto it = kiln_params.find(item.key());
    if (it == kiln_params.end()) throw ConfigError("kiln parameters lack '" + item.key() + "'");
    if (it->second.sizes() != item.value().sizes()) {
      throw ConfigError("kiln parameter '" + item.key() + "' has shape " + shape_text(it->second.sizes().vec()) +
                        ", the model config gives " + shape_text(item.value().sizes().vec()));
    }
    const HfSlot slot = hf_slot(item.key());
    out.emplace_back(slot.hf_name, to_hf_tensor(slot, it->second, cfg));
    seen.insert(item.key());
  }
  for (const auto& kv : kiln_params) {
    if (!seen.count(kv.first)) throw ConfigError("kiln parameter '" + kv.first + "' is not part of the model config");
  }
  return out;
}

std::string hf_name_of(const std::string& kiln_name) { return hf_slot(kiln_name).hf_name; }

bool hf_rows_of_kiln(const std::string& kiln_name) { return !hf_slot(kiln_name).transposed; }

std::vector<int64_t> hf_shape_of(const std::string& kiln_name, at::IntArrayRef kiln_shape, const GPTConfig& cfg) {
  return hf_shape(hf_slot(kiln_name), kiln_shape, cfg);
}

at::Tensor to_hf_layout(const std::string& kiln_name, const at::Tensor& t, const GPTConfig& cfg) {
  const HfSlot slot = hf_slot(kiln_name);
  at::Tensor out = t.detach();
  if (slot.vocab_rows) out = out.narrow(0, 0, cfg.vocab_size);
  if (slot.transposed) out = out.t();
  return out.scalar_type() == at::kFloat ? out : out.to(at::kFloat);
}

at::Tensor from_hf_layout(const std::string& kiln_name, const at::Tensor& hf, const GPTConfig& cfg) {
  const HfSlot slot = hf_slot(kiln_name);
  at::Tensor src = slot.transposed ? hf.t() : hf;
  std::vector<int64_t> shape = src.sizes().vec();
  if (slot.vocab_rows) shape[0] = cfg.padded_vocab_size();
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(at::kFloat));
  if (slot.vocab_rows) {
    out.narrow(0, 0, cfg.vocab_size).copy_(src);
    out.narrow(0, cfg.vocab_size, shape[0] - cfg.vocab_size).zero_();
  } else {
    out.copy_(src);
  }
  return out;
}

std::map<std::string, std::string> match_hf_gpt2(const GPTConfig& cfg, const std::vector<TensorSpec>& file,
                                                 const std::function<at::Tensor(const std::string&)>& read) {
  // The HF names of a GPT2Model file ("wte.weight") gain GPT2LMHeadModel's "transformer." prefix.
  bool prefixed = false, bare_wte = false;
  for (const auto& t : file) {
    prefixed = prefixed || starts_with(t.name, "transformer.");
    bare_wte = bare_wte || t.name == "wte.weight";
  }
  const bool add_prefix = !prefixed && bare_wte;
  std::map<std::string, const TensorSpec*> tensors;  // canonical (prefixed) name -> file tensor
  for (const auto& t : file) tensors[add_prefix && t.name != "lm_head.weight" ? "transformer." + t.name : t.name] = &t;
  auto file_name = [&](const std::string& canonical) {
    return add_prefix && canonical != "lm_head.weight" ? canonical.substr(std::string("transformer.").size()) : canonical;
  };

  // Every parameter, in the model's order, so the first missing one is the first reported. A
  // model on the meta device gives the names and shapes without allocating anything.
  GPT shape_model(cfg, at::TensorOptions().device(at::kMeta));
  std::map<std::string, std::string> out;
  std::set<std::string> expected;
  std::vector<std::string> missing;
  for (const auto& item : shape_model.named_parameters(/*recurse=*/true)) {
    const HfSlot slot = hf_slot(item.key());
    expected.insert(slot.hf_name);
    auto it = tensors.find(slot.hf_name);
    if (it == tensors.end()) {
      missing.push_back(slot.hf_name);
      continue;
    }
    const auto want = hf_shape(slot, item.value().sizes(), cfg);
    if (it->second->shape != want) {
      throw ConfigError("checkpoint tensor '" + slot.hf_name + "' has shape " + shape_text(it->second->shape) +
                        ", this model expects " + shape_text(want));
    }
    if (!at::isFloatingType(it->second->dtype)) {
      throw ConfigError("checkpoint tensor '" + slot.hf_name + "' has dtype " + std::string(c10::toString(it->second->dtype)) +
                        ", not a floating-point type");
    }
    out[item.key()] = it->second->name;
  }
  if (!missing.empty()) {
    std::string more = missing.size() > 1 ? " (and " + std::to_string(missing.size() - 1) + " more)" : "";
    throw ConfigError("checkpoint has no tensor '" + missing.front() + "'" + more);
  }
  for (const auto& [name, t] : tensors) {
    if (expected.count(name) || is_mask_buffer(name)) continue;
    if (name == "lm_head.weight") {
      const at::Tensor head = read(t->name), wte = read(file_name("transformer.wte.weight"));
      if (head.sizes() == wte.sizes() && at::equal(head.to(at::kFloat), wte.to(at::kFloat))) continue;
      throw ConfigError("checkpoint tensor 'lm_head.weight' differs from 'transformer.wte.weight'; kiln ties the "
                        "output layer to the token embedding and cannot load an untied one");
    }
    throw ConfigError("checkpoint has tensor '" + name + "' that this model does not have (" +
                      std::to_string(cfg.n_layer) + " layers); is it from another model?");
  }
  return out;
}

void load_hf_gpt2(GPT& model, const std::map<std::string, at::Tensor>& given) {
  std::vector<TensorSpec> specs;
  for (const auto& [name, t] : given) specs.push_back({name, t.scalar_type(), t.sizes().vec()});
  const auto names = match_hf_gpt2(model.config(), specs, [&](const std::string& name) { return given.at(name); });
  // Everything checked before anything is copied: on a throw the model is unchanged.
  at::NoGradGuard no_grad;
  for (auto& item : model.named_parameters(/*recurse=*/true)) {
    item.value().copy_(from_hf_layout(item.key(), given.at(names.at(item.key())), model.config()));
  }
}

std::map<std::string, std::string> hf_safetensors_metadata() { return {{"format", "pt"}}; }

bool hf_gpt2_compatible(const GPTConfig& cfg) {
  return cfg.n_kv_head == cfg.n_head && !cfg.is_moe() && cfg.gpt2_architecture();
}

nlohmann::json hf_gpt2_config(const GPTConfig& cfg, int64_t eot, const std::string& prefix) {
  if (cfg.is_moe()) {
    throw ConfigError("GPT2LMHeadModel has no Mixture-of-Experts layers (" + std::to_string(cfg.n_experts) +
                      " experts): no config.json for this model (its checkpoint holds the experts under kiln's names)");
  }
  if (!cfg.gpt2_architecture()) {
    throw ConfigError("GPT2LMHeadModel is not the Llama family's architecture (position " + cfg.position + ", norm " + cfg.norm +
                      ", mlp " + cfg.mlp + ", bias " + cfg.bias + "): no config.json for this model");
  }
  if (!hf_gpt2_compatible(cfg)) {
    throw ConfigError("GPT2LMHeadModel has no grouped-query attention (n_kv_head " + std::to_string(cfg.n_kv_head) +
                      " != n_head " + std::to_string(cfg.n_head) + "): no config.json for this model");
  }
  const int64_t eos = eot >= 0 ? eot : cfg.vocab_size - 1;
  return nlohmann::json{
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", cfg.vocab_size},
      {"n_positions", cfg.seq_len},
      {"n_ctx", cfg.seq_len},
      {"n_embd", cfg.d_model},
      {"n_layer", cfg.n_layer},
      {"n_head", cfg.n_head},
      {"n_inner", cfg.mlp_hidden()},
      {"activation_function", "gelu_new"},
      {"layer_norm_epsilon", cfg.layer_norm_eps},
      {"resid_pdrop", cfg.dropout},
      {"embd_pdrop", cfg.dropout},
      {"attn_pdrop", cfg.dropout},
      {"initializer_range", 0.02},
      {"scale_attn_weights", true},
      {"scale_attn_by_inverse_layer_idx", false},
      {"reorder_and_upcast_attn", false},
      {"tie_word_embeddings", true},
      {"use_cache", true},
      {"bos_token_id", eos},
      {"eos_token_id", eos},
      // transformers' text-generation pipeline puts config.prefix before the prompt: the context
      // kiln sample gives the model (end-of-text, then the prompt), so the two continue alike.
      {"prefix", prefix.empty() ? nlohmann::json(nullptr) : nlohmann::json(prefix)},
      {"torch_dtype", "float32"},
      {"dtype", "float32"},
  };
}

int64_t hf_max_new_tokens(const GPTConfig& cfg) { return std::min<int64_t>(256, std::max<int64_t>(1, cfg.seq_len / 4)); }

nlohmann::json hf_generation_config(const GPTConfig& cfg, int64_t eot) {
  const int64_t eos = eot >= 0 ? eot : cfg.vocab_size - 1;
  return nlohmann::json{{"bos_token_id", eos}, {"eos_token_id", eos}, {"pad_token_id", eos}, {"max_new_tokens", hf_max_new_tokens(cfg)}};
}

}  // namespace kiln
