// parallel/zero_unit.h -- a ZeRO unit as the engine holds it: its parameters' flat buffer, this
// rank's shards (parameters, gradients, master and moments) and the state of its collectives.
// Private to parallel/zero.cpp and parallel/zero_state.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "distributed/comm.h"
#include "kernels/float8.h"
#include "parallel/upload_stream.h"
#include "parallel/zero.h"

namespace kiln {

// A parameter's part of this rank's shard: [offset, offset + length) of the shard.
struct ZeroEngine::Segment {
  int64_t offset = 0, length = 0;
  bool decay = false;
  double norm_weight = 1.0;  // ZeroConfig::count_weights' weight of these elements
};

struct ZeroEngine::Unit {
  std::vector<at::Tensor> params;  // the model's parameters (leaves; views of flat)
  bool expert = false;             // experts (ZeroConfig::is_expert): sharded over expert_dp
  Communicator* group = nullptr;   // the ranks sharing the unit: dp, or expert_dp for experts
  std::vector<int64_t> offsets;    // each parameter's first element in flat
  int64_t numel = 0, padded = 0, shard = 0;
  std::vector<Segment> segments;

  at::Tensor flat;          // all n_u' parameters on the device (ZeRO-3: allocated only while gathered), param_dtype
  at::Tensor shard_params;  // ZeRO-3: this rank's parameter shard (on the host under offload all), param_dtype
  at::Tensor grad_full;     // all n_u' gradients on the device (streamed: only while reducing)
  std::vector<bool> landed; // streamed: which parameters' gradients grad_full holds this micro-step
  at::Tensor grad_shard;    // the reduced gradient shard (streamed: own buffer; else a view of grad_full)
  at::Tensor rs_out;        // a reduction's output before it is added into (streamed) / copied to grad_shard
  at::Tensor rs_in;         // bf16 reduction: the wire copy of grad_full, alive while it is reduced
  at::Tensor master;        // the fp32 shard AdamW steps, where it is not the parameter shard itself:
                            // offload (the host's, stepped by the CPU AdamW) or 16-bit weights
  at::Tensor host_grad;     // offload: the host copy of grad_shard (may be grad_shard itself)
  at::Tensor exp_avg, exp_avg_sq;
  at::Tensor upload;        // offload optimizer, 16-bit weights: the host update's round16(master),
                            // page-locked, copied up into the parameter shard (half of fp32's bytes)

  int64_t update = 0;   // offload: the host worker's ticket of this unit's queued update (0: none
                        // pending); finish_update waits for it and uploads the result
  bool unpublished = false;  // offload optimizer: an update queued or run whose result is not yet
                             // copied up (held there by the delayed update until publish())
  std::vector<at::Tensor> sq_parts;  // offload all: the final shard's squared norm in local_grad_sq_norm's
  bool sq_valid = false;             // pieces, computed by the host worker (post_norm) when valid
  bool downloaded = false;  // offload optimizer: host_grad's copy of this step's final shard issued
  bool fresh = false;   // offload all, streamed: no gradient has reached the host shard this step
                        // yet (the first add copies instead of adding, so the shard is never zeroed)

  int64_t pending = 0;  // gradients not yet landed in this backward
  bool reduced = false; // this micro-step's reduction launched
  std::shared_ptr<Work> rs_work, ag_work;
  at::Tensor ag_src;    // the shard being gathered, kept alive until the gather completes
  std::shared_ptr<UploadStream::Done> uploaded;  // offload all: the upload stream's copy and gather (the compute stream waits)
  enum class State { Released, Gathering, Gathered } state = State::Gathered;

  // A float8 unit (ZeroConfig::float8_weight; zero.h, "Float8 weights"): gathered in 8 bits.
  std::vector<std::shared_ptr<Float8Tensor>> slots;  // each parameter's layer slot (params order)
  at::Tensor q_flat;    // uint8 [padded] on the device: the gathered e4m3 bytes (allocated only while gathered)
  at::Tensor q_shard;   // uint8 [shard] on the device: this rank's bytes
  at::Tensor q_scales;  // fp32 [params] on the device: each weight's dequantisation scale
  bool q_valid = false; // q_shard and q_scales hold the working shard's current values
  bool float8() const { return !slots.empty(); }
};

}  // namespace kiln
