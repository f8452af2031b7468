// runtime/checkpoint/hf_llama_weights.cpp -- the Llama family's weights in and out of a directory in
// transformers' layout (hf_llama_weights.h), one kiln parameter at a time.
#include "runtime/checkpoint/hf_llama_weights.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "distributed/comm.h"
#include "distributed/error.h"
#include "distributed/rank0_verdict.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/consolidate.h"
#include "runtime/checkpoint/finite_check.h"
#include "runtime/checkpoint/hf_gpt2.h"  // hf_safetensors_metadata
#include "runtime/checkpoint/hf_llama.h"
#include "runtime/checkpoint/safetensors.h"

namespace kiln {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Shards of a Llama-family checkpoint: save_pretrained's 5 GB by default (transformers 4.x's
// max_shard_size); the test-only KILN_TEST_HF_SHARD_BYTES lowers it so that tiny models shard.
int64_t hf_shard_bytes() {
  const char* v = std::getenv("KILN_TEST_HF_SHARD_BYTES");
  return v != nullptr && std::atoll(v) > 0 ? std::atoll(v) : int64_t{5'000'000'000};
}



}  // namespace

void stream_hf_llama(WholeModel& state, const HfWeightFiles* files, PeakTracker& peak, NonFiniteTensors& bad) {
  const auto sources = hf_llama_sources(state.config());
  for (const auto& [pname, shape] : state.params()) {
    at::Tensor whole;
    if (state.writer()) whole = read_hf_llama(*files, pname, sources.at(pname), shape, bad);
    peak.sample();
    state.scatter(pname, CheckpointPart::Param, whole);
  }
}

// The weights of a Llama-family model as transformers' save_pretrained lays them out
// (runtime/checkpoint/hf_llama.h): its tensor names, one model.safetensors or, above the shard
// size, model-0000k-of-0000n.safetensors with model.safetensors.index.json. Each kiln parameter is
// gathered once and its pieces (q / k / v, gate / up, the vocabulary's real rows) written where
// the header puts them.
void write_hf_llama_weights(const std::string& tmp, WholeModel& state, bool writer, json& files, PeakTracker& peak) {
  const GPTConfig& cfg = state.config();
  std::vector<std::pair<std::string, HfPiece>> pieces;  // (kiln parameter, piece), in parameter order
  std::vector<int64_t> bytes;
  for (const auto& [pname, shape] : state.params()) {
    for (auto& piece : hf_llama_pieces(cfg, pname)) {
      int64_t n = 4;
      for (const int64_t d : piece.shape) n *= d;
      bytes.push_back(n);
      pieces.emplace_back(pname, std::move(piece));
    }
  }
  const std::vector<int> shard = hf_shard_of(bytes, hf_shard_bytes());
  const int shards = pieces.empty() ? 1 : shard.back() + 1;
  auto file_of = [&](int s) { return shards == 1 ? std::string("model.safetensors") : hf_shard_name(s, shards); };
  std::vector<std::unique_ptr<SafetensorsWriter>> w(static_cast<size_t>(shards));
  if (writer) {
    std::vector<std::vector<TensorSpec>> specs(static_cast<size_t>(shards));
    for (size_t i = 0; i < pieces.size(); ++i) specs[static_cast<size_t>(shard[i])].push_back({pieces[i].second.name, at::kFloat, pieces[i].second.shape});
    for (int s = 0; s < shards; ++s)
      w[static_cast<size_t>(s)] = std::make_unique<SafetensorsWriter>(tmp + "/" + file_of(s), specs[static_cast<size_t>(s)], hf_safetensors_metadata());
  }
  size_t i = 0;
  for (const auto& [pname, shape] : state.params()) {
    const at::Tensor whole = state.gather(pname, CheckpointPart::Param);
    peak.sample();
    for (; i < pieces.size() && pieces[i].first == pname; ++i) {
      const HfPiece& p = pieces[i].second;
      const int64_t rows = p.shape.empty() ? 1 : p.shape[0];
      if (writer) w[static_cast<size_t>(shard[i])]->write(p.name, hf_rows_view(whole).narrow(0, p.row, rows).contiguous());
    }
  }
  if (!writer) return;
  json weight_map = json::object();
  int64_t total = 0;
  for (size_t k = 0; k < pieces.size(); ++k) {
    weight_map[pieces[k].second.name] = file_of(shard[k]);
    total += bytes[k];
  }
  for (int s = 0; s < shards; ++s) files[file_of(s)] = w[static_cast<size_t>(s)]->finish();
  if (shards > 1) {
    const json index{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_synced(tmp + "/model.safetensors.index.json", index.dump(2) + "\n");
    files["model.safetensors.index.json"] = crc32_file(tmp + "/model.safetensors.index.json");
  }
}

// A Hugging Face Llama-family directory (runtime/checkpoint/hf_llama.h): each kiln parameter made
// on rank 0 from its source tensors, then scattered as load_weights does.
CheckpointIo load_hf_llama_weights(const std::string& dir, WholeModel& state, Communicator* world, const std::string& flag) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string where = flag + " " + dir;
  PeakTracker peak;
  std::unique_ptr<HfWeightFiles> files;
  CheckpointIo io;
  decide_on_rank0(world, [&] {
    if (fs::exists(dir + "/trainer_state.json")) {  // a kiln checkpoint: its weights' recorded CRC-32s first
      json st;
      try {
        st = json::parse(read_text(dir + "/trainer_state.json"));
      } catch (const json::exception& e) {
        throw DataError(where + ": trainer_state.json is not valid JSON (" + std::string(e.what()) + ")");
      }
      check_recorded_files(dir, st.value("files", json::object()), where,
                           [](const std::string& f) { return f.rfind("model", 0) == 0; }, [](const std::string&) { return false; });
    }
    files = std::make_unique<HfWeightFiles>(dir);
    try {
      match_hf_llama(state.config(), *files);
    } catch (const ConfigError& e) {
      throw ConfigError(where + ": " + e.what());
    }
    io.bytes = files->bytes();
  });
  NonFiniteTensors bad;
  stream_hf_llama(state, files.get(), peak, bad);
  bad.decide(world, where);
  io.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  io.peak_extra_bytes = peak.peak;
  return io;
}

}  // namespace kiln
