// parallel/p2p.h -- the point-to-point transfers of a pipeline stage, over the pp group's
// Communicator (distributed/comm.h's send_recv).
//
// One call carries one schedule step's transfers (parallel/pipeline_schedule.h's Exchange):
// activations to stage + 1 and from stage - 1, gradients to stage - 1 and from stage + 1, all
// posted together (one NCCL group; non-blocking MPI sends and receives) and waited for together,
// so no order of ranks can deadlock. Every tensor crossing a boundary has the shape fixed by the
// config, [micro-batch, seq_len, d_model] fp32, so receive buffers are allocated without asking
// the sender; between two ranks messages of one kind flow one way and match in posting order
// (the MPI backend uses one tag), so nothing else needs naming.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "distributed/comm.h"
#include "parallel/pipeline_schedule.h"

namespace kiln {

// A received tensor's micro-batch and the chunk of this rank that takes it (0 with one chunk).
using MicroChunk = std::pair<int, int>;

struct StageTransfers {
  std::map<MicroChunk, at::Tensor> activations;  // activations received from stage - 1
  std::map<MicroChunk, at::Tensor> grads;        // gradients received from stage + 1
};

// Posts `transfers` for stage `stage` of `pp` and waits for them. Stages are on a ring: stage
// pp - 1's next is 0 (only the interleaved schedule's transfers wrap round). outgoing(t) gives the tensor a
// Send transfer carries (contiguous, `shape`, the dtype of `options`); receives land in new tensors of `shape` with
// `options`. Returns what was received.
StageTransfers exchange(Communicator& pp, int stage, const std::vector<PipeTransfer>& transfers,
                        const std::function<at::Tensor(const PipeTransfer&)>& outgoing, at::IntArrayRef shape,
                        const at::TensorOptions& options);

}  // namespace kiln
