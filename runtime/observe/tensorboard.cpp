// runtime/observe/tensorboard.cpp -- TensorBoard event files (see the header for the format).
#include "runtime/observe/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "distributed/error.h"

namespace kiln {

namespace {

using json = nlohmann::json;

// ---- protobuf wire format: the few encodings an Event needs --------------------------------
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

template <typename T>
void little_endian(std::string& out, T v) {  // fixed32 / fixed64 fields (x86 and ARM are little-endian)
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  out.append(bytes, sizeof(T));
}

void tag(std::string& out, int field, int wire_type) { varint(out, static_cast<uint64_t>(field << 3 | wire_type)); }

void length_delimited(std::string& out, int field, const std::string& bytes) {
  tag(out, field, 2);
  varint(out, bytes.size());
  out += bytes;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Event { wall_time = 1 (double); step = 2 (int64) } and the caller's one field after them.
std::string event_head(int64_t step) {
  std::string e;
  tag(e, 1, 1);
  little_endian(e, now_seconds());
  tag(e, 2, 0);
  varint(e, static_cast<uint64_t>(step));
  return e;
}

uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t start_step) : start_step_(start_step) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    throw ConfigError("--tensorboard " + dir + ": cannot create the directory (" + (ec ? ec.message() : "not a directory") + ")");
  }
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<long long>(now_seconds())) + "." + host + "." +
          std::to_string(::getpid()) + ".kiln";
  file_ = std::fopen(path_.c_str(), "wb");
  if (file_ == nullptr) throw ConfigError("--tensorboard " + dir + ": cannot create " + path_ + ": " + std::strerror(errno));
  std::string version = event_head(0);
  length_delimited(version, 3, "brain.Event:2");
  write_event(version);
  if (start_step > 0) {
    std::string session;  // SessionLog { status = START (1) }
    tag(session, 1, 0);
    varint(session, 1);
    std::string e = event_head(start_step + 1);
    length_delimited(e, 7, session);
    write_event(e);
  }
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::write_event(const std::string& event) {
  if (file_ == nullptr) return;
  std::string rec;
  const uint64_t n = event.size();
  little_endian(rec, n);
  little_endian(rec, masked(crc32c(rec.data(), 8)));
  rec += event;
  little_endian(rec, masked(crc32c(event.data(), event.size())));
  if (std::fwrite(rec.data(), 1, rec.size(), file_) != rec.size() || std::fflush(file_) != 0) {
    std::fprintf(stderr, "kiln: warning: --tensorboard: cannot write %s (%s): no more TensorBoard scalars this run\n", path_.c_str(),
                 std::strerror(errno));
    std::fclose(file_);
    file_ = nullptr;
  }
}

void TensorBoardWriter::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  std::string summary;
  for (const auto& [name, v] : values) {
    std::string value;
    length_delimited(value, 1, name);
    tag(value, 2, 5);
    little_endian(value, static_cast<float>(v));
    length_delimited(summary, 1, value);
  }
  std::string e = event_head(step);
  length_delimited(e, 5, summary);
  write_event(e);
}

// One Value of a plugin's summary -- its tag, a tensor, and metadata naming the plugin (with its
// content, when it has one) -- as one Event at `step`.
void TensorBoardWriter::plugin_summary(int64_t step, const std::string& tag_name, const std::string& plugin_name,
                                       const std::string& content, const std::string& tensor) {
  std::string plugin, metadata, value, summary;
  length_delimited(plugin, 1, plugin_name);
  if (!content.empty()) length_delimited(plugin, 2, content);
  length_delimited(metadata, 1, plugin);
  length_delimited(value, 1, tag_name);
  length_delimited(value, 8, tensor);
  length_delimited(value, 9, metadata);
  length_delimited(summary, 1, value);
  std::string e = event_head(step);
  length_delimited(e, 5, summary);
  write_event(e);
}

void TensorBoardWriter::text(int64_t step, const std::string& tag_name, const std::string& markdown) {
  std::string tensor;  // a scalar DT_STRING tensor holding the markdown
  tag(tensor, 1, 0);
  varint(tensor, 7);
  length_delimited(tensor, 2, "");
  length_delimited(tensor, 8, markdown);
  plugin_summary(step, tag_name, "text", "", tensor);
}

void TensorBoardWriter::hparams(int64_t step, const json& settings) {
  std::string start;  // SessionStartInfo
  for (const auto& [key, v] : settings.items()) {
    std::string value;  // google.protobuf.Value
    if (v.is_boolean()) {
      tag(value, 4, 0);
      varint(value, v.get<bool>() ? 1 : 0);
    } else if (v.is_number()) {
      tag(value, 2, 1);
      little_endian(value, v.get<double>());
    } else if (v.is_string()) {
      length_delimited(value, 3, v.get<std::string>());
    } else {
      continue;  // lists, objects, null: not a hyperparameter's value
    }
    std::string entry;
    length_delimited(entry, 1, key);
    length_delimited(entry, 2, value);
    length_delimited(start, 1, entry);
  }
  tag(start, 5, 1);
  little_endian(start, now_seconds());
  std::string data, tensor;
  length_delimited(data, 3, start);  // HParamsPluginData.session_start_info (version 0: left out)
  tag(tensor, 1, 0);
  varint(tensor, 1);  // DT_FLOAT, no values: the plugin reads the metadata alone
  length_delimited(tensor, 2, "");
  plugin_summary(step, "_hparams_/session_start_info", "hparams", data, tensor);
}

namespace {
// Text as a markdown code block: kept as it is (spaces, newlines, characters markdown would read).
std::string code_block(const std::string& text, const char* language = "") {
  std::string fence = "```";
  while (text.find(fence) != std::string::npos) fence += "`";
  return fence + language + "\n" + text + "\n" + fence;
}
}  // namespace

void TensorBoardWriter::record(const json& rec) {
  const std::string type = rec.value("type", std::string());
  if (type == "config" && rec.contains("config")) {
    text(start_step_ + 1, "config", code_block(rec.dump(2), "json"));
    if (rec["config"].is_object()) hparams(start_step_ + 1, rec["config"]);
    return;
  }
  if (type == "sample" && rec.contains("text") && rec["text"].is_string() && rec.contains("step") && rec["step"].is_number_integer()) {
    text(rec["step"].get<int64_t>(), "samples", code_block(rec["text"].get<std::string>()));
    return;
  }
  const char* prefix = type == "step" ? "train/" : type == "eval" ? "eval/" : nullptr;
  if (prefix == nullptr || !rec.contains("step") || !rec["step"].is_number_integer()) return;
  static const std::vector<std::string> step_keys = {"loss", "lr", "grad_norm", "loss_scale", "tokens_per_s",
                                                     "tflops", "mfu", "mem_gb", "comm_ms"};
  static const std::vector<std::string> eval_keys = {"val_loss", "perplexity"};
  std::vector<std::pair<std::string, double>> values;
  for (const auto& key : type == "step" ? step_keys : eval_keys) {
    if (rec.contains(key) && rec[key].is_number()) values.emplace_back(prefix + key, rec[key].get<double>());
  }
  if (!values.empty()) scalars(rec["step"].get<int64_t>(), values);
}

}  // namespace kiln
