// runtime/consolidate.h -- the whole model seen from the parts the ranks train: gathered with its
// AdamW state on world rank 0 (what a checkpoint saves, whatever the layout), and fingerprinted.
//
// Up to three gathers, in this order:
//   ZeRO   the shards over dp, unit by unit, into dp rank 0's plain copy of its part
//          (parallel/zero.h: ZeroEngine::consolidate);
//   tp     the slices over tp into whole tensors on tp rank 0 (parallel/tensor_parallel.h:
//          gather_to_whole): on rank 0 straight into the whole model, on another stage's
//          writer into a tp = 1 copy of its stage;
//   pp     each stage's writer (its dp 0, tp 0 rank) sends its stage to rank 0 over MPI
//          (parallel/pipeline.h: gather_stages).
// Parameters keep their whole-model names throughout, so every gather writes by name.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <c10/core/Device.h>

namespace kiln {

class AdamW;
class Communicator;
class GPT;
class Mesh;
class ZeroEngine;
struct AdamWConfig;

// Collective over the world. model / optimizer: this rank's part and its AdamW (optimizer null
// under ZeRO, which holds the state); host_world: an MPI communicator over the world (host
// tensors); stage_blocks: blocks per pipeline stage; device: the run's device, where the tensors
// of the dp and tp gathers live. whole / whole_opt: on rank 0, a tp = 1 whole
// host model and an AdamW over it, written; null elsewhere.
void consolidate_whole(GPT& model, AdamW* optimizer, ZeroEngine* zero, const Mesh& mesh, Communicator& host_world,
                       const std::vector<int64_t>& stage_blocks, const AdamWConfig& adam, GPT* whole, AdamW* whole_opt,
                       c10::Device device);

// The fingerprint of the weights, for comparing runs: the sum and the sum of squares (double) of
// every element of the whole model, whatever the layout. Each rank's elements are weighted as
// parallel/pipeline.h's count_weights says and summed over tp and pp (dp copies are equal); under
// ZeRO the engine's param_moments (over dp and tp), summed over pp. Collective over the world
// when `mesh` is given; `device`: where collectives' tensors live.
std::pair<double, double> weights_fingerprint(GPT& model, ZeroEngine* zero, const Mesh* mesh, c10::Device device);

}  // namespace kiln
