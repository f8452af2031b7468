// models/gpt_config.cpp -- presets, validation and parameter count of GPTConfig.
#include "models/gpt_config.h"

#include <sstream>

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
}  // namespace

std::vector<std::string> GPTConfig::preset_names() {
  return {"tiny", "tiny-moe", "gpt2-124m", "gpt2-124m-moe", "gpt2-350m", "gpt2-774m", "gpt2-1.5b", "gpt3-6.7b"};
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
  if (d_model % n_head != 0) {
    std::ostringstream m;
    m << "--n-head " << n_head << " does not divide --d-model " << d_model;
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
  if (n_experts < 0) throw ConfigError("--n-experts must be 0 (a dense model) or positive (got " + std::to_string(n_experts) + ")");
  if (is_moe()) {
    if (top_k < 1 || top_k > n_experts) {
      throw ConfigError("--top-k must be in [1, --n-experts " + std::to_string(n_experts) + "] (got " + std::to_string(top_k) + ")");
    }
    positive("moe-every", moe_every);
    if (!(moe_capacity_factor >= 0.0)) throw ConfigError("--moe-capacity-factor must be 0 (dropless) or positive");
    if (!(moe_aux_loss_coef >= 0.0)) throw ConfigError("--moe-aux-loss-coef must be at least 0");
    if (!(moe_z_loss_coef >= 0.0)) throw ConfigError("--moe-z-loss-coef must be at least 0");
  }
}

int64_t GPTConfig::num_params() const {
  const int64_t d = d_model, F = mlp_hidden(), kv = n_kv_head * head_dim();
  const int64_t qkv = d + 2 * kv;
  const int64_t block = 2 * d + (d * qkv + qkv) + (d * d + d) + 2 * d + (d * F + F) + (F * d + d);
  const int64_t mlp = (d * F + F) + (F * d + d);
  const int64_t moe_extra = n_moe_layers() * ((n_experts - 1) * mlp + n_experts * d);  // E experts and the router, not one MLP
  return padded_vocab_size() * d + seq_len * d + n_layer * block + 2 * d + moe_extra;
}

int64_t GPTConfig::num_active_params() const {
  const int64_t d = d_model, F = mlp_hidden();
  const int64_t mlp = (d * F + F) + (F * d + d);
  return num_params() - n_moe_layers() * (n_experts - top_k) * mlp;
}

}  // namespace kiln
