// runtime/inference/inference_model.h -- a checkpoint's model, built for inference (kiln sample).
//
// A checkpoint directory (runtime/checkpoint/checkpoint.h) holds model.safetensors in Hugging Face
// GPT2LMHeadModel's layout (runtime/checkpoint/hf_gpt2.h) and trainer_state.json, whose run.config is the
// TrainConfig of the run that wrote it: the model's shape (n_layer, n_head, n_kv_head, d_model,
// seq_len, vocab_size) comes from there, layer_norm_epsilon from config.json where present.
// The model is built whole, or as tensor-parallel rank r of t (parallel/tensor_parallel.h: each
// weight is read whole from the file, one at a time, and rank r keeps its slice), then moved to
// the device. No optimizer state is read. Every rank reads the file itself: sampling loads once,
// and the model is small next to the checkpoint's optimizer state that a resume moves.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <c10/core/Device.h>

#include "distributed/comm.h"
#include "models/gpt.h"

namespace kiln {

struct CheckpointModel {
  std::string dir;             // the checkpoint directory (a save dir's `latest` resolved)
  int64_t step = 0;            // the step it was saved at
  GPTConfig config;            // the model's shape
  std::shared_ptr<GPT> model;  // on the device, in eval mode
};


// The model of checkpoint `path` (resolved as above) on `device`; tp: its tensor-parallel group
// (null or size 1: the whole model). ConfigError for a malformed trainer_state.json or a model
// the file does not match (runtime/checkpoint/hf_gpt2.h: load_hf_gpt2's checks); DataError for a missing or
// corrupt model.safetensors, or a weight that holds NaN or infinity (runtime/checkpoint/finite_check.h).
CheckpointModel load_checkpoint_model(const std::string& path, c10::Device device, const std::shared_ptr<Communicator>& tp,
                                      const std::string& command);

}  // namespace kiln
