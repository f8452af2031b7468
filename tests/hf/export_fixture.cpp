// tests/hf/export_fixture.cpp -- writes a kiln model in GPT2LMHeadModel form, with token sequences
// and kiln's own loss on them, for tests/hf/transformers_parity.sh to load with transformers.
//
//   kiln_hf_fixture OUT_DIR [--break-transpose]
//   kiln_hf_fixture OUT_DIR --from-checkpoint CKPT
//
// OUT_DIR/model.safetensors + config.json: the tiny model's shape (4 layers, d 128, T 128) with a
// vocabulary of 500 (padded to 512, so the padding rows exist and must be dropped). Weights:
// init_weights(seed), then every parameter perturbed by N(0, 0.1) -- biases and LayerNorm
// parameters included, so a bias or norm mapped to the wrong place changes the loss, and the
// logits are large enough (std ~1) that the loss is far from log(V) and sensitive to every
// tensor. Padding rows are zero (kiln's convention).
// OUT_DIR/tokens.json: {"sequences": [[T + 1 ids] x 4], "kiln_loss": L}; L is GPT::loss with
// inputs seq[:, :T] and targets seq[:, 1:], as transformers' loss shifts them.
// --break-transpose writes layer 0's attn.c_proj.weight in kiln's [out, in] layout instead of
// Conv1D's [in, out]: the mapping bug no shape check can catch (the matrix is square). The parity
// test checks that this moves transformers' loss off kiln's, i.e. that the comparison can fail.
// --from-checkpoint CKPT: the weights of a checkpoint `kiln train --save-dir` wrote (its shape
// from CKPT/trainer_state.json, its weights read back through load_hf_gpt2); only tokens.json is
// written, and transformers then loads CKPT itself.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include "distributed/error.h"
#include "models/gpt.h"
#include "runtime/checkpoint/hf_gpt2.h"
#include "runtime/checkpoint/safetensors.h"

int main(int argc, char** argv) {
  const bool from_checkpoint = argc == 4 && std::strcmp(argv[2], "--from-checkpoint") == 0;
  if (argc < 2 || (argc == 3 && std::strcmp(argv[2], "--break-transpose") != 0) || (argc == 4 && !from_checkpoint) ||
      argc > 4) {
    std::fprintf(stderr, "usage: %s OUT_DIR [--break-transpose | --from-checkpoint CKPT]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const bool break_transpose = argc == 3;
  try {
    kiln::GPTConfig cfg = kiln::GPTConfig::preset("tiny");
    cfg.vocab_size = 500;
    nlohmann::json shape;
    if (from_checkpoint) {
      std::ifstream in(std::string(argv[3]) + "/trainer_state.json");
      shape = nlohmann::json::parse(in).at("model");
      cfg.n_layer = shape.at("n_layer");
      cfg.n_head = shape.at("n_head");
      cfg.n_kv_head = shape.at("n_kv_head");
      cfg.d_model = shape.at("d_model");
      cfg.seq_len = shape.at("seq_len");
      cfg.vocab_size = shape.at("vocab_size");
    }
    kiln::GPT model(cfg);
    model.init_weights(1234);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(99);
    if (from_checkpoint) {
      kiln::load_hf_gpt2(model, kiln::load_safetensors(std::string(argv[3]) + "/model.safetensors").tensors);
    } else {
      at::NoGradGuard no_grad;
      for (auto& p : model.parameters()) p.add_(at::normal(0.0, 0.1, p.sizes(), gen));
      model.wte.narrow(0, cfg.vocab_size, cfg.padded_vocab_size() - cfg.vocab_size).zero_();
    }
    model.eval();

    const int64_t B = 4, T = cfg.seq_len;
    at::Tensor seq = at::randint(0, cfg.vocab_size, {B, T + 1}, gen, at::kLong);
    float loss;
    {
      at::NoGradGuard no_grad;
      loss = model.loss(seq.narrow(1, 0, T), seq.narrow(1, 1, T)).item<float>();
    }

    auto write_text = [&](const std::string& name, const std::string& text) {
      std::ofstream f(dir + "/" + name);
      f << text << "\n";
      if (!f.flush()) throw kiln::Error("cannot write " + dir + "/" + name);
    };
    nlohmann::json tokens;
    tokens["sequences"] = nlohmann::json::array();
    auto acc = seq.accessor<int64_t, 2>();
    for (int64_t b = 0; b < B; ++b) {
      nlohmann::json row = nlohmann::json::array();
      for (int64_t t = 0; t <= T; ++t) row.push_back(acc[b][t]);
      tokens["sequences"].push_back(row);
    }
    tokens["kiln_loss"] = static_cast<double>(loss);
    write_text("tokens.json", tokens.dump());
    std::printf("{\"kiln_loss\": %.9g}\n", static_cast<double>(loss));
    if (from_checkpoint) return 0;

    kiln::NamedTensors hf = kiln::to_hf_gpt2(model);
    if (break_transpose) {
      for (auto& [name, t] : hf) {
        if (name == "transformer.h.0.attn.c_proj.weight") t = t.t().contiguous();
      }
    }
    kiln::save_safetensors(dir + "/model.safetensors", hf, kiln::hf_safetensors_metadata());
    write_text("config.json", kiln::hf_gpt2_config(cfg).dump(2));
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "kiln_hf_fixture: %s\n", e.what());
    return e.exit_code();
  }
  return 0;
}
