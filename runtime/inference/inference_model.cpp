// runtime/inference/inference_model.cpp -- a checkpoint's model for inference (see the header).
#include "runtime/inference/inference_model.h"

#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "distributed/device_check.h"
#include "distributed/error.h"
#include "parallel/tensor_parallel.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/finite_check.h"
#include "runtime/checkpoint/hf_gpt2.h"
#include "runtime/checkpoint/hf_llama.h"
#include "runtime/checkpoint/init_from.h"
#include "runtime/checkpoint/safetensors.h"

namespace kiln {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

json read_json(const fs::path& file, const std::string& command) {
  std::ifstream in(file);
  if (!in) throw ConfigError(command + ": cannot read " + file.string());
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    throw ConfigError(command + ": " + file.string() + ": malformed JSON: " + e.what());
  }
}

// The model's shape from the run's TrainConfig record (and config.json's layer_norm_epsilon).
GPTConfig model_config(const fs::path& dir, const json& state, const std::string& command) {
  const json run = state.value("run", json::object());
  const json saved = run.is_object() ? run.value("config", json::object()) : json::object();
  GPTConfig cfg;
  try {
    cfg.n_layer = saved.at("n_layer").get<int64_t>();
    cfg.n_head = saved.at("n_head").get<int64_t>();
    cfg.n_kv_head = saved.value("n_kv_head", cfg.n_head);
    cfg.d_model = saved.at("d_model").get<int64_t>();
    cfg.seq_len = saved.at("seq_len").get<int64_t>();
    cfg.vocab_size = saved.at("vocab_size").get<int64_t>();
    // MoE (models/moe.h): the routing the model was trained with.
    cfg.n_experts = saved.value("n_experts", int64_t{0});
    cfg.top_k = saved.value("top_k", cfg.top_k);
    cfg.moe_every = saved.value("moe_every", cfg.moe_every);
    cfg.moe_capacity_factor = saved.value("moe_capacity_factor", cfg.moe_capacity_factor);
    cfg.take_architecture(saved);  // the Llama family's fields (absent from a GPT-2 run's record)
  } catch (const json::exception& e) {
    throw ConfigError(command + ": " + (dir / "trainer_state.json").string() + ": run.config lacks the model's shape (" +
                      e.what() + ")");
  }
  cfg.dropout = 0.0;  // inference
  if (fs::exists(dir / "config.json")) {
    const json hf = read_json(dir / "config.json", command);
    if (hf.contains("layer_norm_epsilon") && hf["layer_norm_epsilon"].is_number()) cfg.layer_norm_eps = hf["layer_norm_epsilon"].get<double>();
  }
  cfg.validate();
  return cfg;
}


// A kiln checkpoint's state: the files it reads against the CRC-32s recorded when they were
// written, as a resume checks them (runtime/checkpoint/checkpoint.h): a flipped byte in the
// weights would otherwise give text and exit 0. The weights must be there; the tokenizer's files
// are checked where present; the optimizer's state and the Hugging Face config are not read here.
// Then its step and the model's shape.
void read_kiln_state(CheckpointModel& out, const fs::path& dir, const std::string& command) {
  const json state = read_json(dir / "trainer_state.json", command);
  check_recorded_files(
      out.dir, state.value("files", json::object()), command + ": " + out.dir,
      [](const std::string& f) { return f.rfind("optimizer", 0) != 0 && f != "config.json"; },
      [](const std::string& f) { return f.rfind("model", 0) != 0; });  // the weights, one file or shards and index
  out.step = state.value("step", int64_t{0});
  out.config = model_config(dir, state, command);
}

}  // namespace

CheckpointModel load_checkpoint_model(const std::string& path, c10::Device device, const std::shared_ptr<Communicator>& tp,
                                      const std::string& command) {
  CheckpointModel out;
  out.dir = resolve_checkpoint_dir(path, command);
  const fs::path dir(out.dir);
  if (is_hf_model_dir(out.dir)) {
    // A Hugging Face directory: the shape from config.json, checked as --init-from checks it
    // (runtime/checkpoint/init_from.h), its errors named by --checkpoint; step 0; no recorded
    // CRC-32s to compare with.
    TrainConfig tc;
    tc.init_from = out.dir;
    apply_init_from({}, tc, "--checkpoint");
    out.config = tc.gpt;
    out.config.dropout = 0.0;
    out.config.validate();
  } else {
    read_kiln_state(out, dir, command);
  }
  const GPTConfig& cfg = out.config;
  const int64_t t = tp ? tp->size() : 1, r = tp ? tp->rank() : 0;
  // Every rank reads the whole files: each finds a tensor that is not finite alike, and refuses the
  // load alone once all are read (runtime/checkpoint/finite_check.h).
  NonFiniteTensors bad;
  const std::string where = command + ": " + out.dir;
  // Built on the host, filled from the file one whole tensor at a time, moved to the device.
  out.model = std::make_shared<GPT>(cfg, at::TensorOptions(), t > 1 ? make_tensor_parallel_shard(cfg, tp) : ModelShard{});
  if (!cfg.gpt2_architecture()) {  // the Llama family's layout, its directories' and kiln's (runtime/checkpoint/hf_llama.h)
    const HfWeightFiles files(out.dir);
    match_hf_llama(cfg, files);
    const auto sources = hf_llama_sources(cfg);
    at::NoGradGuard no_grad;
    const GPT whole_shapes(cfg, at::TensorOptions().device(at::kMeta));  // the whole parameters' shapes
    const auto whole = whole_shapes.named_parameters(/*recurse=*/true);
    for (auto& item : out.model->named_parameters(/*recurse=*/true)) {
      const at::Tensor w = read_hf_llama(files, item.key(), sources.at(item.key()), whole[item.key()].sizes().vec(), bad);
      item.value().copy_(tp_slice_of(item.key(), w, cfg, t, r));  // this rank's part under tp
    }
    bad.decide(nullptr, where);
    module_to_device(*out.model, device);
    out.model->eval();
    return out;
  }
  const SafetensorsReader file((dir / "model.safetensors").string());
  const auto names = match_hf_gpt2(cfg, file.specs(), [&](const std::string& name) { return file.read(name); });
  {
    at::NoGradGuard no_grad;
    for (auto& item : out.model->named_parameters(/*recurse=*/true)) {
      const std::string& name = item.key();
      const at::Tensor hf = file.read(names.at(name));
      bad.note(hf, "model.safetensors", names.at(name));
      const at::Tensor whole = from_hf_layout(name, hf, cfg);
      item.value().copy_(tp_slice_of(name, whole, cfg, t, r));
    }
  }
  bad.decide(nullptr, where);
  module_to_device(*out.model, device);
  out.model->eval();
  return out;
}

}  // namespace kiln
