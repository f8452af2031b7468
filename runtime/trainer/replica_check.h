// runtime/trainer/replica_check.h -- ranks that should hold equal weights do (--check-replicas N).
//
// Silent data corruption -- a bad GPU, a bit flipped in memory -- leaves one replica's weights
// different from the others' while every figure looks normal, until the next save writes them
// (rank 0's copy) or the replicas drift apart. Megatron checks it the same way: every N steps,
// and before every save, each rank hashes each of its parameters and the ranks that should hold
// the same tensor compare.
//   - Which ranks hold the same tensor: the data-parallel replicas (dp, and cp, which splits the
//     sequence, not the weights), i.e. the ranks with the same pipeline stage and tp rank; under
//     --ep an expert's parameters only on ranks with the same ep rank as well (the expert-data-
//     parallel group). ZeRO-1/2 keep every working weight on every rank (the update all-gathers
//     them): compared as DDP's. ZeRO-3 shards the weights over dp x cp: no two ranks hold the same
//     bytes, nothing to compare (said at start-up).
//   - The hash of a tensor: the sum of its elements' bit patterns as integers (int32 for fp32,
//     int16 for 16-bit weights), summed in int64 on the device: exact, and any single flipped bit
//     changes it by +-2^k; a permutation of elements would not, which corruption does not do.
//     One reduction kernel per parameter (per 4M elements of it), on check steps only.
//   - The comparison: each rank's list "tensor: hash" is all-gathered over the host group (MPI,
//     host memory: not the steps' comm_bytes); every rank finds the same disagreements, so every
//     rank throws the same error: exit 4, one line naming the tensor, the ranks that differ from the
//     majority of its replicas, and the step -- before a save can write the weights.
// Test-only fault injection (tests/cli/guards.sh): KILN_TEST_FLIP_BIT=RANK:STEP[:first|last] flips one
// bit of rank RANK's first (or last) parameter after step STEP (1-based) has been read.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace kiln {

class Communicator;

// One of this rank's parameters, and which ranks must hold the same bytes: those whose `replicas`
// key is equal ("stage/tp" for a dense parameter, "stage/tp/ep" for an expert's).
struct ReplicaTensor {
  std::string name;
  at::Tensor tensor;
  std::string replicas;
};

// The integer sum of a tensor's bit patterns (above), on its device; a 0-dim int64 tensor. Summed
// kBitSumChunk elements at a time: the int64 temporary of a reduction is 32 MB, not 8 bytes an
// element of the tensor (an embedding's 4 GB, right before a save).
constexpr int64_t kBitSumChunk = int64_t{1} << 22;
at::Tensor bit_sum(const at::Tensor& t);

// The disagreements in every rank's "name -> hash" list (rows[r]: rank r's "key|name|hash" lines):
// one line per tensor whose replicas differ, naming the ranks outside the majority. Pure.
std::vector<std::string> replica_disagreements(const std::vector<std::string>& rows);

class ReplicaCheck {
 public:
  ReplicaCheck(std::vector<ReplicaTensor> tensors, int rank);
  // Collective over `host` (null: this process alone, nothing to compare). Throws NumericsError
  // (exit 4) naming the first disagreement, the same on every rank; `step` 1-based, for the line.
  void check(Communicator* host, int64_t step);
  // Test-only: KILN_TEST_FLIP_BIT's flip, if it is this rank's and step's (1-based).
  void maybe_inject(int64_t step);

 private:
  std::vector<ReplicaTensor> tensors_;
  int rank_ = 0;
  int64_t flip_step_ = -1;
  bool flip_last_ = false;  // the flip in the last parameter, not the first
};

}  // namespace kiln
