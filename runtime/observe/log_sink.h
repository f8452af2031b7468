// runtime/observe/log_sink.h -- the JSONL run log.
//
// One JSON object per line, flushed as written so a crashed run keeps every record up to the
// crash: first a "config" record, then one "step" record per optimizer step (and "eval"
// records), then a "summary" record. Each record carries "type". Only rank 0 writes. With
// --tensorboard, each record's scalars go to a TensorBoard event file too (runtime/observe/tensorboard.h).
#pragma once

#include <fstream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/observe/tensorboard.h"

namespace kiln {

class LogSink {
 public:
  LogSink() = default;  // disabled: write() does nothing
  // Opens `path` for writing: appending (a resumed run continues its log; it then starts with a
  // "resume" record, so a reader can drop the steps the resumed run repeats), or afresh. A fresh
  // run never truncates an earlier log: an existing non-empty file is moved aside to PATH.1 (the
  // first free PATH.N), as --resume none never overwrites checkpoints; moved_to() names it.
  // Throws ConfigError if it cannot.
  explicit LogSink(const std::string& path, bool append = false);
  bool enabled() const { return out_.is_open(); }
  // Every record written from now on also goes to `tensorboard` (its scalars), with or without
  // a JSONL file.
  void also_to(std::unique_ptr<TensorBoardWriter> tensorboard) { tensorboard_ = std::move(tensorboard); }
  void write(const nlohmann::json& record);
  const std::string& moved_to() const { return moved_to_; }  // "" when nothing was moved aside

 private:
  std::ofstream out_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  std::string moved_to_;
};

}  // namespace kiln
