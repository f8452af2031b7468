// tests/hf/llama_fixture.cpp -- writes a kiln model of the Llama family (models/gpt_config.h), under
// kiln's own parameter names, with token sequences and kiln's logits and loss on them, for
// tests/hf/llama_parity.sh to compare with transformers' LlamaForCausalLM / Qwen2ForCausalLM.
//
//   kiln_llama_fixture OUT_DIR llama | qwen2 | llama31 | qwen3
//
// llama:   tiny-llama (4 layers, d 128, 4 query heads over 2 kv heads, SwiGLU F 352, RMSNorm, rotary
//          base 10000, no biases, untied output layer) with a vocabulary of 500 (padded to 512).
// qwen2:   the same with Qwen2's choices: q, k, v biases, tied output layer, RMSNorm eps 1e-6,
//          rotary base 1e6.
// qwen3:   tiny-qwen3: the llama shape with 64-wide heads (the attention 256 wide on d 128: head_dim
//          apart from d / H) and an RMSNorm over each query and key head before the rotary turn,
//          eps 1e-6, base 1e6.
// llama31: llama with Llama-3.1's rotary scaling (factor 8, low 1, high 4) at an original context
//          of 32, so that T = 128's frequencies fall in all three of its bands; base 500000.
// Weights: init_weights(seed), then every parameter perturbed by N(0, 0.1) (norm scales and biases
// included, so one mapped to the wrong place moves the loss); padding rows zero.
// OUT_DIR/kiln.safetensors: every parameter under kiln's name ("wte", "h.0.attn.c_attn.weight",
// ..., "lm_head"), fp32, whole (padding rows too); OUT_DIR/kiln_config.json: the shape;
// OUT_DIR/tokens.json: {"sequences": [[T + 1 ids] x 4], "kiln_loss": L}, L = GPT::loss of inputs
// seq[:, :T] against targets seq[:, 1:]; OUT_DIR/logits.safetensors: "logits" [4, T, V] (the real
// vocabulary's columns), GPT::logits of the inputs.
#include <cstdio>
#include <fstream>
#include <string>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include "distributed/error.h"
#include "models/gpt.h"
#include "runtime/checkpoint/safetensors.h"

int main(int argc, char** argv) {
  const std::string arch = argc == 3 ? argv[2] : "";
  if (arch != "llama" && arch != "qwen2" && arch != "llama31" && arch != "qwen3") {
    std::fprintf(stderr, "usage: %s OUT_DIR llama | qwen2 | llama31 | qwen3\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  try {
    kiln::GPTConfig cfg = kiln::GPTConfig::preset(arch == "qwen3" ? "tiny-qwen3" : "tiny-llama");
    cfg.vocab_size = 500;
    if (arch == "qwen2") {
      cfg.bias = "qkv";
      cfg.tie_embeddings = true;
      cfg.layer_norm_eps = 1e-6;
      cfg.rope_theta = 1e6;
    } else if (arch == "llama31") {
      cfg.rope_theta = 500000.0;
      cfg.rope_factor = 8.0;
      cfg.rope_low_freq_factor = 1.0;
      cfg.rope_high_freq_factor = 4.0;
      cfg.rope_original_context = 32;
    }
    kiln::GPT model(cfg);
    model.init_weights(1234);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(99);
    {
      at::NoGradGuard no_grad;
      for (auto& p : model.parameters()) p.add_(at::normal(0.0, 0.1, p.sizes(), gen));
      const int64_t V = cfg.vocab_size, pad = cfg.padded_vocab_size() - V;
      model.wte.narrow(0, V, pad).zero_();
      if (model.lm_head.defined()) model.lm_head.narrow(0, V, pad).zero_();
    }
    model.eval();

    const int64_t B = 4, T = cfg.seq_len;
    const at::Tensor seq = at::randint(0, cfg.vocab_size, {B, T + 1}, gen, at::kLong);
    const at::Tensor idx = seq.narrow(1, 0, T), targets = seq.narrow(1, 1, T);
    float loss;
    at::Tensor logits;
    {
      at::NoGradGuard no_grad;
      loss = model.loss(idx, targets).item<float>();
      logits = model.logits(idx).narrow(2, 0, cfg.vocab_size).contiguous();
    }

    kiln::NamedTensors params;
    for (const auto& item : model.named_parameters()) params.emplace_back(item.key(), item.value().detach().contiguous());
    kiln::save_safetensors(dir + "/kiln.safetensors", params, {{"format", "pt"}});
    kiln::save_safetensors(dir + "/logits.safetensors", {{"logits", logits}}, {{"format", "pt"}});
    nlohmann::json shape{{"n_layer", cfg.n_layer},
                         {"n_head", cfg.n_head},
                         {"n_kv_head", cfg.n_kv_head},
                         {"d_model", cfg.d_model},
                         {"seq_len", cfg.seq_len},
                         {"vocab_size", cfg.vocab_size},
                         {"ffn_hidden", cfg.mlp_hidden()},
                         {"norm_eps", cfg.layer_norm_eps},
                         {"rope_theta", cfg.rope_theta},
                         {"rope_factor", cfg.rope_factor},
                         {"rope_low_freq_factor", cfg.rope_low_freq_factor},
                         {"rope_high_freq_factor", cfg.rope_high_freq_factor},
                         {"rope_original_context", cfg.rope_original_context},
                         {"bias", cfg.bias},
                         {"tie_embeddings", cfg.tie_embeddings},
                         {"head_dim", cfg.head_dim()},
                         {"arch", arch}};
    nlohmann::json tokens;
    tokens["sequences"] = nlohmann::json::array();
    auto acc = seq.accessor<int64_t, 2>();
    for (int64_t b = 0; b < B; ++b) {
      nlohmann::json row = nlohmann::json::array();
      for (int64_t t = 0; t <= T; ++t) row.push_back(acc[b][t]);
      tokens["sequences"].push_back(row);
    }
    tokens["kiln_loss"] = static_cast<double>(loss);
    for (const auto& [name, text] : {std::pair<std::string, std::string>{"kiln_config.json", shape.dump(2)},
                                     {"tokens.json", tokens.dump()}}) {
      std::ofstream f(dir + "/" + name);
      f << text << "\n";
      if (!f.flush()) throw kiln::Error("cannot write " + dir + "/" + name);
    }
    std::printf("{\"kiln_loss\": %.9g}\n", static_cast<double>(loss));
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "kiln_llama_fixture: %s\n", e.what());
    return e.exit_code();
  }
  return 0;
}
