// runtime/checkpoint/init_from.cpp -- --init-from: the model's shape from a directory's config.json
// (GPT-2 or the Llama family) or a kiln checkpoint's trainer_state.json.
#include "runtime/checkpoint/init_from.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "distributed/error.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/hf_gpt2.h"
#include "runtime/checkpoint/hf_llama.h"
#include "runtime/checkpoint/safetensors.h"

namespace kiln {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

json read_json(const std::string& path, const std::string& where) {
  std::ifstream in(path);
  if (!in) throw ConfigError(where + ": cannot read " + fs::path(path).filename().string());
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    throw ConfigError(where + ": " + fs::path(path).filename().string() + " is not valid JSON (" + e.what() + ")");
  }
}

// The directory that holds the weights: DIR itself, or the checkpoint DIR/latest names.
std::string resolve_dir(const std::string& dir, const std::string& flag) {
  const std::string where = flag + " " + dir;
  if (!fs::is_directory(dir)) throw ConfigError(where + ": no such directory");
  if (fs::exists(fs::path(dir) / "model.safetensors")) return dir;
  // A sharded Hugging Face model (its index names the shards; runtime/checkpoint/hf_llama.h).
  if (fs::exists(fs::path(dir) / "model.safetensors.index.json") && fs::exists(fs::path(dir) / "config.json")) return dir;
  if (fs::exists(fs::path(dir) / "latest")) {
    const std::string latest = latest_checkpoint(dir);
    if (latest.empty() || !fs::exists(fs::path(latest) / "model.safetensors")) {
      throw ConfigError(where + ": 'latest' names " + (latest.empty() ? std::string("nothing") : latest) +
                        ", which holds no model.safetensors");
    }
    return latest;
  }
  if (fs::exists(fs::path(dir) / "pytorch_model.bin")) {
    throw ConfigError(where + ": holds pytorch_model.bin but no model.safetensors; kiln reads safetensors only: "
                      "convert it with transformers (GPT2LMHeadModel.from_pretrained(DIR).save_pretrained(NEW_DIR))");
  }
  throw ConfigError(where + ": no model.safetensors there (nor model.safetensors.index.json, nor a 'latest' naming a kiln checkpoint)");
}

// config.json[key] as a positive integer (required).
int64_t positive_int(const json& c, const char* key, const std::string& where) {
  if (!c.contains(key)) throw ConfigError(where + ": config.json has no '" + key + "'");
  const json& v = c.at(key);
  if (!v.is_number_integer() || v.get<int64_t>() <= 0) {
    throw ConfigError(where + ": config.json's '" + key + "' must be a positive integer (got " + v.dump() + ")");
  }
  return v.get<int64_t>();
}

// config.json[key], absent = `fallback`, must equal `want` (a setting kiln's GPT has no other way of).
void must_be(const json& c, const char* key, const json& fallback, const json& want, const std::string& where,
             const std::string& why) {
  const json v = c.contains(key) && !c.at(key).is_null() ? c.at(key) : fallback;
  if (v != want) {
    throw ConfigError(where + ": config.json's '" + key + "' is " + v.dump() + "; kiln's GPT needs " + want.dump() +
                      " (" + why + ")");
  }
}

// The shape (and dropout) of a GPT2Config's config.json, checked.
GPTConfig from_hf_config(const json& c, const std::string& where, double* dropout, std::string* dropout_note) {
  if (!c.is_object()) throw ConfigError(where + ": config.json is not a JSON object");
  if (c.value("model_type", json()) != "gpt2") {
    throw ConfigError(where + ": config.json's 'model_type' is " + c.value("model_type", json()).dump() +
                      ", not \"gpt2\" (kiln starts from GPT-2 models: GPT2LMHeadModel)");
  }
  if (c.contains("architectures") && c.at("architectures").is_array()) {
    for (const auto& a : c.at("architectures")) {
      if (a != "GPT2LMHeadModel" && a != "GPT2Model") {
        throw ConfigError(where + ": config.json's 'architectures' names " + a.dump() +
                          "; kiln starts from GPT2LMHeadModel (or GPT2Model) weights");
      }
    }
  }
  GPTConfig g;
  g.n_layer = positive_int(c, "n_layer", where);
  g.n_head = positive_int(c, "n_head", where);
  g.n_kv_head = g.n_head;
  g.d_model = positive_int(c, "n_embd", where);
  g.seq_len = positive_int(c, "n_positions", where);
  g.vocab_size = positive_int(c, "vocab_size", where);

  const json act = c.value("activation_function", json("gelu_new"));
  if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
    throw ConfigError(where + ": config.json's 'activation_function' is " + act.dump() +
                      "; kiln's GPT uses GELU with the tanh approximation (gelu_new or gelu_pytorch_tanh)");
  }
  if (c.contains("n_inner") && !c.at("n_inner").is_null() && c.at("n_inner") != json(4 * g.d_model)) {
    throw ConfigError(where + ": config.json's 'n_inner' is " + c.at("n_inner").dump() + "; kiln's MLP is 4 n_embd = " +
                      std::to_string(4 * g.d_model) + " wide");
  }
  const json eps = c.value("layer_norm_epsilon", json(1e-5));
  if (!eps.is_number() || eps.get<double>() != 1e-5) {
    throw ConfigError(where + ": config.json's 'layer_norm_epsilon' is " + eps.dump() +
                      "; kiln's LayerNorm uses 1e-5 (its checkpoints, resume and eval assume it; no flag sets it)");
  }
  must_be(c, "tie_word_embeddings", true, true, where, "the output layer is the token embedding");
  must_be(c, "scale_attn_weights", true, true, where, "attention scores are scaled by 1/sqrt(head_dim)");
  must_be(c, "scale_attn_by_inverse_layer_idx", false, false, where, "no per-layer attention scaling");
  must_be(c, "reorder_and_upcast_attn", false, false, where, "attention as scaled_dot_product_attention computes it");
  must_be(c, "add_cross_attention", false, false, where, "a decoder without cross-attention");

  // kiln has one dropout probability: the config's three must agree to be taken.
  std::vector<std::pair<const char*, double>> drops;
  for (const char* key : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) {
    const json v = c.value(key, json(0.1));  // GPT2Config's default
    if (!v.is_number()) throw ConfigError(where + ": config.json's '" + key + "' must be a number (got " + v.dump() + ")");
    drops.emplace_back(key, v.get<double>());
  }
  *dropout = drops[0].second;
  dropout_note->clear();
  for (const auto& [key, p] : drops) {
    if (p != *dropout) {
      *dropout_note = std::string("config.json's dropouts differ (") + drops[0].first + " " + json(drops[0].second).dump() +
                      ", " + key + " " + json(p).dump() + ") and kiln has one: give --dropout P";
    }
  }
  return g;
}

// A kiln checkpoint without config.json (a grouped-query model): its trainer_state.json's shape.
GPTConfig from_kiln_state(const json& st, const std::string& where, double* dropout) {
  const json m = st.value("model", json::object());
  GPTConfig g;
  g.n_layer = positive_int(m, "n_layer", where + " (trainer_state.json model)");
  g.n_head = positive_int(m, "n_head", where + " (trainer_state.json model)");
  g.n_kv_head = positive_int(m, "n_kv_head", where + " (trainer_state.json model)");
  g.d_model = positive_int(m, "d_model", where + " (trainer_state.json model)");
  g.seq_len = positive_int(m, "seq_len", where + " (trainer_state.json model)");
  g.vocab_size = positive_int(m, "vocab_size", where + " (trainer_state.json model)");
  const json run_cfg = st.value("run", json::object()).value("config", json::object());
  *dropout = run_cfg.value("dropout", 0.0);
  // MoE (models/moe.h): which blocks hold how many experts, and the routing trained with.
  g.n_experts = m.value("n_experts", int64_t{0});
  g.moe_every = m.value("moe_every", g.moe_every);
  g.top_k = run_cfg.value("top_k", g.top_k);
  g.moe_capacity_factor = run_cfg.value("moe_capacity_factor", g.moe_capacity_factor);
  g.moe_aux_loss_coef = run_cfg.value("moe_aux_loss_coef", g.moe_aux_loss_coef);
  g.moe_z_loss_coef = run_cfg.value("moe_z_loss_coef", g.moe_z_loss_coef);
  // The Llama family's architecture (models/gpt_config.h): the run's config record, then the model
  // record's (which parameters exist; both absent for GPT-2).
  g.take_architecture(run_cfg);
  g.take_architecture(m);
  return g;
}

// The model's fp32 weights, built on the host before anything moves to a device, must fit the
// host's memory (per tp x pp slice). Called once the shape agrees with the files' tensors.
void check_host_memory(const GPTConfig& g, int64_t slices, const std::string& where) {
  const double bytes = 4.0 * static_cast<double>(g.num_params()) / static_cast<double>(std::max<int64_t>(1, slices));
  const double host = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGE_SIZE));
  if (host > 0 && bytes > host) {
    char line[256];
    std::snprintf(line, sizeof line, ": its %.3g parameters need %.1f GB of host memory to build in fp32%s; this host has %.1f GB",
                  static_cast<double>(g.num_params()), bytes / 1e9, slices > 1 ? " (a tp x pp slice)" : "", host / 1e9);
    throw ConfigError(where + line + (g.gpt2_architecture() ? " (shard it with --tp / --pp over more hosts)"
                                                             : " (--tp / --pp for this family are not built yet)"));
  }
}

// A Llama-family directory's weights against its config.json (names, shapes; one file or the
// shards of its index), before anything is allocated, and the host memory check as for GPT-2.
void check_llama_weights(const std::string& dir, const GPTConfig& g, int64_t slices, const std::string& where) {
  try {
    match_hf_llama(g, HfWeightFiles(dir));
  } catch (const ConfigError& e) {
    throw ConfigError(where + ": " + e.what());
  }
  check_host_memory(g, slices, where);
}

// The weights' own header against the shape the directory's config describes, before anything is
// allocated: a hub download is untrusted, and a config.json that disagrees with its safetensors
// (n_layer 100000 over a file of one block) was found out only after the whole model was built
// (74 s and 20 GB; n_layer 1e9: the OOM killer). The header alone is read (safetensors.h checks
// it as it reads it). Then the model's fp32 weights, which are built on the host before anything
// moves to a device, must fit the host's memory (per tp x pp slice).
void check_weights_header(const std::string& dir, const GPTConfig& g, const std::string& shape_file, int64_t slices,
                          const std::string& where) {
  const SafetensorsReader file(dir + "/model.safetensors");
  int64_t blocks = 0;
  const TensorSpec* wte = nullptr;
  for (const auto& t : file.specs()) {
    std::string n = t.name;
    if (n.rfind("transformer.", 0) == 0) n = n.substr(std::string("transformer.").size());
    if (n == "wte.weight") wte = &t;
    if (n.rfind("h.", 0) != 0) continue;
    int64_t index = 0;
    size_t i = 2;
    for (; i < n.size() && std::isdigit(static_cast<unsigned char>(n[i])) && index < (int64_t{1} << 40); ++i) index = 10 * index + (n[i] - '0');
    if (i > 2 && i < n.size() && n[i] == '.') blocks = std::max(blocks, index + 1);
  }
  const std::string prefix = wte != nullptr && wte->name.rfind("transformer.", 0) == 0 ? "transformer." : "";
  if (blocks != g.n_layer) {
    throw ConfigError(where + ": " + shape_file + " says n_layer " + std::to_string(g.n_layer) + " but model.safetensors holds " +
                      std::to_string(blocks) + " block(s) (" +
                      (blocks > 0 ? prefix + "h.0 .. " + prefix + "h." + std::to_string(blocks - 1) : std::string("no h.N tensors")) +
                      "): the two disagree, nothing was allocated");
  }
  // With the blocks bounded by the file, every tensor's name and shape against the model's, as a
  // load checks them (a model on the meta device: nothing allocated but lm_head, read if present).
  try {
    match_hf_gpt2(g, file.specs(), [&](const std::string& name) { return file.read(name); });
  } catch (const ConfigError& e) {
    throw ConfigError(where + ": " + e.what());
  }
  // The shape now agrees with the file's tensors, so the count is bounded by the file's size.
  check_host_memory(g, slices, where);
}

}  // namespace

void apply_init_from(const std::map<std::string, json>& given, TrainConfig& config, const std::string& flag) {
  if (config.init_from.empty()) return;
  const std::string dir = resolve_dir(config.init_from, flag);
  const std::string where = flag + " " + dir;
  double dropout = 0.0;
  std::string dropout_note;
  GPTConfig file;
  std::string shape_file = "config.json";
  json hf;  // config.json, when there is one
  bool llama = false;
  if (fs::exists(fs::path(dir) / "config.json")) {
    hf = read_json(dir + "/config.json", where);
    llama = is_hf_llama_family(hf);
    file = llama ? hf_llama_config(hf, where, &dropout) : from_hf_config(hf, where, &dropout, &dropout_note);
  } else if (fs::exists(fs::path(dir) / "trainer_state.json")) {
    file = from_kiln_state(read_json(dir + "/trainer_state.json", where), where, &dropout);
    shape_file = "trainer_state.json";
  } else {
    throw ConfigError(where + ": no config.json there (the model's shape comes from it)");
  }
  if (llama || !file.gpt2_architecture()) check_llama_weights(dir, file, int64_t{config.tp} * config.pp, where);
  else check_weights_header(dir, file, shape_file, int64_t{config.tp} * config.pp, where);

  // Settings given for the shape must be the file's. --model gives all of them (its preset).
  const GPTConfig& now = config.gpt;
  const bool preset = given.count("model") > 0;
  struct Field {
    const char* flag;
    const char* key;  // config.json's name
    int64_t want, have;
  };
  const Field gpt2_fields[] = {{"n-layer", "n_layer", now.n_layer, file.n_layer},
                               {"n-head", "n_head", now.n_head, file.n_head},
                               {"n-kv-head", "n_head (GPT-2 has no grouped-query attention)", now.n_kv_head, file.n_kv_head},
                               {"d-model", "n_embd", now.d_model, file.d_model},
                               {"vocab-size", "vocab_size", now.vocab_size, file.vocab_size}};
  const Field llama_fields[] = {{"n-layer", "num_hidden_layers", now.n_layer, file.n_layer},
                                {"n-head", "num_attention_heads", now.n_head, file.n_head},
                                {"n-kv-head", "num_key_value_heads", now.n_kv_head, file.n_kv_head},
                                {"d-model", "hidden_size", now.d_model, file.d_model},
                                {"vocab-size", "vocab_size", now.vocab_size, file.vocab_size}};
  const auto& fields = llama ? llama_fields : gpt2_fields;
  for (const auto& f : fields) {
    if ((preset || given.count(f.flag)) && f.want != f.have) {
      const std::string by = given.count(f.flag) ? std::string("--") + f.flag : "--model " + config.model + "'s " + f.flag;
      throw ConfigError(where + ": " + by + " " + std::to_string(f.want) + " contradicts its config.json (" + f.key +
                        " " + std::to_string(f.have) + "); the shape comes from " + flag + ": leave the flag out");
    }
  }
  // Mixture-of-Experts: the experts come from the file (an HF GPT-2 has none); the routing and the
  // losses' weights may be set anew for the new run.
  if ((preset || given.count("n-experts") || given.count("moe-every")) &&
      (now.n_experts != file.n_experts || (now.is_moe() && now.moe_every != file.moe_every))) {
    throw ConfigError(where + ": " + (file.is_moe() ? "its MoE layers (" + std::to_string(file.n_experts) + " experts, every " +
                                                          std::to_string(file.moe_every) + " blocks)"
                                                    : std::string("a dense model")) +
                      " cannot seed " + (now.is_moe() ? "an MoE model of " + std::to_string(now.n_experts) + " experts every " +
                                                            std::to_string(now.moe_every) + " blocks"
                                                      : std::string("a dense model")) +
                      ": the experts come from " + flag + ", leave --model / --n-experts / --moe-every out");
  }
  if (given.count("top-k")) file.top_k = now.top_k;
  if (given.count("moe-capacity-factor")) file.moe_capacity_factor = now.moe_capacity_factor;
  if (given.count("moe-aux-loss-coef")) file.moe_aux_loss_coef = now.moe_aux_loss_coef;
  if (given.count("moe-z-loss-coef")) file.moe_z_loss_coef = now.moe_z_loss_coef;
  // Context: the file's n_positions unless a shorter one is asked for.
  if (preset || given.count("seq-len")) {
    if (now.seq_len > file.seq_len) {
      throw ConfigError(where + ": --seq-len " + std::to_string(now.seq_len) + " is longer than its " +
                        (llama ? "max_position_embeddings " : "n_positions ") + std::to_string(file.seq_len) +
                        (llama ? " (the positions it was trained for)" : " (the model has no position embedding beyond)"));
    }
    file.seq_len = now.seq_len;  // the first seq_len rows of wpe (rope: the rotary table's)
  }
  // Sliding-window attention (Mistral's): config.json's window, acting wherever the context
  // trained at exceeds it (GPTConfig::windowed).
  if (given.count("dropout")) {
    file.dropout = now.dropout;
  } else {
    if (!dropout_note.empty()) throw ConfigError(where + ": " + dropout_note);
    file.dropout = dropout;
  }
  config.gpt = file;
  config.init_from = dir;
}

}  // namespace kiln
