// runtime/checkpoint/hf_llama_weights.h -- the Llama family's weights in and out of a directory in
// transformers' layout (the names, pieces and config of runtime/checkpoint/hf_llama.h), one kiln
// parameter at a time, for kiln's checkpoints (checkpoint.h) and --init-from.
//
// Out: each kiln parameter gathered once (consolidate.h) and its pieces (q / k / v, gate / up, the
// vocabulary's real rows) written where save_pretrained puts them: one model.safetensors or,
// above the shard size (5 GB, save_pretrained's; the test-only KILN_TEST_HF_SHARD_BYTES lowers
// it), model-0000k-of-0000n.safetensors with model.safetensors.index.json.
// In: rank 0 checks the directory (a kiln checkpoint's recorded CRC-32s first, then every tensor
// against the model's shape: match_hf_llama) before anything is allocated, makes each kiln
// parameter from its sources and every rank keeps its part.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "runtime/checkpoint/checkpoint_files.h"

namespace kiln {

class Communicator;
class HfWeightFiles;
class NonFiniteTensors;
class WholeModel;
struct CheckpointIo;

// Each kiln parameter of `state` made on rank 0 from its Hugging Face tensors in `files` (used
// there only, checked already), then scattered: every rank keeps its part. The first tensor that
// is not finite is noted in `bad` (rank 0), for the caller to decide on.
void stream_hf_llama(WholeModel& state, const HfWeightFiles* files, PeakTracker& peak, NonFiniteTensors& bad);

// Writes the weights into `tmp` (rank 0, `writer`; every rank takes part in the gathers) and
// records each file's CRC-32 in `files`. Throws kiln::Error on any I/O failure.
void write_hf_llama_weights(const std::string& tmp, WholeModel& state, bool writer, nlohmann::json& files, PeakTracker& peak);

// Loads `dir`'s weights into `state` (every rank's part). Throws ConfigError / DataError naming
// the file or tensor that does not fit or is not finite, on every rank, prefixed "<flag> <dir>"
// (the command's flag for the directory: --init-from, kiln eval's --checkpoint).
CheckpointIo load_hf_llama_weights(const std::string& dir, WholeModel& state, Communicator* world,
                                   const std::string& flag = "--init-from");

}  // namespace kiln
