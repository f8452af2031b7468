// runtime/log_sink.cpp -- JSONL writer.
#include "runtime/log_sink.h"

#include <cerrno>
#include <cstring>

#include "runtime/error.h"

namespace kiln {

LogSink::LogSink(const std::string& path, bool append) {
  out_.open(path, std::ios::out | (append ? std::ios::app : std::ios::trunc));
  if (!out_) throw ConfigError("--log-json " + path + ": cannot open for writing: " + std::strerror(errno));
}

void LogSink::write(const nlohmann::json& record) {
  if (!out_.is_open()) return;
  // Non-finite floats have no JSON spelling; nlohmann writes them as null, which is what we want.
  out_ << record.dump() << '\n';
  out_.flush();
}

}  // namespace kiln
