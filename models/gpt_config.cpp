// models/gpt_config.cpp -- presets, validation and parameter count of GPTConfig.
#include "models/gpt_config.h"

#include <initializer_list>
#include <sstream>

#include <nlohmann/json.hpp>

#include "distributed/error.h"
#include "distributed/suggest.h"

namespace kiln {

namespace {
GPTConfig gpt2(int64_t layers, int64_t heads, int64_t width) {
  GPTConfig c;
  c.n_layer = layers;
  c.n_head = heads;
  c.n_kv_head = heads;
  c.d_model = width;
  c.seq_len = 1024;
  c.vocab_size = 50257;  // padded to 50304
  return c;
}
// The Llama family's shared choices: rotary positions, RMSNorm, SwiGLU, no biases, untied output.
GPTConfig llama(int64_t layers, int64_t heads, int64_t kv_heads, int64_t width, int64_t ffn, int64_t vocab,
                int64_t context, double theta) {
  GPTConfig c;
  c.n_layer = layers;
  c.n_head = heads;
  c.n_kv_head = kv_heads;
  c.d_model = width;
  c.ffn_hidden = ffn;
  c.vocab_size = vocab;
  c.seq_len = context;
  c.position = "rope";
  c.rope_theta = theta;
  c.norm = "rmsnorm";
  c.layer_norm_eps = 1e-5;
  c.mlp = "swiglu";
  c.bias = "none";
  c.tie_embeddings = false;
  return c;
}

// Llama-3.1's rotary scaling (every Llama 3.1 / 3.2 / 3.3 config.json: factor 8 or 32, 1, 4, 8192).
void llama31_scaling(GPTConfig& c, double factor) {
  c.rope_factor = factor;
  c.rope_low_freq_factor = 1.0;
  c.rope_high_freq_factor = 4.0;
  c.rope_original_context = 8192;
}
}  // namespace

int64_t llama_ffn_hidden(int64_t d_model, double multiplier, int64_t multiple_of) {
  int64_t f = 2 * (4 * d_model) / 3;
  f = static_cast<int64_t>(multiplier * static_cast<double>(f));
  return (f + multiple_of - 1) / multiple_of * multiple_of;
}

int64_t GPTConfig::mlp_hidden() const {
  if (ffn_hidden > 0) return ffn_hidden;
  return swiglu() ? llama_ffn_hidden(d_model, 1.0, 256) : 4 * d_model;
}

bool GPTConfig::gpt2_architecture() const {
  return position == "learned" && norm == "layernorm" && mlp == "gelu" && bias == "all" && tie_embeddings &&
         ffn_hidden <= 0 && head_width == 0 && !qk_norm && sliding_window == 0;
}

void GPTConfig::put_architecture(nlohmann::json& j) const {
  if (gpt2_architecture()) return;
  j["position"] = position;
  j["rope_theta"] = rope_theta;
  j["rope_factor"] = rope_factor;
  j["rope_low_freq_factor"] = rope_low_freq_factor;
  j["rope_high_freq_factor"] = rope_high_freq_factor;
  j["rope_original_context"] = rope_original_context;
  j["norm"] = norm;
  j["norm_eps"] = layer_norm_eps;
  j["mlp"] = mlp;
  j["ffn_hidden"] = mlp_hidden();
  j["bias"] = bias;
  j["tie_embeddings"] = tie_embeddings;
  if (head_width > 0) j["head_dim"] = head_width;
  if (qk_norm) j["qk_norm"] = true;
  if (sliding_window > 0) j["sliding_window"] = sliding_window;
}

void GPTConfig::take_architecture(const nlohmann::json& j) {
  if (!j.is_object()) return;
  position = j.value("position", position);
  rope_theta = j.value("rope_theta", rope_theta);
  rope_factor = j.value("rope_factor", rope_factor);
  rope_low_freq_factor = j.value("rope_low_freq_factor", rope_low_freq_factor);
  rope_high_freq_factor = j.value("rope_high_freq_factor", rope_high_freq_factor);
  rope_original_context = j.value("rope_original_context", rope_original_context);
  norm = j.value("norm", norm);
  layer_norm_eps = j.value("norm_eps", layer_norm_eps);
  mlp = j.value("mlp", mlp);
  ffn_hidden = j.value("ffn_hidden", ffn_hidden);
  bias = j.value("bias", bias);
  tie_embeddings = j.value("tie_embeddings", tie_embeddings);
  head_width = j.value("head_dim", head_width);
  qk_norm = j.value("qk_norm", qk_norm);
  sliding_window = j.value("sliding_window", sliding_window);
}

std::vector<std::string> GPTConfig::preset_names() {
  return {"tiny",      "tiny-moe",  "gpt2-124m",  "gpt2-124m-moe", "gpt2-350m",  "gpt2-774m", "gpt2-1.5b",
          "gpt3-6.7b", "tiny-llama", "llama3-1b", "llama3-8b",     "llama3-70b", "mistral-7b", "qwen2-0.5b",
          "tiny-mixtral", "mixtral-8x7b", "tiny-qwen3", "qwen3-0.6b"};
}

GPTConfig GPTConfig::preset(const std::string& name) {
  if (name == "tiny") return GPTConfig{};  // 4 x 128, T 128, byte-level vocabulary of 512
  if (name == "tiny-moe") {  // tiny with 8 experts, top-2, in every block: 4,567,296 parameters, 1,406,208 active
    GPTConfig c;
    c.n_experts = 8;
    c.top_k = 2;
    return c;
  }
  if (name == "gpt2-124m") return gpt2(12, 12, 768);
  if (name == "gpt2-124m-moe") {  // GPT-2 small, 8 experts top-2 in every other block (GShard's,
                                  // Switch's placement): 322,854,912 parameters, 152,847,360 active
    GPTConfig c = gpt2(12, 12, 768);
    c.n_experts = 8;
    c.top_k = 2;
    c.moe_every = 2;
    return c;
  }
  if (name == "gpt2-350m") return gpt2(24, 16, 1024);
  if (name == "gpt2-774m") return gpt2(36, 20, 1280);
  if (name == "gpt2-1.5b") return gpt2(48, 25, 1600);
  if (name == "gpt3-6.7b") {  // GPT-3 6.7B (Brown et al. 2020, table 2.1): 2048 tokens of context
    GPTConfig c = gpt2(32, 32, 4096);
    c.seq_len = 2048;
    return c;
  }
  // The Llama family. Contexts are the pretraining ones (Llama 3: 8192; the 3.1 / 3.2 configs'
  // 131072 is reached through the rotary scaling, and --seq-len sets the context trained at).
  if (name == "tiny-llama") {  // tiny's shape in the Llama family, GQA 4 over 2: 869,504 parameters
    return llama(4, 4, 2, 128, llama_ffn_hidden(128, 1.0, 32), 512, 128, 10000.0);
  }
  if (name == "llama3-1b") {  // Llama-3.2-1B
    GPTConfig c = llama(16, 32, 8, 2048, llama_ffn_hidden(2048, 1.5, 256), 128256, 8192, 500000.0);
    llama31_scaling(c, 32.0);
    c.tie_embeddings = true;
    return c;
  }
  if (name == "llama3-8b") return llama(32, 32, 8, 4096, llama_ffn_hidden(4096, 1.3, 1024), 128256, 8192, 500000.0);
  if (name == "llama3-70b") return llama(80, 64, 8, 8192, llama_ffn_hidden(8192, 1.3, 4096), 128256, 8192, 500000.0);
  if (name == "mistral-7b") return llama(32, 32, 8, 4096, 14336, 32000, 8192, 10000.0);  // Mistral-7B-v0.1
  if (name == "qwen2-0.5b") {  // Qwen2-0.5B: q, k, v biases, tied, RMSNorm eps 1e-6
    GPTConfig c = llama(24, 14, 2, 896, 4864, 151936, 8192, 1000000.0);
    c.bias = "qkv";
    c.tie_embeddings = true;
    c.layer_norm_eps = 1e-6;
    return c;
  }
  // Mixtral: Mistral's blocks with a dropless top-2 MoE of SwiGLU experts in every one (its router's
  // auxiliary loss at 0.02, no z-loss, as its config.json).
  auto mixtral = [](GPTConfig c, int64_t experts) {
    c.n_experts = experts;
    c.top_k = 2;
    c.moe_every = 1;
    c.moe_capacity_factor = 0.0;
    c.moe_aux_loss_coef = 0.02;
    c.moe_z_loss_coef = 0.0;
    return c;
  };
  if (name == "tiny-mixtral") return mixtral(preset("tiny-llama"), 4);  // 4 experts: 2,493,568 parameters, 1,412,224 active
  if (name == "mixtral-8x7b") {  // Mixtral-8x7B-v0.1
    GPTConfig c = mixtral(llama(32, 32, 8, 4096, 14336, 32000, 8192, 1000000.0), 8);
    return c;
  }
  // Qwen3: heads wider than d / H, and the q / k norms; no biases.
  if (name == "tiny-qwen3") {  // tiny-llama's blocks with 64-wide heads (a = 256 against d 128) and q/k norms
    GPTConfig c = preset("tiny-llama");
    c.head_width = 64;
    c.qk_norm = true;
    c.rope_theta = 1000000.0;
    c.layer_norm_eps = 1e-6;
    return c;
  }
  if (name == "qwen3-0.6b") {  // Qwen3-0.6B
    GPTConfig c = llama(28, 16, 8, 1024, 3072, 151936, 8192, 1000000.0);
    c.head_width = 128;
    c.qk_norm = true;
    c.tie_embeddings = true;
    c.layer_norm_eps = 1e-6;
    return c;
  }
  std::string names;
  for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  throw ConfigError("unknown model '" + name + "'" + did_you_mean(name, preset_names()) + " (presets: " + names + ")");
}

void GPTConfig::validate() const {
  auto positive = [](const char* name, int64_t v) {
    if (v <= 0) throw ConfigError(std::string("--") + name + " must be positive (got " + std::to_string(v) + ")");
  };
  positive("n-layer", n_layer);
  positive("n-head", n_head);
  positive("n-kv-head", n_kv_head);
  positive("d-model", d_model);
  positive("seq-len", seq_len);
  positive("vocab-size", vocab_size);
  if (head_width < 0) throw ConfigError("--head-dim must be positive, or 0 for d-model / n-head (got " + std::to_string(head_width) + ")");
  if (head_width == 0 && d_model % n_head != 0) {
    std::ostringstream m;
    m << "--n-head " << n_head << " does not divide --d-model " << d_model << " (or give --head-dim)";
    throw ConfigError(m.str());
  }
  if (n_head % n_kv_head != 0) {
    std::ostringstream m;
    m << "--n-kv-head " << n_kv_head << " does not divide --n-head " << n_head;
    throw ConfigError(m.str());
  }
  if (!(dropout >= 0.0 && dropout < 1.0)) {
    throw ConfigError("--dropout must be in [0, 1) (got " + std::to_string(dropout) + ")");
  }
  auto one_of = [](const char* flag, const std::string& v, std::initializer_list<const char*> allowed) {
    std::string list;
    for (const char* a : allowed) {
      if (v == a) return;
      list += (list.empty() ? "" : " | ") + std::string(a);
    }
    throw ConfigError(std::string("--") + flag + " must be " + list + " (got '" + v + "')");
  };
  one_of("position", position, {"learned", "rope"});
  one_of("norm", norm, {"layernorm", "rmsnorm"});
  one_of("mlp", mlp, {"gelu", "swiglu"});
  one_of("bias", bias, {"all", "none", "qkv"});
  if (ffn_hidden < 0) throw ConfigError("--ffn-hidden must be positive, or 0 for the feed-forward's rule (got " + std::to_string(ffn_hidden) + ")");
  if (!(layer_norm_eps > 0.0)) throw ConfigError("--norm-eps must be positive");
  // Qwen3's shape: its Hugging Face layout (Qwen3ForCausalLM) is the only one that holds it.
  if (qk_norm && (!rope() || bias != "none"))
    throw ConfigError("--qk-norm is Qwen3's: give it with --position rope and --bias none (got --position " + position + ", --bias " + bias + ")");
  if (head_width > 0 && !rope()) throw ConfigError("--head-dim apart from d-model / n-head is Qwen3's: give it with --position rope");
  if (sliding_window < 0) throw ConfigError("--sliding-window must be 0 (none) or positive (got " + std::to_string(sliding_window) + ")");
  if (sliding_window > 0 && !rope()) throw ConfigError("--sliding-window is Mistral's: give it with --position rope");
  if (rope()) {
    if (head_dim() % 2 != 0) {
      throw ConfigError("--position rope needs an even head width (got " + std::to_string(head_dim()) + ")");
    }
    if (!(rope_theta > 1.0)) throw ConfigError("--rope-theta must be greater than 1 (got " + std::to_string(rope_theta) + ")");
    if (rope_factor != 0.0) {
      if (!(rope_factor >= 1.0)) throw ConfigError("--rope-factor must be 0 (no scaling) or at least 1");
      if (!(rope_low_freq_factor > 0.0 && rope_high_freq_factor > rope_low_freq_factor))
        throw ConfigError("--rope-high-freq-factor must exceed --rope-low-freq-factor, both positive");
      positive("rope-original-context", rope_original_context);
    }
  }
  if (n_experts < 0) throw ConfigError("--n-experts must be 0 (a dense model) or positive (got " + std::to_string(n_experts) + ")");
  if (is_moe()) {
    if (bias == "qkv") {
      throw ConfigError("--bias qkv with --n-experts: an MoE model's experts have biases on both layers or none (--bias all | none)");
    }
    if (top_k < 1 || top_k > n_experts) {
      throw ConfigError("--top-k must be in [1, --n-experts " + std::to_string(n_experts) + "] (got " + std::to_string(top_k) + ")");
    }
    positive("moe-every", moe_every);
    if (!(moe_capacity_factor >= 0.0)) throw ConfigError("--moe-capacity-factor must be 0 (dropless) or positive");
    if (!(moe_aux_loss_coef >= 0.0)) throw ConfigError("--moe-aux-loss-coef must be at least 0");
    if (!(moe_z_loss_coef >= 0.0)) throw ConfigError("--moe-z-loss-coef must be at least 0");
  }
}

namespace {
// One feed-forward's parameters (a dense MLP, or one expert).
int64_t ffn_params(const GPTConfig& c) {
  const int64_t d = c.d_model, F = c.mlp_hidden(), b = c.linear_bias() ? 1 : 0;
  return c.swiglu() ? 2 * d * F + b * 2 * F + F * d + b * d : d * F + b * F + F * d + b * d;
}
}  // namespace

int64_t GPTConfig::num_params() const {
  const int64_t d = d_model, a = attn_width(), kv = n_kv_head * head_dim();
  const int64_t qkv = a + 2 * kv, norm_params = rmsnorm() ? d : 2 * d;
  const int64_t attn = d * qkv + (qkv_bias() ? qkv : 0) + a * d + (linear_bias() ? d : 0) + (qk_norm ? 2 * head_dim() : 0);
  const int64_t block = 2 * norm_params + attn + ffn_params(*this);
  const int64_t moe_extra = n_moe_layers() * ((n_experts - 1) * ffn_params(*this) + n_experts * d);  // E experts and the router, not one MLP
  const int64_t output = tie_embeddings ? 0 : padded_vocab_size() * d;
  return padded_vocab_size() * d + position_params() + n_layer * block + norm_params + output + moe_extra;
}

int64_t GPTConfig::num_active_params() const {
  return num_params() - n_moe_layers() * (n_experts - top_k) * ffn_params(*this);
}

}  // namespace kiln
