// runtime/observe/log_sink.cpp -- JSONL writer.
#include "runtime/observe/log_sink.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "distributed/error.h"

namespace kiln {

LogSink::LogSink(const std::string& path, bool append) {
  std::error_code ec;
  if (!append && std::filesystem::is_regular_file(path, ec) && std::filesystem::file_size(path, ec) > 0) {
    for (int n = 1;; ++n) {
      const std::string aside = path + "." + std::to_string(n);
      if (std::filesystem::exists(aside, ec)) continue;
      std::filesystem::rename(path, aside, ec);
      if (ec) throw ConfigError("--log-json " + path + ": cannot move the earlier log aside to " + aside + ": " + ec.message());
      moved_to_ = aside;
      break;
    }
  }
  out_.open(path, std::ios::out | (append ? std::ios::app : std::ios::trunc));
  if (!out_) throw ConfigError("--log-json " + path + ": cannot open for writing: " + std::strerror(errno));
}

void LogSink::write(const nlohmann::json& record) {
  if (tensorboard_) tensorboard_->record(record);
  if (!out_.is_open()) return;
  // Non-finite floats have no JSON spelling; nlohmann writes them as null, which is what we want.
  out_ << record.dump() << '\n';
  out_.flush();
}

}  // namespace kiln
