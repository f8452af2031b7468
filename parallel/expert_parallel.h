// parallel/expert_parallel.h -- expert parallelism (`--ep N`): the experts of every MoE layer
// divided over an expert-parallel group carved out of the data-parallel ranks, tokens moved to
// their experts and back by all-to-all (GShard, Lepikhin et al. 2020; DeepSpeed-MoE; Megatron-Core).
//
// Groups (distributed/mesh.h): the dp ranks of a (pp, cp, tp) position are cut into dp / ep groups of
// ep consecutive dp indices: ep group g = dp ranks [g ep, (g + 1) ep), ep rank = dp % ep. Rank r
// of an ep group holds experts [r E/ep, (r + 1) E/ep) of every MoE layer; the router, attention,
// norms and dense blocks are replicated as before. The "expert-data-parallel" group joins the dp
// ranks holding the same experts: dp % ep equal, dp / ep of them.
//
// One MoE layer's forward on an ep rank (models/moe.h gives the rows sorted by expert, n_e rows for
// expert e, all E):
//   counts    all_to_all of the E counts (on the device, LayerOps::exchange_counts), E/ep to each
//             rank: c[j][l] = rows rank j sends this rank's local expert l           [ep, E/ep]
//   dispatch  all_to_all of the rows: to rank j the rows of its experts (sum over its experts of
//             n_e); from rank j sum_l c[j][l] rows, ordered (j, l)
//   experts   the arrived rows reordered (l, j) so each local expert's rows are consecutive (the
//             index made on the device from the exchanged counts: a stable sort of each row's
//             key l ep + j; a host-made index would be a pageable copy, a second wait per layer),
//             the experts run, the outputs put back in (j, l) order
//   combine   all_to_all back (the splits swapped): each row's output returns to its token's rank
// Backward: each all_to_all's gradient is the all_to_all with the splits swapped (AllToAllRows).
// The counts' exchange runs on the device before the MoE layer's one host read (models/moe.h),
// which reads the arrived counts with its own: MPI's and NCCL's splits are host integers, and this
// keeps ep at one synchronisation per layer and forward, as without ep.
// Traffic (comm_bytes, distributed/comm.h: an all_to_all counts its whole input): per MoE layer and
// micro-batch, 8 E bytes (the counts) + the rows sent (a x b_in x d bytes, a the admitted
// assignments of this rank's tokens, b_in the compute dtype's bytes: models/moe.cpp casts the
// rows before the dispatch) + the rows returned (R x
// b_out x d, R the rows this rank's experts ran, b_out the experts' output dtype), and the same
// two again in backward (rows in the other direction). Summed over an ep group, forward dispatch
// and combine each move every admitted assignment once. Per rank and step, with S and R the rows
// sent and received over the forward passes (ExpertTraffic), f forwards per backward (2 under
// full recomputation) and c the MoE layers' dispatches (layers x micro-batches x f):
//   ep bytes = 8 E c + d (S b_in + R b_out) + d (R b_in + S b_out) / f
// (kiln plan --compare checks it against ep_comm_bytes exactly).
//
// Gradients. Each rank's loss L_r is the mean over its own tokens; the step's objective is
// (1/dp) sum_r L_r. A dense parameter's gradient is reduced over dp as before (DDP's mean). An
// expert's gradient on its rank already sums the contributions of its ep group's tokens (they
// came back through the combine's backward); summed over the dp / ep ranks holding the same
// expert it is sum_r dL_r/dtheta, so the mean is that sum / dp: the expert-data-parallel group's
// mean (its size dp / ep) times 1 / ep (scale_expert_gradients). The global norm counts every
// parameter once: ||g||^2 = ||g_dense||^2 + sum over the ep group of ||g_experts, local||^2.
//
// Checkpoints hold every expert once, whole ([E, ...], kiln's order), whatever the layout: the
// first ep group's ranks all-gather their experts to dp rank 0 (runtime/checkpoint/consolidate.cpp); a
// resume keeps rank r's rows [r E/ep, (r + 1) E/ep).
// Tensor parallelism: the MoE layers are replicated over tp (models/gpt.h), so each tp rank has
// its own ep group (the dp ranks at its tp index) dispatching the same tokens as its tp peers';
// experts are then equal over tp, as a LayerNorm is. Built with DDP (dp > ep: the expert-data-
// parallel reduction), ZeRO-1/2 (the experts sharded over the expert-data-parallel group:
// parallel/zero.h), tp and pp (each stage's dp ranks form its ep groups; a stage's norm share
// counts an expert's dp / ep copies: parallel/pipeline.h). ZeRO-3 and --sample-every with --ep
// are refused (not built).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "models/gpt.h"
#include "parallel/main_grads.h"

namespace kiln {

class Communicator;

// Whether parameter `name` (GPT's names) is an expert's, divided over ep: h.N.moe.{fc_w, fc_b,
// proj_w, proj_b} (the router is replicated).
bool is_expert_parameter(const std::string& name);

// The rows this rank's dispatches moved, counted by the forward passes (a recomputed forward
// counts again): sent, its tokens' admitted assignments handed to the all-to-all; received, the
// rows its experts ran. With the dtypes they say the all-to-alls' bytes exactly (see "Traffic"),
// which the routing decides: the step record logs them (ep_rows_sent, ep_rows_received).
struct ExpertTraffic {
  int64_t rows_sent = 0, rows_received = 0;
  ExpertTraffic operator-(const ExpertTraffic& before) const {  // what moved since `before`
    return {rows_sent - before.rows_sent, rows_received - before.rows_received};
  }
};

// `shard` with expert parallelism over `ep` (this rank's position in it: ep->rank()): its
// LayerOps gain expert_split, expert_rank and dispatch_experts, which add to `traffic` (when
// given). Throws ConfigError when ep does not divide the experts.
ModelShard make_expert_parallel(ModelShard shard, const GPTConfig& cfg, const std::shared_ptr<Communicator>& ep,
                                std::shared_ptr<ExpertTraffic> traffic = nullptr);

// An expert parameter's rows [rank E/ep, (rank + 1) E/ep) of the whole `w` (any other parameter
// whole): the slicer for GPT::init_weights and for loading checkpoints.
at::Tensor ep_slice_of(const std::string& name, const at::Tensor& w, int64_t ep, int64_t rank);
GPT::TensorSlicer ep_slicer(int64_t ep, int64_t rank);

// y = all_to_all(x) with row splits (distributed/comm.h), differentiable: backward sends the
// gradient back with the splits swapped.
at::Tensor all_to_all_rows(const at::Tensor& x, const std::vector<int64_t>& out_splits, const std::vector<int64_t>& in_splits,
                           const std::shared_ptr<Communicator>& group);

// After the data-parallel reduction: the experts' gradients times 1 / ep (see above).
void scale_expert_gradients(const std::vector<at::Tensor>& expert_grads, int64_t ep);

// The global norm of the model's gradients, every parameter once: the experts' squares summed
// over `ep`; under tensor parallelism (tp non-null) the split parameters' squares summed over tp
// (parallel/tensor_parallel.h's weighted pieces), the replicated ones' and the experts' (equal on
// every tp rank) counted once. Returns the norm / grad_scale (fp16's loss scale), a 0-dim fp32
// tensor on the gradients' device; the clipping is the optimizer's (optim/grad_clip.h's
// clip_factor, applied by AdamW::step).
at::Tensor grad_norm_ep(GPT& model, double grad_scale, const std::shared_ptr<Communicator>& ep,
                        const std::shared_ptr<Communicator>& tp, const GradOf& grad_at);

}  // namespace kiln
