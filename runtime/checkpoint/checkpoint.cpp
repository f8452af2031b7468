// runtime/checkpoint/checkpoint.cpp -- save (gathered tensor by tensor, rank 0 writes, atomic commit) and load
// (rank 0 checks and reads tensor by tensor, every rank keeps its part).
#include "runtime/checkpoint/checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include <fcntl.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include "distributed/comm.h"
#include "distributed/error.h"
#include "distributed/rank0_verdict.h"
#include "models/gpt.h"
#include "runtime/checkpoint/consolidate.h"
#include "runtime/checkpoint/hf_gpt2.h"
#include "runtime/checkpoint/checkpoint_files.h"
#include "runtime/checkpoint/finite_check.h"
#include "runtime/checkpoint/hf_llama.h"
#include "runtime/checkpoint/hf_llama_weights.h"
#include "runtime/checkpoint/safetensors.h"

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

json model_shape(const GPTConfig& c) {
  json j{{"n_layer", c.n_layer},   {"n_head", c.n_head},   {"n_kv_head", c.n_kv_head},
         {"d_model", c.d_model},   {"seq_len", c.seq_len}, {"vocab_size", c.vocab_size},
         {"padded_vocab_size", c.padded_vocab_size()}};
  if (c.is_moe()) j.update({{"n_experts", c.n_experts}, {"moe_every", c.moe_every}});  // which blocks hold experts
  if (!c.gpt2_architecture()) {  // which parameters exist, and their shapes
    j.update({{"position", c.position}, {"norm", c.norm}, {"mlp", c.mlp}, {"ffn_hidden", c.mlp_hidden()},
              {"bias", c.bias}, {"tie_embeddings", c.tie_embeddings}});
  }
  return j;
}

// Test hooks (checkpoint.h): KILN_TEST_CRASH_IN_SAVE=k kills this process (SIGKILL, no clean-up)
// in its k-th save at KILN_TEST_CRASH_POINT (default "weights"), so the crash-safety of the commit
// protocol can be tested. Never set in a real run.
void maybe_crash_in_save(int save_number, const char* point) {
  const char* v = std::getenv("KILN_TEST_CRASH_IN_SAVE");
  const char* at = std::getenv("KILN_TEST_CRASH_POINT");
  if (v == nullptr || std::atoi(v) != save_number) return;
  if (std::string(at ? at : "weights") != point) return;
  std::fprintf(stderr, "kiln: KILN_TEST_CRASH_IN_SAVE=%d: killing this process mid-save (%s)\n", save_number, point);
  std::fflush(stderr);
  std::raise(SIGKILL);
}

void maybe_slow_save() {
  const char* v = std::getenv("KILN_TEST_SLOW_SAVE_S");
  if (v == nullptr) return;
  const double s = std::atof(v);
  std::fprintf(stderr, "kiln: KILN_TEST_SLOW_SAVE_S=%g: the save sleeps\n", s);
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

bool complete(const fs::path& dir) { return fs::is_directory(dir) && fs::exists(dir / "trainer_state.json"); }

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

// The optimizer file's tensors of one parameter.
const std::pair<const char*, CheckpointPart> kOptimizerParts[] = {
    {"exp_avg/", CheckpointPart::ExpAvg}, {"exp_avg_sq/", CheckpointPart::ExpAvgSq}, {"step/", CheckpointPart::Step}};

// The .old-<name>-<pid> directories of save_dir, for step directory `name` ("" for any).
std::vector<fs::path> aside_copies(const std::string& save_dir, const std::string& name) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(save_dir, ec)) {
    const std::string f = e.path().filename().string();
    if (f.rfind(".old-", 0) != 0) continue;
    if (!name.empty() && f.rfind(".old-" + name + "-", 0) != 0) continue;
    out.push_back(e.path());
  }
  return out;
}

// .old-step_N-* copies: deleted when step_N is in place and complete, moved back when it is not
// (a save interrupted between its renames). Returns what it moved back.
std::vector<std::string> settle_aside_copies(const std::string& save_dir) {
  std::vector<std::string> restored;
  std::error_code ec;
  for (const auto& old : aside_copies(save_dir, "")) {
    const std::string f = old.filename().string();          // .old-step_00000020-1234
    const std::string name = f.substr(5, f.rfind('-') - 5);  // step_00000020
    const fs::path target = fs::path(save_dir) / name;
    if (complete(target) || !complete(old)) {
      fs::remove_all(old, ec);
      continue;
    }
    fs::remove_all(target, ec);  // an incomplete leftover, if any
    fs::rename(old, target, ec);
    if (ec) throw Error("checkpoint: cannot move " + old.string() + " back to " + target.string() + ": " + ec.message());
    restored.push_back(name);
  }
  return restored;
}

// Rank 0's side of a load: the checked checkpoint, its files open.
struct OpenCheckpoint {
  json state;
  std::unique_ptr<SafetensorsReader> model, optimizer;
  std::map<std::string, std::string> model_names;  // kiln parameter -> tensor name in model.safetensors
  std::unique_ptr<HfWeightFiles> llama;            // the Llama family's weights (instead of model)
  int64_t bytes = 0;
};

// "; older checkpoints beside it: step_A, step_B (--resume DIR/step_B)" for the complete
// checkpoints of dir's save directory before dir's step, or "". `flag`: the command's own flag
// for a checkpoint (--resume; kiln eval's --checkpoint).
std::string older_checkpoints(const std::string& dir, const std::string& flag) {
  const fs::path p(dir);
  const std::string parent = p.parent_path().string().empty() ? "." : p.parent_path().string();
  const std::string name = p.filename().string();
  if (name.size() != 13 || name.rfind("step_", 0) != 0) return "";
  const int64_t mine = std::stoll(name.substr(5));
  std::string list, newest;
  for (int64_t step : saved_steps(parent)) {
    if (step >= mine) continue;
    list += (list.empty() ? "" : ", ") + step_name(step);
    newest = parent + "/" + step_name(step);
  }
  if (list.empty()) return "; no older checkpoint beside it";
  return "; older checkpoints beside it: " + list + " (" + flag + " " + newest + ")";
}

OpenCheckpoint open_checkpoint(const std::string& dir, const WholeModel& whole, const GPTConfig& cfg, bool weights_only,
                               const std::string& flag) {
  const std::string where = "checkpoint " + dir;
  const std::string state_path = dir + "/trainer_state.json";
  if (!fs::exists(state_path)) throw ConfigError(where + ": no trainer_state.json (not a kiln checkpoint, or an incomplete one)");
  OpenCheckpoint c;
  try {
    c.state = json::parse(read_text(state_path));
  } catch (const json::exception& e) {
    throw DataError(where + ": trainer_state.json is not valid JSON (" + std::string(e.what()) + ")");
  }
  if (c.state.value("format", "") != kFormat) throw DataError(where + ": trainer_state.json is not a kiln checkpoint state");
  if (c.state.value("version", 0) != kFormatVersion) {
    throw DataError(where + ": format version " + std::to_string(c.state.value("version", 0)) + ", this kiln reads " +
                    std::to_string(kFormatVersion));
  }
  const json want = model_shape(cfg);
  const json have = c.state.value("model", json::object());
  std::string diff;
  for (const auto& [key, value] : want.items()) {
    if (have.value(key, json()) != value) {
      diff += (diff.empty() ? "" : ", ") + key + " " + have.value(key, json()).dump() + " (this run: " + value.dump() + ")";
    }
  }
  for (const char* key : {"n_experts", "moe_every"}) {  // an MoE checkpoint for a dense run
    if (have.contains(key) && !want.contains(key)) diff += (diff.empty() ? "" : ", ") + std::string(key) + " " + have[key].dump() + " (this run: dense)";
  }
  if (!diff.empty()) throw ConfigError(where + " is for another model shape: " + diff);
  // Every file against the CRC-32 recorded when it was written (read through, a buffer at a time).
  c.bytes = check_recorded_files(
      dir, c.state.at("files"), where, [&](const std::string& f) { return !(weights_only && f == "optimizer.safetensors"); },
      [](const std::string&) { return false; }, older_checkpoints(dir, flag));
  // Every tensor there, with its shape, before anything is loaded.
  try {
    if (!cfg.gpt2_architecture()) {  // transformers' Llama layout, one file or shards
      c.llama = std::make_unique<HfWeightFiles>(dir);
      match_hf_llama(cfg, *c.llama);
    } else {
      c.model = std::make_unique<SafetensorsReader>(dir + "/model.safetensors");
      c.model_names = match_hf_gpt2(cfg, c.model->specs(), [&](const std::string& n) { return c.model->read(n); });
    }
  } catch (const ConfigError& e) {
    throw ConfigError(where + ": " + e.what());
  }
  if (weights_only) return c;
  c.optimizer = std::make_unique<SafetensorsReader>(dir + "/optimizer.safetensors");
  for (const auto& [name, shape] : whole.params()) {
    for (const auto& [prefix, part] : kOptimizerParts) {
      const std::string key = prefix + name;
      if (!c.optimizer->contains(key)) throw ConfigError(where + ": optimizer.safetensors has no tensor '" + key + "'");
      const auto want_shape = whole.shape_of(name, part);
      if (c.optimizer->spec(key).shape != want_shape) {
        throw ConfigError(where + ": optimizer tensor '" + key + "' has shape " + c10::str(at::IntArrayRef(c.optimizer->spec(key).shape)) +
                          ", this model expects " + c10::str(at::IntArrayRef(want_shape)));
      }
    }
  }
  return c;
}

// Weight `kiln_name` from the model file, in kiln's layout (fp32): read straight into the whole
// tensor where the layouts agree (the embedding's real rows are its first rows); a transposed
// Conv1D weight through `scratch`, one buffer reused for all of them (a fresh one per tensor
// leaves the allocator's heap holding tens of MB after the load); another dtype through a copy.
at::Tensor read_weight(const SafetensorsReader& file, const std::string& file_name, const std::string& kiln_name,
                       const std::vector<int64_t>& shape, const GPTConfig& cfg, at::Tensor& scratch) {
  const TensorSpec& spec = file.spec(file_name);
  at::Tensor whole = at::empty(shape, at::TensorOptions().dtype(at::kFloat));
  if (spec.dtype == at::kFloat && !hf_rows_of_kiln(kiln_name)) {
    const int64_t n = whole.numel();
    if (!scratch.defined() || scratch.numel() < n) scratch = at::empty({n}, at::TensorOptions().dtype(at::kFloat));
    const at::Tensor hf = scratch.narrow(0, 0, n).view(spec.shape);
    file.read_into(file_name, hf);
    whole.copy_(hf.t());  // Conv1D [in, out] -> Linear [out, in]
    return whole;
  }
  if (hf_rows_of_kiln(kiln_name) && !shape.empty() && !spec.shape.empty() && spec.shape[0] > shape[0]) {
    // A longer table than the model's (load_weights: wpe of a model with more positions): its
    // first rows.
    whole.copy_(file.read(file_name).narrow(0, 0, shape[0]));
    return whole;
  }
  if (spec.dtype == at::kFloat && hf_rows_of_kiln(kiln_name)) {
    // The file's rows are the tensor's first rows (all of them but the embedding's padding).
    const int64_t rows = spec.shape.empty() ? 1 : spec.shape[0];
    if (shape.empty()) {
      file.read_into(file_name, whole);
    } else {
      file.read_into(file_name, whole.narrow(0, 0, rows));
      if (rows < shape[0]) whole.narrow(0, rows, shape[0] - rows).zero_();
    }
  } else {
    whole.copy_(from_hf_layout(kiln_name, file.read(file_name), cfg));
  }
  return whole;
}

// The weights, one tensor at a time: rank 0 reads each from `file` (its tensor names[kiln name]),
// notes the first that is not finite in `bad`, and every rank keeps its part. `file` is used on
// rank 0 only.
void stream_weights(WholeModel& state, const SafetensorsReader* file, const std::map<std::string, std::string>& names,
                    PeakTracker& peak, NonFiniteTensors& bad) {
  at::Tensor scratch;
  for (const auto& [pname, shape] : state.params()) {
    at::Tensor whole;
    if (state.writer()) {
      whole = read_weight(*file, names.at(pname), pname, shape, state.config(), scratch);
      bad.note(whole, "model.safetensors", names.at(pname));
    }
    peak.sample();
    state.scatter(pname, CheckpointPart::Param, whole);
  }
}

}  // namespace

json CheckpointIo::to_json() const {
  return json{{"bytes", bytes},
              {"seconds", seconds},
              {"gb_per_s", seconds > 0 ? bytes / seconds / 1e9 : 0.0},
              {"peak_extra_host_gb", peak_extra_bytes / 1e9}};
}

Checkpointer::Checkpointer(std::string save_dir, int64_t keep_last, bool writer)
    : dir_(std::move(save_dir)), keep_last_(keep_last), writer_(writer) {
  if (!writer_) return;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_)) throw ConfigError("--save-dir " + dir_ + ": cannot create the directory (" + ec.message() + ")");
  // A resumed --keep-best run: the best so far stays kept.
  std::string best = fs::exists(dir_ + "/best") ? read_text(dir_ + "/best") : std::string();
  while (!best.empty() && (best.back() == '\n' || best.back() == ' ')) best.pop_back();
  if (best.rfind("step_", 0) == 0) {
    try {
      best_step_ = std::stoll(best.substr(5));
    } catch (const std::exception&) {
      best_step_ = -1;
    }
  }
}

void Checkpointer::mark_best(int64_t step) {
  best_step_ = step;
  if (!writer_) return;
  write_synced(dir_ + "/best.tmp", step_name(step) + "\n");
  if (std::rename((dir_ + "/best.tmp").c_str(), (dir_ + "/best").c_str()) != 0) checkpoint_io_error("cannot rename", dir_ + "/best.tmp");
  fsync_path(dir_, true);
}

std::string Checkpointer::newest_before(int64_t step) const {
  if (!writer_) return "";
  std::string out;
  for (int64_t s : saved_steps(dir_))
    if (s < step) out = dir_ + "/" + step_name(s);
  return out;
}

void Checkpointer::point_latest(int64_t step) {
  if (!writer_) return;
  write_synced(dir_ + "/latest.tmp", step_name(step) + "\n");
  if (std::rename((dir_ + "/latest.tmp").c_str(), (dir_ + "/latest").c_str()) != 0) checkpoint_io_error("cannot rename", dir_ + "/latest.tmp");
  fsync_path(dir_, true);
}

std::string Checkpointer::save(WholeModel& state, const TrainProgress& progress, const json& run, CheckpointIo* io) {
  const auto t0 = std::chrono::steady_clock::now();
  ++saves_;
  PeakTracker peak;
  const GPTConfig& cfg = state.config();
  const std::string name = step_name(progress.step);
  const std::string final_dir = dir_ + "/" + name;
  const std::string tmp = dir_ + "/.tmp-" + name + "-" + std::to_string(::getpid());
  std::error_code ec;
  if (writer_) {
    // Leftovers of crashed saves are never a checkpoint: clear them (moving back an aside copy
    // whose step is gone).
    for (const auto& e : fs::directory_iterator(dir_, ec)) {
      if (e.path().filename().string().rfind(".tmp-", 0) == 0) fs::remove_all(e.path(), ec);
    }
    settle_aside_copies(dir_);
    if (!fs::create_directory(tmp, ec)) throw Error("checkpoint: cannot create " + tmp + ": " + ec.message());
  }

  // 1. every file into the temporary directory, each fsynced; tensors in file order.
  json files = json::object();
  if (!cfg.gpt2_architecture()) {
    write_hf_llama_weights(tmp, state, writer_, files, peak);  // the Llama family: transformers' layout
  } else {
    std::vector<TensorSpec> specs;
    std::map<std::string, std::string> kiln_of;  // HF name -> kiln name
    for (const auto& [pname, shape] : state.params()) {
      specs.push_back({hf_name_of(pname), at::kFloat, hf_shape_of(pname, shape, cfg)});
      kiln_of[specs.back().name] = pname;
    }
    std::unique_ptr<SafetensorsWriter> w;
    if (writer_) w = std::make_unique<SafetensorsWriter>(tmp + "/model.safetensors", specs, hf_safetensors_metadata());
    for (const auto& hf : safetensors_order(specs)) {
      const std::string& pname = kiln_of.at(hf);
      const at::Tensor whole = state.gather(pname, CheckpointPart::Param);
      peak.sample();
      if (w) w->write(hf, to_hf_layout(pname, whole, cfg));
      peak.sample();
    }
    if (w) files["model.safetensors"] = w->finish();
  }
  if (writer_) maybe_crash_in_save(saves_, "weights");
  if (writer_ && !cfg.gpt2_architecture()) {
    write_synced(tmp + "/config.json", hf_llama_config_json(cfg, eot_, ends_, eot_text_).dump(2) + "\n");
    files["config.json"] = crc32_file(tmp + "/config.json");
    write_synced(tmp + "/generation_config.json", hf_llama_generation_config(cfg, eot_, ends_).dump(2) + "\n");
    files["generation_config.json"] = crc32_file(tmp + "/generation_config.json");
  }
  if (writer_ && hf_gpt2_compatible(cfg)) {
    write_synced(tmp + "/config.json", hf_gpt2_config(cfg, eot_, eot_text_).dump(2) + "\n");
    files["config.json"] = crc32_file(tmp + "/config.json");
    write_synced(tmp + "/generation_config.json", hf_generation_config(cfg, eot_).dump(2) + "\n");
    files["generation_config.json"] = crc32_file(tmp + "/generation_config.json");
  }
  if (writer_) {
    for (const auto& [file, text] : tokenizer_files_) {
      write_synced(tmp + "/" + file, text);
      files[file] = crc32_file(tmp + "/" + file);
    }
  }
  {
    std::vector<TensorSpec> specs;
    std::map<std::string, std::pair<std::string, CheckpointPart>> source;  // file name -> (parameter, part)
    for (const auto& [pname, shape] : state.params()) {
      for (const auto& [prefix, part] : kOptimizerParts) {
        specs.push_back({prefix + pname, at::kFloat, state.shape_of(pname, part)});
        source[specs.back().name] = {pname, part};
      }
    }
    std::unique_ptr<SafetensorsWriter> w;
    if (writer_) w = std::make_unique<SafetensorsWriter>(tmp + "/optimizer.safetensors", specs, std::map<std::string, std::string>{{"format", "kiln-adamw"}});
    for (const auto& key : safetensors_order(specs)) {
      const auto& [pname, part] = source.at(key);
      const at::Tensor whole = state.gather(pname, part);
      peak.sample();
      if (w) w->write(key, whole);
    }
    if (w) files["optimizer.safetensors"] = w->finish();
  }
  if (!writer_) return "";

  json state_json{{"format", kFormat},
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
  // Data windows a spike rollback skipped (runtime/trainer/spike_guard.h): a resume skips them too.
  if (!progress.skipped_samples.empty()) state_json["skipped_samples"] = progress.skipped_samples;
  if (progress.rollbacks > 0) state_json["rollbacks"] = progress.rollbacks;
  write_synced(tmp + "/trainer_state.json", state_json.dump(2) + "\n");
  fsync_path(tmp, true);
  maybe_slow_save();

  // 2. into place; an older checkpoint of the same step goes only once the new one is there.
  std::string aside;
  if (fs::exists(final_dir)) {
    aside = dir_ + "/.old-" + name + "-" + std::to_string(::getpid());
    fs::rename(final_dir, aside, ec);
    if (ec) throw Error("checkpoint: cannot move the old " + final_dir + " aside: " + ec.message());
    fsync_path(dir_, true);
    maybe_crash_in_save(saves_, "aside");
  }
  fs::rename(tmp, final_dir, ec);
  if (ec) throw Error("checkpoint: cannot rename " + tmp + " to " + final_dir + ": " + ec.message());
  fsync_path(dir_, true);

  // 3. the pointer, last.
  write_synced(dir_ + "/latest.tmp", name + "\n");
  if (std::rename((dir_ + "/latest.tmp").c_str(), (dir_ + "/latest").c_str()) != 0) checkpoint_io_error("cannot rename", dir_ + "/latest.tmp");
  fsync_path(dir_, true);
  if (!aside.empty()) fs::remove_all(aside, ec);

  // 4. retention.
  if (keep_last_ > 0) {
    auto steps = saved_steps(dir_);
    const int64_t drop = static_cast<int64_t>(steps.size()) - keep_last_;
    for (int64_t i = 0; i < drop; ++i) {
      const int64_t old = steps[static_cast<size_t>(i)];
      if (old != progress.step && old != best_step_) fs::remove_all(dir_ + "/" + step_name(old), ec);
    }
  }
  if (io) {
    io->bytes = 0;
    for (const auto& e : fs::directory_iterator(final_dir, ec))
      if (e.is_regular_file()) io->bytes += static_cast<int64_t>(e.file_size());
    io->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    io->peak_extra_bytes = peak.peak;
  }
  return final_dir;
}

std::string latest_checkpoint(const std::string& save_dir) {
  std::string name = read_text(save_dir + "/latest");
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  if (name.empty()) return "";
  return save_dir + "/" + name;
}

int64_t check_recorded_files(const std::string& dir, const json& files, const std::string& where,
                             const std::function<bool(const std::string&)>& check,
                             const std::function<bool(const std::string&)>& missing_ok, const std::string& hint) {
  int64_t bytes = 0;
  for (const auto& [file, crc] : files.items()) {
    if (!check(file) || !crc.is_number_unsigned()) continue;
    const std::string path = dir + "/" + file;
    if (!fs::exists(path)) {
      if (missing_ok(file)) continue;
      throw DataError(where + ": " + file + " is missing");
    }
    const uint32_t got = crc32_file(path);
    if (got != crc.get<uint32_t>()) {
      throw DataError(where + ": " + file + " is corrupt (CRC-32 " + std::to_string(got) + ", recorded " +
                      std::to_string(crc.get<uint32_t>()) + ")" + hint);
    }
    bytes += static_cast<int64_t>(fs::file_size(path));
  }
  return bytes;
}

bool is_hf_model_dir(const std::string& path) {
  const fs::path p(path);
  return fs::is_directory(p) && !fs::exists(p / "trainer_state.json") && !fs::exists(p / "latest") && fs::exists(p / "config.json") &&
         (fs::exists(p / "model.safetensors") || fs::exists(p / "model.safetensors.index.json"));
}

std::string resolve_checkpoint_dir(const std::string& path, const std::string& command) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) throw ConfigError(command + ": --checkpoint " + path + ": no such directory");
  if (is_hf_model_dir(path)) return path;
  std::string dir = path;
  if (!fs::exists(fs::path(dir) / "trainer_state.json") && fs::exists(fs::path(dir) / "latest")) dir = latest_checkpoint(dir);
  if (!fs::exists(fs::path(dir) / "trainer_state.json")) {
    throw ConfigError(command + ": --checkpoint " + dir + ": no trainer_state.json there (not a kiln checkpoint or save dir)");
  }
  return dir;
}

namespace {
// `latest` of save_dir, repaired when it names a checkpoint that is gone (checkpoint.h).
std::string recovered_latest(const std::string& save_dir, std::string* notice) {
  const std::string latest = latest_checkpoint(save_dir);
  if (latest.empty() || complete(latest)) {
    settle_aside_copies(save_dir);
    return latest;
  }
  const std::string name = fs::path(latest).filename().string();
  const auto restored = settle_aside_copies(save_dir);
  if (complete(latest)) {
    if (notice) *notice = "recovered " + latest + " from its aside copy (a save was interrupted between its renames)";
    return latest;
  }
  // Gone (a save interrupted between its renames), or there without the file a save writes last
  // (a save that did not finish, a copy cut short, a file deleted): said as it is, with the file.
  const std::string what = fs::exists(latest) ? "which is incomplete (" + name + "/trainer_state.json is missing)" : "which is gone";
  const auto steps = saved_steps(save_dir);
  if (steps.empty()) {
    throw ConfigError("--save-dir " + save_dir + ": latest names " + name + ", " + what + ", and no complete checkpoint is left");
  }
  const std::string newest = save_dir + "/" + step_name(steps.back());
  write_synced(save_dir + "/latest.tmp", step_name(steps.back()) + "\n");
  if (std::rename((save_dir + "/latest.tmp").c_str(), (save_dir + "/latest").c_str()) != 0) checkpoint_io_error("cannot rename", save_dir + "/latest.tmp");
  fsync_path(save_dir, true);
  std::string again;  // the steps between the two, which the run trains again
  if (name.size() == 13 && name.rfind("step_", 0) == 0 && name.find_first_not_of("0123456789", 5) == std::string::npos) {
    const int64_t lost = std::stoll(name.substr(5));
    if (lost > steps.back()) again = ": steps " + std::to_string(steps.back() + 1) + "-" + std::to_string(lost) + " are trained again";
  }
  if (notice) *notice = "warning: latest named " + name + ", " + what + "; falling back to the newest complete checkpoint, " + newest + again;
  return newest;
}
}  // namespace

std::string resolve_resume(const std::string& resume, const std::string& save_dir, std::string* notice) {
  if (resume == "none") {
    if (!save_dir.empty() && !latest_checkpoint(save_dir).empty()) {
      throw ConfigError("--save-dir " + save_dir + " already holds checkpoints (latest: " + latest_checkpoint(save_dir) +
                        "); --resume none would overwrite them: resume with --resume auto, or choose another --save-dir");
    }
    return "";
  }
  if (resume == "auto") return save_dir.empty() ? "" : recovered_latest(save_dir, notice);
  if (fs::exists(resume + "/trainer_state.json")) return resume;
  if (fs::exists(resume + "/latest")) return recovered_latest(resume, notice);
  throw ConfigError("--resume " + resume + ": no checkpoint there (neither a trainer_state.json nor a 'latest' file)");
}

std::optional<Resumed> resume_training(const std::string& resume, const std::string& save_dir, WholeModel& state,
                                       Communicator* world, bool weights_only, const std::string& flag) {
  const auto t0 = std::chrono::steady_clock::now();
  const bool root = state.writer();
  const GPTConfig& cfg = state.config();
  PeakTracker peak;
  // Rank 0 alone looks at the files; its verdict travels as one string: a kind, then the
  // checkpoint directory or the error. Kinds: F fresh start, L loaded, C config error, D data error.
  std::string verdict, notice;
  OpenCheckpoint c;
  if (root) {
    try {
      const std::string dir = resolve_resume(resume, save_dir, &notice);
      if (dir.empty()) {
        verdict = "F";
      } else {
        c = open_checkpoint(dir, state, cfg, weights_only, flag);
        verdict = "L" + dir;
      }
    } catch (const ConfigError& e) {
      verdict = std::string("C") + e.what();
    } catch (const Error& e) {
      verdict = std::string("D") + e.what();
    }
  }
  const bool multi = world != nullptr && world->size() > 1;
  if (multi) verdict = broadcast_string(*world, verdict);
  const char kind = verdict[0];
  const std::string rest = verdict.substr(1);
  if (kind == 'C') throw ConfigError(rest);
  if (kind == 'D') throw DataError(rest);
  if (kind == 'F') return std::nullopt;
  json st = multi ? json::parse(broadcast_string(*world, root ? c.state.dump() : std::string())) : c.state;

  // The tensors, one at a time: rank 0 reads each and every rank keeps its part; a tensor that is
  // not finite refuses the checkpoint once all are streamed (runtime/checkpoint/finite_check.h).
  NonFiniteTensors bad;
  if (!state.config().gpt2_architecture()) stream_hf_llama(state, c.llama.get(), peak, bad);
  else stream_weights(state, c.model.get(), c.model_names, peak, bad);
  for (const auto& [pname, shape] : state.params()) {
    if (weights_only) break;  // kiln eval: AdamW's state is not needed
    for (const auto& [prefix, part] : kOptimizerParts) {
      at::Tensor whole;
      if (root) {
        const std::string key = prefix + pname;
        if (c.optimizer->spec(key).dtype == at::kFloat) {
          whole = at::empty(c.optimizer->spec(key).shape, at::TensorOptions().dtype(at::kFloat));
          c.optimizer->read_into(key, whole);
        } else {
          whole = c.optimizer->read(key).to(at::kFloat);
        }
        bad.note(whole, "optimizer.safetensors", key);
      }
      peak.sample();
      state.scatter(pname, part, whole);
    }
  }
  bad.decide(world, "checkpoint " + rest);
  Resumed r;
  r.dir = rest;
  r.notice = notice;
  r.progress.step = st.at("step").get<int64_t>();
  r.progress.updates = st.at("updates").get<int64_t>();
  r.progress.samples = st.at("samples").get<int64_t>();
  r.progress.loss_scaler = st.at("loss_scaler");
  r.progress.skipped_samples = st.value("skipped_samples", std::vector<std::pair<int64_t, int64_t>>{});
  r.progress.rollbacks = st.value("rollbacks", int64_t{0});
  r.run = st.value("run", json::object());
  r.io.bytes = c.bytes;
  r.io.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.io.peak_extra_bytes = peak.peak;
  return r;
}

CheckpointIo load_weights(const std::string& dir, WholeModel& state, Communicator* world, const std::string& flag) {
  const auto t0 = std::chrono::steady_clock::now();
  // The Llama family's weights are in transformers' layout, in its directories and kiln's alike.
  if (!state.config().gpt2_architecture()) return load_hf_llama_weights(dir, state, world, flag);
  const std::string where = flag + " " + dir;
  PeakTracker peak;
  std::unique_ptr<SafetensorsReader> file;
  std::map<std::string, std::string> names;
  CheckpointIo io;
  // Rank 0 checks the file (and, for a kiln checkpoint, its recorded CRC-32) before anything moves.
  decide_on_rank0(world, [&] {
    const std::string path = dir + "/model.safetensors";
    if (!fs::exists(path)) throw ConfigError(where + ": no model.safetensors there");
    if (fs::exists(dir + "/trainer_state.json")) {
      json st;
      try {
        st = json::parse(read_text(dir + "/trainer_state.json"));
      } catch (const json::exception& e) {
        throw DataError(where + ": trainer_state.json is not valid JSON (" + std::string(e.what()) + ")");
      }
      check_recorded_files(dir, st.value("files", json::object()), where, [](const std::string& f) { return f == "model.safetensors"; },
                           [](const std::string&) { return false; });
    }
    file = std::make_unique<SafetensorsReader>(path);
    // The model's shape, with the file's number of positions where it has more (their first rows).
    GPTConfig file_cfg = state.config();
    for (const char* wpe : {"transformer.wpe.weight", "wpe.weight"}) {
      if (file->contains(wpe) && file->spec(wpe).shape.size() == 2 && file->spec(wpe).shape[0] > file_cfg.seq_len) {
        file_cfg.seq_len = file->spec(wpe).shape[0];
      }
    }
    try {
      names = match_hf_gpt2(file_cfg, file->specs(), [&](const std::string& n) { return file->read(n); });
    } catch (const ConfigError& e) {
      throw ConfigError(where + ": " + e.what());
    }
    io.bytes = static_cast<int64_t>(fs::file_size(path));
  });
  NonFiniteTensors bad;
  stream_weights(state, file.get(), names, peak, bad);
  bad.decide(world, where);
  io.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  io.peak_extra_bytes = peak.peak;
  return io;
}

}  // namespace kiln
