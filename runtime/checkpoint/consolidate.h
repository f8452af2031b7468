// runtime/checkpoint/consolidate.h -- the whole model seen from the parts the ranks train, one tensor at a
// time: gathered onto world rank 0 (what a checkpoint saves) and scattered back into every rank's
// part (what a resume loads), whatever the layout; and the weights' fingerprint.
//
// A whole-model parameter P (its values, AdamW's two moments, or AdamW's step count) lives on the
// ranks of the pipeline stage that holds it (the first stage's copy of the tied wte is the one
// that counts), as tensor-parallel slices (replicated parameters: the same on every tp rank), each
// slice whole on every dp rank or, under ZeRO, in pieces of the dp ranks' shards.
// Gathering P (collective over the world; every rank calls it for the same P in the same order):
//   ZeRO  the dp ranks send dp rank 0 their pieces of the slice (ZeroEngine::gather_param: point
//         to point over dp, on the device);
//   tp    dp rank 0 of each tp rank: the slices all-gathered over tp (on the device) and
//         assembled on tp rank 0, on the host (parallel/tensor_parallel.h: tp_assemble);
//   pp    the stage's writer (its dp 0, tp 0 rank) sends P to world rank 0 over the host group.
// Scattering P: world rank 0 broadcasts the whole P over the host group; every rank whose part
// holds P copies its slice (tp_slice_of) into its parameter and AdamW state, or into its shards
// (ZeroEngine::load_param).
// Memory: one whole tensor at a time on world rank 0 and on a stage's writer (plus the tp pieces
// while they are assembled), one whole tensor per rank while scattering; no rank ever holds the
// whole model or the whole optimizer state.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "optim/adamw.h"
#include "parallel/zero.h"

namespace kiln {

class Communicator;
class GPT;
class Mesh;
class ZeroEngine;
struct GPTConfig;

// What a checkpoint holds of a parameter: StatePart's three, and AdamW's step count (a 0-dim
// fp32 tensor per parameter).
enum class CheckpointPart { Param, ExpAvg, ExpAvgSq, Step };

// This rank's part of the model and AdamW state frozen in host memory, for a checkpoint written
// while training goes on (runtime/checkpoint/async_save.h): each local parameter's fp32 weights (the
// master where AdamW keeps one), moments and step count -- on the ranks whose copy a gather reads
// (cp rank 0, dp rank below max(1, ep)) -- or ZeRO's shards. The tensors are views of one pool
// (pinned on a GPU) allocated by the first WholeModel::snapshot and reused by the next ones.
struct StateSnapshot {
  std::map<std::string, std::array<at::Tensor, 4>> own;  // no ZeRO: name -> [param, exp_avg, exp_avg_sq, step]
  ZeroSnapshot zero;
  at::Tensor pool;
  int64_t bytes() const { return pool.defined() ? pool.numel() * 4 : 0; }
};

class WholeModel {
 public:
  // model / optimizer: this rank's part and its AdamW (optimizer null under ZeRO, whose engine
  // holds the state); mesh and host_world null in a world of one without MPI; host_world: an MPI
  // group of the world without a device (host tensors); stage_blocks: blocks per pipeline stage;
  // device: the run's.
  WholeModel(GPT& model, AdamW* optimizer, ZeroEngine* zero, const Mesh* mesh, Communicator* host_world,
             std::vector<int64_t> stage_blocks, c10::Device device);
  // The same model seen through `snap` (taken from `live` by snapshot()): gather() reads the
  // snapshot and communicates over `host_mesh` (an MPI mesh of the same shape, without a device)
  // and `host_world`, on the host -- for the background thread of an asynchronous save, while
  // `live` trains on. scatter() is not for it.
  WholeModel(const WholeModel& live, const StateSnapshot& snap, const Mesh* host_mesh, Communicator* host_world);

  // This rank's part into `into` (allocated on the first call, reused after), the copies queued
  // and then waited for: the training's stall of an asynchronous save. Local.
  void snapshot(StateSnapshot& into);

  // The whole model's parameters, in kiln's order: name and whole shape.
  const std::vector<std::pair<std::string, std::vector<int64_t>>>& params() const { return params_; }
  // The whole shape of `name` (the shape of a part: [] for Step).
  std::vector<int64_t> shape_of(const std::string& name, CheckpointPart part) const;
  bool writer() const;  // world rank 0
  const GPTConfig& config() const;

  // Collective over the world: P whole (fp32, contiguous, on the host) on world rank 0; undefined
  // elsewhere.
  at::Tensor gather(const std::string& name, CheckpointPart part);
  // Collective over the world: `whole` (given on world rank 0; ignored elsewhere) into every
  // rank's part of P.
  void scatter(const std::string& name, CheckpointPart part, const at::Tensor& whole);

 private:
  at::Tensor local_part(const std::string& name, const at::Tensor& param, CheckpointPart part);  // this rank's slice, on dp rank 0
  at::Tensor own_state(const at::Tensor& param, CheckpointPart part) const;  // without ZeRO: this rank's tensor
  at::Tensor state_of(const std::string& name, const at::Tensor& param, CheckpointPart part) const;  // own_state, or the snapshot's
  at::Tensor zero_gather(const at::Tensor& param, CheckpointPart part);  // ZeRO's gather_param, or from the snapshot
  bool snapshot_kept() const;  // this rank's own state is one a gather reads
  void load_local(const at::Tensor& param, CheckpointPart part, const at::Tensor& slice);

  GPT& model_;
  AdamW* optimizer_;
  ZeroEngine* zero_;
  const Mesh* mesh_;
  Communicator* host_;
  std::vector<int64_t> stage_blocks_;
  c10::Device device_;
  std::vector<std::pair<std::string, std::vector<int64_t>>> params_;
  std::map<std::string, at::Tensor> local_;  // this rank's parameters by whole-model name
  const StateSnapshot* snap_ = nullptr;      // the snapshot a background save gathers from
};

// The fingerprint of the weights, for comparing runs: the sum and the sum of squares (double) of
// every element of the whole model, whatever the layout. Each rank's elements are weighted as
// parallel/pipeline.h's count_weights says and summed over tp and pp (dp copies are equal); under
// ZeRO the engine's param_moments (over dp and tp), summed over pp. With 16-bit working weights
// the fp32 masters are fingerprinted (`optimizer`'s, or ZeRO's): what checkpoints hold, the same
// on every layout. Collective over the world when `mesh` is given; `device`: where collectives'
// tensors live.
std::pair<double, double> weights_fingerprint(GPT& model, ZeroEngine* zero, const AdamW* optimizer, const Mesh* mesh,
                                              c10::Device device);

}  // namespace kiln
