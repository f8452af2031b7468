// runtime/checkpoint/hf_llama.cpp -- Llama-family config.json and weights (the rules in the header).
#include "runtime/checkpoint/hf_llama.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "distributed/error.h"
#include "runtime/checkpoint/hf_gpt2.h"  // hf_max_new_tokens
#include "runtime/checkpoint/finite_check.h"

namespace kiln {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::map<std::string, std::string>& architectures() {
  static const std::map<std::string, std::string> a = {{"llama", "LlamaForCausalLM"},
                                                       {"mistral", "MistralForCausalLM"},
                                                       {"qwen2", "Qwen2ForCausalLM"},
                                                       {"qwen3", "Qwen3ForCausalLM"},
                                                       {"mixtral", "MixtralForCausalLM"}};
  return a;
}

int64_t positive(const json& c, const char* key, const std::string& where) {
  if (!c.contains(key) || !c.at(key).is_number_integer() || c.at(key).get<int64_t>() <= 0) {
    throw ConfigError(where + ": config.json's '" + key + "' must be a positive integer (got " +
                      (c.contains(key) ? c.at(key).dump() : std::string("nothing")) + ")");
  }
  return c.at(key).get<int64_t>();
}

double number(const json& c, const char* key, double fallback, const std::string& where) {
  if (!c.contains(key) || c.at(key).is_null()) return fallback;
  if (!c.at(key).is_number()) throw ConfigError(where + ": config.json's '" + key + "' must be a number (got " + c.at(key).dump() + ")");
  return c.at(key).get<double>();
}

bool flag(const json& c, const char* key, bool fallback, const std::string& where) {
  if (!c.contains(key) || c.at(key).is_null()) return fallback;
  if (!c.at(key).is_boolean()) throw ConfigError(where + ": config.json's '" + key + "' must be true or false (got " + c.at(key).dump() + ")");
  return c.at(key).get<bool>();
}

// The rotary settings: 5.x's rope_parameters, or 4.x's rope_theta and rope_scaling.
void read_rope(const json& c, GPTConfig& g, const std::string& where) {
  json rope = c.contains("rope_parameters") && c.at("rope_parameters").is_object() ? c.at("rope_parameters") : json::object();
  const char* key = "rope_parameters";
  if (!c.contains("rope_parameters")) {
    key = "rope_scaling";
    if (c.contains("rope_scaling") && c.at("rope_scaling").is_object()) rope = c.at("rope_scaling");
    else if (c.contains("rope_scaling") && !c.at("rope_scaling").is_null())
      throw ConfigError(where + ": config.json's 'rope_scaling' must be an object or null (got " + c.at("rope_scaling").dump() + ")");
  }
  g.rope_theta = number(rope, "rope_theta", number(c, "rope_theta", 10000.0, where), where);
  const json type = rope.contains("rope_type") ? rope.at("rope_type") : rope.value("type", json("default"));
  if (type == "default") return;
  if (type != "llama3") {
    throw ConfigError(where + ": config.json's '" + key + "' has rope_type " + type.dump() +
                      "; kiln implements \"default\" and \"llama3\" (Llama-3.1's scaling) only");
  }
  g.rope_factor = number(rope, "factor", 0.0, where);
  g.rope_low_freq_factor = number(rope, "low_freq_factor", 1.0, where);
  g.rope_high_freq_factor = number(rope, "high_freq_factor", 4.0, where);
  g.rope_original_context = positive(rope, "original_max_position_embeddings", where + " (" + key + ")");
}

}  // namespace

bool is_hf_llama_family(const json& config) {
  if (!config.is_object() || !config.contains("model_type")) return false;
  const json& t = config.at("model_type");
  return t == "llama" || t == "mistral" || t == "qwen2" || t == "qwen3" || t == "mixtral";
}

GPTConfig hf_llama_config(const json& c, const std::string& where, double* dropout) {
  const std::string type = c.value("model_type", std::string());
  const auto arch = architectures().find(type);
  if (arch == architectures().end()) {
    throw ConfigError(where + ": config.json's 'model_type' is \"" + type + "\", not llama, mistral, qwen2, qwen3 or mixtral");
  }
  if (c.contains("architectures") && c.at("architectures").is_array()) {
    for (const auto& a : c.at("architectures")) {
      if (a != arch->second) {
        throw ConfigError(where + ": config.json's 'architectures' names " + a.dump() + "; kiln reads " + arch->second + " weights");
      }
    }
  }
  GPTConfig g;
  g.position = "rope";
  g.norm = "rmsnorm";
  g.mlp = "swiglu";
  g.n_layer = positive(c, "num_hidden_layers", where);
  g.n_head = positive(c, "num_attention_heads", where);
  g.n_kv_head = c.contains("num_key_value_heads") && !c.at("num_key_value_heads").is_null()
                    ? positive(c, "num_key_value_heads", where)
                    : g.n_head;
  g.d_model = positive(c, "hidden_size", where);
  g.ffn_hidden = positive(c, "intermediate_size", where);
  g.vocab_size = positive(c, "vocab_size", where);
  g.seq_len = positive(c, "max_position_embeddings", where);
  g.layer_norm_eps = number(c, "rms_norm_eps", 1e-6, where);
  g.tie_embeddings = flag(c, "tie_word_embeddings", false, where);
  read_rope(c, g, where);
  const std::string act = c.value("hidden_act", std::string("silu"));
  if (act != "silu") {
    throw ConfigError(where + ": config.json's 'hidden_act' is \"" + act + "\"; kiln's SwiGLU uses silu");
  }
  // head_dim: the heads' width where it is not hidden_size / num_attention_heads (Qwen3's: 128 at
  // hidden_size 1024 and 16 heads); then kept as given (GPTConfig::head_width).
  if (c.contains("head_dim") && !c.at("head_dim").is_null()) {
    const int64_t h = positive(c, "head_dim", where);
    if (g.d_model % g.n_head != 0 || h != g.d_model / g.n_head) g.head_width = h;
  }
  if (type == "qwen3") g.qk_norm = true;  // Qwen3's q_norm and k_norm
  if (type == "qwen2") {
    g.bias = "qkv";
  } else if (type == "qwen3" && flag(c, "attention_bias", false, where)) {
    throw ConfigError(where + ": config.json's 'attention_bias' is true; kiln's Qwen3 blocks have no biases (Qwen3's own are false)");
  } else if (type == "qwen3") {
    g.bias = "none";
  } else {
    const bool attn = flag(c, "attention_bias", false, where), mlp = flag(c, "mlp_bias", false, where);
    if (attn != mlp) {
      throw ConfigError(where + ": config.json's 'attention_bias' is " + json(attn).dump() + " and 'mlp_bias' " + json(mlp).dump() +
                        "; kiln has biases on every linear layer, none, or the query/key/value ones only");
    }
    g.bias = attn ? "all" : "none";
  }
  // Sliding-window attention: Mistral's and Mixtral's sliding_window (it acts once the context
  // exceeds it). Qwen2's and Qwen3's use_sliding_window applies it to the layers past
  // max_window_layers only: not built.
  if (flag(c, "use_sliding_window", false, where)) {
    throw ConfigError(where + ": config.json's 'use_sliding_window' is true: Qwen's per-layer sliding window (max_window_layers) is not built");
  }
  if ((type == "mistral" || type == "mixtral") && c.contains("sliding_window") && !c.at("sliding_window").is_null())
    g.sliding_window = positive(c, "sliding_window", where);
  if (type == "mixtral") {  // a dropless top-k MoE of SwiGLU experts in every block
    g.n_experts = positive(c, "num_local_experts", where);
    g.top_k = positive(c, "num_experts_per_tok", where);
    g.moe_every = 1;
    g.moe_capacity_factor = 0.0;
    g.moe_aux_loss_coef = number(c, "router_aux_loss_coef", 0.02, where);
    g.moe_z_loss_coef = 0.0;
    if (number(c, "router_jitter_noise", 0.0, where) != 0.0) {
      throw ConfigError(where + ": config.json's 'router_jitter_noise' is " + c.at("router_jitter_noise").dump() +
                        "; kiln's router has no jitter (0)");
    }
  }
  *dropout = number(c, "attention_dropout", 0.0, where);
  g.validate();
  return g;
}

std::map<std::string, std::vector<std::string>> hf_llama_sources(const GPTConfig& cfg) {
  std::map<std::string, std::vector<std::string>> s;
  s["wte"] = {"model.embed_tokens.weight"};
  s["ln_f.weight"] = {"model.norm.weight"};
  if (!cfg.tie_embeddings) s["lm_head"] = {"lm_head.weight"};
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    const std::string k = "h." + std::to_string(i) + ".", p = "model.layers." + std::to_string(i) + ".";
    s[k + "ln_1.weight"] = {p + "input_layernorm.weight"};
    s[k + "ln_2.weight"] = {p + "post_attention_layernorm.weight"};
    s[k + "attn.c_attn.weight"] = {p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight"};
    s[k + "attn.c_proj.weight"] = {p + "self_attn.o_proj.weight"};
    if (cfg.qk_norm) {
      s[k + "attn.q_norm.weight"] = {p + "self_attn.q_norm.weight"};
      s[k + "attn.k_norm.weight"] = {p + "self_attn.k_norm.weight"};
    }
    if (cfg.is_moe_layer(i)) {
      // Mixtral's files (save_pretrained writes the experts one by one): the experts' [gate; up]
      // and down stacked along the kiln tensor's rows (fc_w [E, 2F, d] as [E 2F, d]).
      s[k + "moe.router"] = {p + "block_sparse_moe.gate.weight"};
      auto& fc = s[k + "moe.fc_w"];
      auto& proj = s[k + "moe.proj_w"];
      for (int64_t e = 0; e < cfg.n_experts; ++e) {
        const std::string x = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
        fc.push_back(x + "w1.weight");
        fc.push_back(x + "w3.weight");
        proj.push_back(x + "w2.weight");
      }
      continue;
    }
    s[k + "mlp.c_fc.weight"] = {p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"};
    s[k + "mlp.c_proj.weight"] = {p + "mlp.down_proj.weight"};
    if (cfg.qkv_bias())
      s[k + "attn.c_attn.bias"] = {p + "self_attn.q_proj.bias", p + "self_attn.k_proj.bias", p + "self_attn.v_proj.bias"};
    if (cfg.linear_bias()) {
      s[k + "attn.c_proj.bias"] = {p + "self_attn.o_proj.bias"};
      s[k + "mlp.c_fc.bias"] = {p + "mlp.gate_proj.bias", p + "mlp.up_proj.bias"};
      s[k + "mlp.c_proj.bias"] = {p + "mlp.down_proj.bias"};
    }
  }
  return s;
}

HfWeightFiles::HfWeightFiles(const std::string& dir) {
  std::vector<std::string> paths;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(fs::path(dir) / "model.safetensors")) {
    paths.push_back((fs::path(dir) / "model.safetensors").string());
  } else if (fs::exists(index)) {
    json j;
    try {
      std::ifstream in(index);
      j = json::parse(in);
    } catch (const json::exception& e) {
      throw DataError(index.string() + ": malformed JSON (" + e.what() + ")");
    }
    if (!j.contains("weight_map") || !j.at("weight_map").is_object()) throw DataError(index.string() + ": no 'weight_map' object");
    std::set<std::string> shards;
    for (const auto& [name, file] : j.at("weight_map").items()) {
      const std::string f = file.is_string() ? file.get<std::string>() : std::string();
      // A shard is a file of this directory: no path of another.
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
        throw DataError(index.string() + ": tensor '" + name + "' maps to " + file.dump() + ", not a file name of the directory");
      }
      shards.insert(f);
    }
    for (const auto& f : shards) paths.push_back((fs::path(dir) / f).string());
  } else {
    throw ConfigError(dir + ": no model.safetensors and no model.safetensors.index.json there");
  }
  for (const auto& p : paths) {
    files_.push_back(std::make_unique<SafetensorsReader>(p));
    bytes_ += static_cast<int64_t>(fs::file_size(p));
    for (const auto& spec : files_.back()->specs()) {
      if (!where_.emplace(spec.name, files_.back().get()).second) {
        throw DataError(p + ": tensor '" + spec.name + "' is in another shard too");
      }
    }
  }
}

std::vector<TensorSpec> HfWeightFiles::specs() const {
  std::vector<TensorSpec> out;
  for (const auto& f : files_) out.insert(out.end(), f->specs().begin(), f->specs().end());
  return out;
}

const TensorSpec& HfWeightFiles::spec(const std::string& name) const { return where_.at(name)->spec(name); }

std::string HfWeightFiles::file_of(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? std::string() : fs::path(it->second->path()).filename().string();
}

at::Tensor HfWeightFiles::read(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw DataError("no tensor '" + name + "' in the model's files");
  return it->second->read(name);
}

namespace {
// The shape each source must have, from the kiln parameter's whole shape: the rows it contributes.
std::vector<std::vector<int64_t>> source_shapes(const GPTConfig& cfg, const std::string& kiln_name,
                                                const std::vector<std::string>& sources) {
  const int64_t d = cfg.d_model, a = cfg.attn_width(), kv = cfg.n_kv_head * cfg.head_dim(), F = cfg.mlp_hidden(), V = cfg.vocab_size;
  const bool is_bias = kiln_name.size() > 5 && kiln_name.compare(kiln_name.size() - 5, 5, ".bias") == 0;
  auto rows = [&](std::vector<int64_t> r) {
    std::vector<std::vector<int64_t>> out;
    for (int64_t n : r) out.push_back(is_bias ? std::vector<int64_t>{n} : std::vector<int64_t>{n, d});
    return out;
  };
  if (kiln_name == "wte" || kiln_name == "lm_head") return {{V, d}};
  if (kiln_name.find("moe.router") != std::string::npos) return {{cfg.n_experts, d}};
  if (kiln_name.find("moe.fc_w") != std::string::npos) return std::vector<std::vector<int64_t>>(sources.size(), {F, d});
  if (kiln_name.find("moe.proj_w") != std::string::npos) return std::vector<std::vector<int64_t>>(sources.size(), {d, F});
  if (kiln_name.find("attn.c_attn") != std::string::npos) return rows({a, kv, kv});
  if (kiln_name.find("attn.q_norm") != std::string::npos || kiln_name.find("attn.k_norm") != std::string::npos)
    return {{cfg.head_dim()}};
  if (kiln_name.find("mlp.c_fc") != std::string::npos) return rows({F, F});
  if (kiln_name.find("mlp.c_proj.weight") != std::string::npos) return {{d, F}};
  if (kiln_name.find("attn.c_proj.weight") != std::string::npos) return {{d, a}};
  return std::vector<std::vector<int64_t>>(sources.size(), std::vector<int64_t>{d});  // norms, c_proj biases
}
}  // namespace

void match_hf_llama(const GPTConfig& cfg, const HfWeightFiles& files) {
  // The layers first, bounded by the files (config.json is untrusted: num_hidden_layers 1e9 over a
  // file of two layers must not build a billion names).
  int64_t layers = 0;
  const std::string prefix = "model.layers.";
  for (const auto& spec : files.specs()) {
    if (spec.name.compare(0, prefix.size(), prefix) != 0) continue;
    int64_t i = 0;
    size_t k = prefix.size();
    for (; k < spec.name.size() && std::isdigit(static_cast<unsigned char>(spec.name[k])) && i < (int64_t{1} << 40); ++k)
      i = 10 * i + (spec.name[k] - '0');
    if (k > prefix.size() && k < spec.name.size() && spec.name[k] == '.') layers = std::max(layers, i + 1);
  }
  if (layers != cfg.n_layer) {
    throw ConfigError("config.json says num_hidden_layers " + std::to_string(cfg.n_layer) + " but the model's files hold " +
                      std::to_string(layers) + " layer(s) (model.layers.0 .. " + std::to_string(layers - 1) +
                      "): the two disagree, nothing was allocated");
  }
  std::set<std::string> used;
  for (const auto& [kiln_name, sources] : hf_llama_sources(cfg)) {
    const auto shapes = source_shapes(cfg, kiln_name, sources);
    for (size_t i = 0; i < sources.size(); ++i) {
      const std::string& s = sources[i];
      if (!files.contains(s)) throw ConfigError("the model's files have no tensor '" + s + "' (for kiln's " + kiln_name + ")");
      const TensorSpec& spec = files.spec(s);
      if (!at::isFloatingType(spec.dtype)) {
        throw ConfigError("tensor '" + s + "' is " + std::string(c10::toString(spec.dtype)) + ", not a floating-point type");
      }
      if (spec.shape != shapes[i]) {
        throw ConfigError("tensor '" + s + "' has shape " + c10::str(at::IntArrayRef(spec.shape)) + ", this model expects " +
                          c10::str(at::IntArrayRef(shapes[i])));
      }
      used.insert(s);
    }
  }
  for (const auto& spec : files.specs()) {
    const std::string& n = spec.name;
    if (used.count(n)) continue;
    if (n.size() > 8 && n.compare(n.size() - 8, 8, "inv_freq") == 0) continue;  // old files' rotary buffers
    if (cfg.tie_embeddings && n == "lm_head.weight") {
      throw ConfigError("tensor 'lm_head.weight' is in the files but config.json ties the output layer to the embedding");
    }
    throw ConfigError("unexpected tensor '" + n + "' in the model's files (not part of this " + std::to_string(cfg.n_layer) +
                      "-layer model)");
  }
}

at::Tensor hf_rows_view(const at::Tensor& whole) {
  return whole.dim() > 2 ? whole.view({-1, whole.size(-1)}) : whole;  // an MoE [E, R, C] as [E R, C]
}

std::vector<HfPiece> hf_llama_pieces(const GPTConfig& cfg, const std::string& kiln_name) {
  const auto sources = hf_llama_sources(cfg).at(kiln_name);
  const auto shapes = source_shapes(cfg, kiln_name, sources);
  std::vector<HfPiece> out;
  int64_t row = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    out.push_back({sources[i], shapes[i], row});
    row += shapes[i].empty() ? 1 : shapes[i][0];
  }
  return out;
}

namespace {
// config.json's eos_token_id: the tokenizer's end tokens but the document token (one id, or the
// list transformers' generate stops at: Llama 3's <|end_of_text|> and <|eot_id|>), eot where it
// has no other.
json eos_ids(int64_t eot, const std::vector<int64_t>& ends) {
  if (eot < 0) return nullptr;
  std::vector<int64_t> e;  // the end tokens but the document token (bos), where there are others
  for (const int64_t id : ends)
    if (id != eot) e.push_back(id);
  if (e.empty()) return eot;
  return e.size() == 1 ? json(e[0]) : json(e);
}
}  // namespace

json hf_llama_generation_config(const GPTConfig& cfg, int64_t eot, const std::vector<int64_t>& ends) {
  // pad: generate() warns on every call without one (and takes eos for it).
  return json{{"bos_token_id", eot >= 0 ? json(eot) : json(nullptr)}, {"eos_token_id", eos_ids(eot, ends)},
              {"pad_token_id", eot >= 0 ? json(eot) : json(nullptr)}, {"max_new_tokens", hf_max_new_tokens(cfg)}};
}

json hf_llama_config_json(const GPTConfig& cfg, int64_t eot, const std::vector<int64_t>& ends, const std::string& prefix) {
  const bool qwen2 = cfg.bias == "qkv", qwen3 = cfg.qk_norm;
  json rope{{"rope_type", cfg.rope_factor != 0.0 ? "llama3" : "default"}, {"rope_theta", cfg.rope_theta}};
  json scaling = nullptr;
  if (cfg.rope_factor != 0.0) {
    scaling = json{{"rope_type", "llama3"},
                   {"factor", cfg.rope_factor},
                   {"low_freq_factor", cfg.rope_low_freq_factor},
                   {"high_freq_factor", cfg.rope_high_freq_factor},
                   {"original_max_position_embeddings", cfg.rope_original_context}};
    rope.update(scaling);
    rope["rope_theta"] = cfg.rope_theta;
  }
  const bool mixtral = cfg.is_moe();
  const bool mistral = !mixtral && !qwen2 && !qwen3 && cfg.sliding_window > 0;  // Llama's block with Mistral's window
  json c{{"architectures", {mixtral ? "MixtralForCausalLM" : qwen3 ? "Qwen3ForCausalLM" : qwen2 ? "Qwen2ForCausalLM"
                            : mistral ? "MistralForCausalLM" : "LlamaForCausalLM"}},
         {"model_type", mixtral ? "mixtral" : qwen3 ? "qwen3" : qwen2 ? "qwen2" : mistral ? "mistral" : "llama"},
         {"hidden_size", cfg.d_model},
         {"intermediate_size", cfg.mlp_hidden()},
         {"num_hidden_layers", cfg.n_layer},
         {"num_attention_heads", cfg.n_head},
         {"num_key_value_heads", cfg.n_kv_head},
         {"head_dim", cfg.head_dim()},
         {"vocab_size", cfg.vocab_size},
         {"max_position_embeddings", cfg.seq_len},
         {"rms_norm_eps", cfg.layer_norm_eps},
         {"hidden_act", "silu"},
         {"rope_parameters", rope},
         {"rope_theta", cfg.rope_theta},
         {"rope_scaling", scaling},
         {"tie_word_embeddings", cfg.tie_embeddings},
         {"attention_dropout", 0.0},
         {"bos_token_id", eot >= 0 ? json(eot) : json(nullptr)},
         {"eos_token_id", eos_ids(eot, ends)},
         // transformers' text-generation pipeline puts prefix before the prompt, as kiln sample
         // puts the document token: without it their greedy texts differed.
         {"prefix", prefix.empty() ? json(nullptr) : json(prefix)},
         {"dtype", "float32"},
         {"torch_dtype", "float32"}};
  if (mixtral) {
    c["num_local_experts"] = cfg.n_experts;
    c["num_experts_per_tok"] = cfg.top_k;
    c["router_aux_loss_coef"] = cfg.moe_aux_loss_coef;
    c["router_jitter_noise"] = 0.0;
    c["sliding_window"] = cfg.sliding_window > 0 ? json(cfg.sliding_window) : json(nullptr);
  } else if (mistral) {
    c["sliding_window"] = cfg.sliding_window;
  } else if (qwen3) {
    c["attention_bias"] = false;
    c["use_sliding_window"] = false;
    c["sliding_window"] = nullptr;
  } else if (qwen2) {
    c["use_sliding_window"] = false;
    c["sliding_window"] = nullptr;
  } else {
    c["attention_bias"] = cfg.linear_bias();
    c["mlp_bias"] = cfg.linear_bias();
  }
  return c;
}

std::vector<int> hf_shard_of(const std::vector<int64_t>& bytes, int64_t max_bytes) {
  std::vector<int> out;
  int shard = 0;
  int64_t in_shard = 0;
  for (const int64_t b : bytes) {
    if (in_shard > 0 && in_shard + b > max_bytes) {
      ++shard;
      in_shard = 0;
    }
    out.push_back(shard);
    in_shard += b;
  }
  return out;
}

std::string hf_shard_name(int shard, int shards) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", shard + 1, shards);
  return name;
}

at::Tensor read_hf_llama(const HfWeightFiles& files, const std::string& kiln_name, const std::vector<std::string>& sources,
                         const std::vector<int64_t>& shape, NonFiniteTensors& bad) {
  at::Tensor whole = at::zeros(shape, at::TensorOptions().dtype(at::kFloat));
  const at::Tensor rows = hf_rows_view(whole);
  int64_t row = 0;
  for (const auto& s : sources) {
    const at::Tensor t = files.read(s);
    bad.note(t, files.file_of(s), s);
    const int64_t n = t.dim() == 0 ? 1 : t.size(0);
    rows.narrow(0, row, n).copy_(t);  // the dtype converted; wte / lm_head: the rows past V stay zero
    row += n;
  }
  return whole;
}

}  // namespace kiln
