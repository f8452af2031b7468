// runtime/checkpoint.cpp -- save (rank 0, atomic commit) and load (rank 0 reads, broadcast).
#include "runtime/checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fcntl.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include "models/gpt.h"
#include "models/hf_gpt2.h"
#include "optim/adamw.h"
#include "runtime/comm.h"
#include "runtime/device_check.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"

namespace kiln {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormat = "kiln-checkpoint";
constexpr int kFormatVersion = 1;

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

[[noreturn]] void io_error(const std::string& what, const std::string& path) {
  throw Error("checkpoint: " + what + " " + path + ": " + std::strerror(errno));
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) io_error("cannot open", path);
  if (::fsync(fd) != 0) {
    ::close(fd);
    io_error("cannot fsync", path);
  }
  ::close(fd);
}

void write_synced(const std::string& path, const std::string& text) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) io_error("cannot create", path);
    out << text;
    out.flush();
    if (!out) io_error("cannot write", path);
  }
  fsync_path(path, false);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json model_shape(const GPTConfig& c) {
  return {{"n_layer", c.n_layer},   {"n_head", c.n_head},   {"n_kv_head", c.n_kv_head},
          {"d_model", c.d_model},   {"seq_len", c.seq_len}, {"vocab_size", c.vocab_size},
          {"padded_vocab_size", c.padded_vocab_size()}};
}

// A test hook: KILN_TEST_CRASH_IN_SAVE=k kills this process (SIGKILL, no clean-up) in the
// middle of its k-th save, after the weights are written and before the commit, so the
// crash-safety of the commit protocol can be tested. Never set in a real run.
void maybe_crash_in_save(int save_number) {
  const char* v = std::getenv("KILN_TEST_CRASH_IN_SAVE");
  if (v != nullptr && std::atoi(v) == save_number) {
    std::fprintf(stderr, "kiln: KILN_TEST_CRASH_IN_SAVE=%d: killing this process mid-save\n", save_number);
    std::fflush(stderr);
    std::raise(SIGKILL);
  }
}

// Step numbers of the complete checkpoints in dir, ascending.
std::vector<int64_t> saved_steps(const std::string& dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() == 13 && name.rfind("step_", 0) == 0 && e.is_directory() &&
        fs::exists(e.path() / "trainer_state.json")) {
      steps.push_back(std::stoll(name.substr(5)));
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

// Broadcasts a string from rank 0 over `world` (a uint8 tensor on `device`).
std::string broadcast_string(Communicator& world, const std::string& s, const c10::Device& device) {
  auto len = to_device(at::tensor({static_cast<int64_t>(s.size())}, at::kLong), device);
  world.broadcast(len, 0)->wait();
  const int64_t n = len.cpu().item<int64_t>();
  auto bytes = at::empty({n}, at::kByte);
  if (world.rank() == 0 && n > 0) std::memcpy(bytes.data_ptr<uint8_t>(), s.data(), static_cast<size_t>(n));
  bytes = to_device(bytes, device);
  if (n > 0) world.broadcast(bytes, 0)->wait();
  bytes = bytes.cpu();
  return std::string(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), static_cast<size_t>(n));
}

// Rank 0's part of a load: read, check, copy into model and optimizer. Returns the state JSON.
json read_checkpoint(const std::string& dir, GPT& model, AdamW& optimizer) {
  const std::string where = "checkpoint " + dir;
  const std::string state_path = dir + "/trainer_state.json";
  if (!fs::exists(state_path)) throw ConfigError(where + ": no trainer_state.json (not a kiln checkpoint, or an incomplete one)");
  json state;
  try {
    state = json::parse(read_text(state_path));
  } catch (const json::exception& e) {
    throw DataError(where + ": trainer_state.json is not valid JSON (" + std::string(e.what()) + ")");
  }
  if (state.value("format", "") != kFormat) throw DataError(where + ": trainer_state.json is not a kiln checkpoint state");
  if (state.value("version", 0) != kFormatVersion) {
    throw DataError(where + ": format version " + std::to_string(state.value("version", 0)) + ", this kiln reads " +
                    std::to_string(kFormatVersion));
  }
  const json want = model_shape(model.config());
  const json have = state.value("model", json::object());
  std::string diff;
  for (const auto& [key, value] : want.items()) {
    if (have.value(key, json()) != value) {
      diff += (diff.empty() ? "" : ", ") + key + " " + have.value(key, json()).dump() + " (this run: " + value.dump() + ")";
    }
  }
  if (!diff.empty()) throw ConfigError(where + " is for another model shape: " + diff);
  // Every file against the CRC-32 recorded when it was written.
  for (const auto& [file, crc] : state.at("files").items()) {
    const std::string path = dir + "/" + file;
    if (!fs::exists(path)) throw DataError(where + ": " + file + " is missing");
    const uint32_t got = crc32_file(path);
    if (got != crc.get<uint32_t>()) {
      throw DataError(where + ": " + file + " is corrupt (CRC-32 " + std::to_string(got) + ", recorded " +
                      std::to_string(crc.get<uint32_t>()) + ")");
    }
  }
  auto weights = load_safetensors(dir + "/model.safetensors");
  try {
    load_hf_gpt2(model, weights.tensors);
  } catch (const ConfigError& e) {
    throw ConfigError(where + ": " + e.what());
  }
  auto opt = load_safetensors(dir + "/optimizer.safetensors");
  at::NoGradGuard no_grad;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const auto st = optimizer.state_of(item.value());
    const std::pair<const char*, at::Tensor> parts[] = {
        {"exp_avg/", st.exp_avg}, {"exp_avg_sq/", st.exp_avg_sq}, {"step/", st.step}};
    for (const auto& [prefix, dst] : parts) {
      const std::string key = prefix + item.key();
      auto it = opt.tensors.find(key);
      if (it == opt.tensors.end()) throw ConfigError(where + ": optimizer.safetensors has no tensor '" + key + "'");
      if (it->second.sizes() != dst.sizes()) {
        throw ConfigError(where + ": optimizer tensor '" + key + "' has shape " + c10::str(it->second.sizes()) +
                          ", this model expects " + c10::str(dst.sizes()));
      }
      at::Tensor(dst).copy_(it->second);
    }
  }
  return state;
}

}  // namespace

Checkpointer::Checkpointer(std::string save_dir, int64_t keep_last) : dir_(std::move(save_dir)), keep_last_(keep_last) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_)) throw ConfigError("--save-dir " + dir_ + ": cannot create the directory (" + ec.message() + ")");
}

std::string Checkpointer::save(const GPT& model, const AdamW& optimizer, const TrainProgress& progress, const json& run) {
  ++saves_;
  const std::string name = step_name(progress.step);
  const std::string final_dir = dir_ + "/" + name;
  const std::string tmp = dir_ + "/.tmp-" + name + "-" + std::to_string(::getpid());
  std::error_code ec;
  // Leftovers of crashed saves are never a checkpoint: clear them.
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    if (e.path().filename().string().rfind(".tmp-", 0) == 0) fs::remove_all(e.path(), ec);
  }
  if (!fs::create_directory(tmp, ec)) throw Error("checkpoint: cannot create " + tmp + ": " + ec.message());

  // 1. every file into the temporary directory, each fsynced.
  json files = json::object();
  save_safetensors(tmp + "/model.safetensors", to_hf_gpt2(model), {{"format", "pt"}});
  files["model.safetensors"] = crc32_file(tmp + "/model.safetensors");
  maybe_crash_in_save(saves_);
  const GPTConfig& cfg = model.config();
  if (cfg.n_kv_head == cfg.n_head) {
    write_synced(tmp + "/config.json", hf_gpt2_config(cfg).dump(2) + "\n");
    files["config.json"] = crc32_file(tmp + "/config.json");
  }
  NamedTensors opt;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const auto st = optimizer.state_of(item.value());
    opt.emplace_back("exp_avg/" + item.key(), st.exp_avg.detach().cpu());
    opt.emplace_back("exp_avg_sq/" + item.key(), st.exp_avg_sq.detach().cpu());
    opt.emplace_back("step/" + item.key(), st.step.detach().cpu());
  }
  save_safetensors(tmp + "/optimizer.safetensors", opt, {{"format", "kiln-adamw"}});
  files["optimizer.safetensors"] = crc32_file(tmp + "/optimizer.safetensors");
  const json state{{"format", kFormat},
                   {"version", kFormatVersion},
                   {"step", progress.step},
                   {"updates", progress.updates},
                   {"samples", progress.samples},
                   {"loss_scaler", progress.loss_scaler},
                   {"model", model_shape(cfg)},
                   {"rng", "dropout reseeded every step from (seed, step, dp rank): the step is the RNG state"},
                   {"run", run},
                   {"kiln_version", KILN_VERSION},
                   {"files", files}};
  write_synced(tmp + "/trainer_state.json", state.dump(2) + "\n");
  fsync_path(tmp, true);

  // 2. into place; an older checkpoint of the same step goes only once the new one is there.
  std::string aside;
  if (fs::exists(final_dir)) {
    aside = dir_ + "/.old-" + name + "-" + std::to_string(::getpid());
    fs::rename(final_dir, aside, ec);
    if (ec) throw Error("checkpoint: cannot move the old " + final_dir + " aside: " + ec.message());
  }
  fs::rename(tmp, final_dir, ec);
  if (ec) throw Error("checkpoint: cannot rename " + tmp + " to " + final_dir + ": " + ec.message());
  fsync_path(dir_, true);

  // 3. the pointer, last.
  write_synced(dir_ + "/latest.tmp", name + "\n");
  if (std::rename((dir_ + "/latest.tmp").c_str(), (dir_ + "/latest").c_str()) != 0) io_error("cannot rename", dir_ + "/latest.tmp");
  fsync_path(dir_, true);
  if (!aside.empty()) fs::remove_all(aside, ec);

  // 4. retention.
  if (keep_last_ > 0) {
    auto steps = saved_steps(dir_);
    const int64_t drop = static_cast<int64_t>(steps.size()) - keep_last_;
    for (int64_t i = 0; i < drop; ++i) {
      if (steps[static_cast<size_t>(i)] != progress.step) fs::remove_all(dir_ + "/" + step_name(steps[static_cast<size_t>(i)]), ec);
    }
  }
  return final_dir;
}

std::string latest_checkpoint(const std::string& save_dir) {
  std::string name = read_text(save_dir + "/latest");
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  if (name.empty()) return "";
  return save_dir + "/" + name;
}

std::string resolve_resume(const std::string& resume, const std::string& save_dir) {
  if (resume == "none") {
    if (!save_dir.empty() && !latest_checkpoint(save_dir).empty()) {
      throw ConfigError("--save-dir " + save_dir + " already holds checkpoints (latest: " + latest_checkpoint(save_dir) +
                        "); --resume none would overwrite them: resume with --resume auto, or choose another --save-dir");
    }
    return "";
  }
  if (resume == "auto") return save_dir.empty() ? "" : latest_checkpoint(save_dir);
  if (fs::exists(resume + "/trainer_state.json")) return resume;
  const std::string latest = latest_checkpoint(resume);
  if (!latest.empty()) return latest;
  throw ConfigError("--resume " + resume + ": no checkpoint there (neither a trainer_state.json nor a 'latest' file)");
}

std::optional<Resumed> resume_training(const std::string& resume, const std::string& save_dir, GPT& model,
                                       const std::function<AdamW&()>& optimizer, Communicator* world) {
  const bool root = world == nullptr || world->rank() == 0;
  // Rank 0 alone looks at the files; its verdict travels as one string: a kind, then the
  // checkpoint directory or the error. Kinds: F fresh start, L loaded, C config error, D data error.
  std::string verdict;
  json state;
  if (root) {
    try {
      const std::string dir = resolve_resume(resume, save_dir);
      if (dir.empty()) {
        verdict = "F";
      } else {
        state = read_checkpoint(dir, model, optimizer());
        verdict = "L" + dir;
      }
    } catch (const ConfigError& e) {
      verdict = std::string("C") + e.what();
    } catch (const Error& e) {
      verdict = std::string("D") + e.what();
    }
  }
  const c10::Device device = model.wte.device();
  const bool multi = world != nullptr && world->size() > 1;
  if (multi) verdict = broadcast_string(*world, verdict, device);
  const char kind = verdict[0];
  const std::string rest = verdict.substr(1);
  if (kind == 'C') throw ConfigError(rest);
  if (kind == 'D') throw DataError(rest);
  if (kind == 'F') return std::nullopt;
  if (multi) {
    state = json::parse(broadcast_string(*world, root ? state.dump() : std::string(), device));
    at::NoGradGuard no_grad;
    AdamW& opt = optimizer();
    for (auto& p : model.parameters()) {
      auto st = opt.state_of(p);
      at::Tensor tensors[] = {p, st.exp_avg, st.exp_avg_sq, st.step};
      for (auto& t : tensors) world->broadcast(t, 0)->wait();
    }
  }
  Resumed r;
  r.dir = rest;
  r.progress.step = state.at("step").get<int64_t>();
  r.progress.updates = state.at("updates").get<int64_t>();
  r.progress.samples = state.at("samples").get<int64_t>();
  r.progress.loss_scaler = state.at("loss_scaler");
  optimizer().set_steps_taken(r.progress.updates);
  return r;
}

}  // namespace kiln
