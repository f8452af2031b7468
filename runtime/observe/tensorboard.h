// runtime/observe/tensorboard.h -- the run's scalars as a TensorBoard event file (`--tensorboard DIR`).
//
// What TensorBoard reads: a file named events.out.tfevents.<time>.<host>.<pid> holding TFRecords,
//   uint64 length | uint32 masked_crc32c(length) | data[length] | uint32 masked_crc32c(data)
// with masked_crc32c(x) = ((c >> 15) | (c << 17)) + 0xa282ead8, c = CRC-32C (Castagnoli) of x.
// Each record's data is a serialized tensorflow.Event (tensorflow/core/util/event.proto):
//   Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5;
//           SessionLog session_log = 7; }  (6 is the deprecated LogMessage)
//   Summary { repeated Value value = 1; }
//   Value { string tag = 1; float simple_value = 2; TensorProto tensor = 8; SummaryMetadata metadata = 9; }
//   SummaryMetadata { PluginData plugin_data = 1; }   PluginData { string plugin_name = 1; }
//   TensorProto { DataType dtype = 1 (DT_STRING = 7); TensorShapeProto tensor_shape = 2 (empty:
//                 a scalar); repeated bytes string_val = 8; }   (a text summary: plugin 'text')
//   SessionLog { SessionStatus status = 1; }  (START = 1)
// The first record is file_version "brain.Event:2"; then one Event per record of the run log with
// the scalars below. These few fields are written here with protobuf's wire format (varints,
// fixed64 doubles, fixed32 floats, length-delimited messages) rather than through libprotobuf and
// generated code, which would bring protoc and TensorFlow's .proto files into the build for five
// fields; tests/cli/tensorboard.sh reads the file back with TensorBoard's own EventAccumulator.
//
// Scalars: from each "step" record train/loss, train/lr, train/grad_norm, train/loss_scale,
// train/tokens_per_s, train/tflops, train/mfu, train/mem_gb, train/comm_ms (those the record has as
// numbers); from each "eval" record eval/val_loss and eval/perplexity. Text (TensorBoard's Text
// tab, markdown): the "config" record as `config` at the run's first step (the settings as given
// and as resolved, the layout, in a JSON block) and each "sample" record's text as `samples` at
// its step (--sample-every). HParams (the HParams tab): the config record's settings (its
// "config" object's numbers, strings and booleans) as the run's hyperparameters, one
// session_start_info summary (tag "_hparams_/session_start_info", plugin "hparams",
// HParamsPluginData { SessionStartInfo session_start_info = 3 }, SessionStartInfo { map<string,
// google.protobuf.Value> hparams = 1; double start_time_secs = 5 }, Value { double number_value
// = 2; string string_value = 3; bool bool_value = 4 }), as tensorboard.plugins.hparams writes
// it; the tab pairs them with the run's scalars. A resumed run starts a new
// file with a SessionLog START at its first step: TensorBoard then drops the earlier file's events
// from that step on, so the steps a resume replays are shown once.
//
// Written by rank 0 only, flushed per record so TensorBoard shows a run live. A write that fails
// (disk full) stops the writer with one warning on stderr; the run and its JSONL log go on.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln {

// CRC-32C (Castagnoli polynomial 0x1EDC6F41, reflected), as TFRecord checks its records.
uint32_t crc32c(const void* data, size_t n);

class TensorBoardWriter {
 public:
  // Creates `dir` if needed and a new event file in it. `start_step`: the run's first step is
  // start_step + 1 (a resumed run: > 0, and a SessionLog START marks it). ConfigError naming
  // --tensorboard when the directory or the file cannot be made.
  TensorBoardWriter(const std::string& dir, int64_t start_step);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // The scalars of one run-log record (see above); other records are ignored.
  void record(const nlohmann::json& rec);
  // Scalars (tag, value) at `step`, as one Event.
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  // A text summary (markdown) at `step`, as one Event.
  void text(int64_t step, const std::string& tag_name, const std::string& markdown);
  // The run's hyperparameters (an object's scalar members; others left out), as one Event.
  void hparams(int64_t step, const nlohmann::json& settings);
  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& event);
  void plugin_summary(int64_t step, const std::string& tag_name, const std::string& plugin_name, const std::string& content,
                      const std::string& tensor);
  std::string path_;
  std::FILE* file_ = nullptr;
  int64_t start_step_ = 0;
};

}  // namespace kiln
