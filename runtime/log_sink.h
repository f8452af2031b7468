// runtime/log_sink.h -- the JSONL run log.
//
// One JSON object per line, flushed as written so a crashed run keeps every record up to the
// crash: first a "config" record, then one "step" record per optimizer step (and "eval"
// records), then a "summary" record. Each record carries "type". Only rank 0 writes.
#pragma once

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace kiln {

class LogSink {
 public:
  LogSink() = default;  // disabled: write() does nothing
  // Opens `path` for writing: truncating it, or appending (a resumed run continues its log).
  // Throws ConfigError if it cannot.
  explicit LogSink(const std::string& path, bool append = false);
  bool enabled() const { return out_.is_open(); }
  void write(const nlohmann::json& record);

 private:
  std::ofstream out_;
};

}  // namespace kiln
