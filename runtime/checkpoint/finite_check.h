// runtime/checkpoint/finite_check.h -- weights that hold a NaN or an infinity, refused as they load.
//
// A tensor of NaN passes every other check a load makes: its shape is right, and the CRC-32 a kiln
// checkpoint records was computed over the NaN. It failed far from its cause: --init-from stopped
// at step 1 advising --on-nonfinite skip, kiln eval printed "val loss -nan" and exited 0, greedy
// kiln sample printed nothing, and sampling ended with LibTorch's own message. So every loader --
// kiln checkpoints (resume, --init-from, eval, sample) and Hugging Face directories (GPT-2 and the
// Llama family, one file or shards) -- checks each tensor as it reads it, one isfinite reduction
// (in slices of 16M elements, so the check's own memory stays small beside a large embedding),
// and refuses the load with a DataError (exit 3) naming the file and the tensor:
//
//   kiln: error: --init-from ck/step_00000002: tensor 'model.layers.0.mlp.up_proj.weight' of
//   model.safetensors holds NaN or infinity, which kiln does not load (it would compute NaN from it)
//
// Where rank 0 alone reads and scatters (resume, --init-from, eval), it cannot throw mid-stream: the
// other ranks wait for it in the scatter. So a loader notes the first such tensor
// (NonFiniteTensors::note), reads on, and every rank throws together at the end (decide). Where
// every rank reads the files itself (kiln sample), each decides alone: all find the same tensor.
#pragma once

#include <string>

#include <ATen/core/Tensor.h>

namespace kiln {

class Communicator;

// Whether every element of `t` (a floating CPU tensor) is finite.
bool all_finite(const at::Tensor& t);

// The first non-finite tensor of a load that rank 0 streams.
class NonFiniteTensors {
 public:
  // Notes `tensor` of `file` when `t` is not all finite and no tensor was noted before. `file`: the
  // file's name within the directory (model.safetensors, a shard, optimizer.safetensors).
  void note(const at::Tensor& t, const std::string& file, const std::string& tensor);
  // Collective over `host` (nullptr: this process alone): rank 0's note, if any, thrown on every
  // rank as DataError "<where>: tensor '<tensor>' of <file> holds NaN or infinity, which kiln does not load ...".
  void decide(Communicator* host, const std::string& where) const;

 private:
  std::string file_, tensor_;
};

}  // namespace kiln
