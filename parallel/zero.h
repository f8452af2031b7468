// parallel/zero.h -- ZeRO stages 1-3 over the data-parallel group, with CPU offload of the
// optimizer (and, under ZeRO-3, of the parameters). Rajbhandari et al., "ZeRO: Memory
// Optimizations Toward Training Trillion Parameter Models", 2020.
//
// Units. The model's parameters are grouped into units: unit 0 ("outer") = wte, wpe, ln_f;
// unit 1 + i = block i. Each unit is one flat fp32 buffer of n_u elements padded to
//   n_u' = ceil(n_u / (N A)) N A          N = dp ranks, A = 64 elements (256 bytes)
// so each of the N ranks owns an equal, aligned shard of n_u' / N elements: rank r owns
// [r n_u'/N, (r+1) n_u'/N). psi' = sum_u n_u' (psi = sum_u n_u, the parameter count). The
// optimizer (AdamW, optim/adamw.h's arithmetic) steps the shard only. Under expert parallelism
// a MoE block's experts are a unit of their own, sharded over the ranks holding the same experts
// (ZeroConfig::is_expert).
//
// Working weights (ZeroConfig::param_dtype; docs/precision.md, docs/zero.md). fp32 (the "upcast"
// policy): the parameter shard is its own master copy, a parameter costs 4 B + 4 B of gradient
// + 8 B of moments = 16 B. bf16 / fp16 (Megatron's distributed optimizer): the model computes
// with 2-byte parameters, the flat buffers and the gathers hold 2 bytes per element, and an fp32
// master shard lives with the moments: 2 B + 4 B + 12 B / N. Gradients are fp32 either way
// (kiln's "main grads": a backward's 16-bit gradient is added into the fp32 buffer by the hook
// that sees it land, and freed), so accumulation over micro-steps and the step are exact in fp32;
// the paper's 2 + 2 + 12/N keeps 16-bit gradients instead. With P = 4 or 2 parameter bytes and
// R = 4 or 2 reduction bytes (ZeroConfig::reduce_dtype), per rank:
//   stage  params      grads       optimizer            traffic per step (CommStats' unit, K micro-steps)
//   0      P psi       4 psi       (8 | 12) psi         DDP: 2 x R psi                   (all-reduce)
//   1      P psi'      4 psi'      (8 | 12) psi'/N      R psi' (reduce-scatter) + P psi' (all-gather)
//   2      P psi'      4 psi'/N    (8 | 12) psi'/N      K R psi' + P psi'         (accum policy reduce)
//   3      P psi'/N    4 psi'/N    (8 | 12) psi'/N      K (P psi' + P (psi' - n_0' - n_L')) + K R psi'  (reduce)
//   (8 | 12): the moments, plus the fp32 master when P = 2. ZeRO-3's traffic: each micro-step
//   all-gathers every unit for forward, every block but the last again for backward (unit 0
//   stays gathered through the micro-step, the last block from its forward to its backward), and
//   reduce-scatters every gradient. The optimizer step writes round16(master) into the 2-byte
//   parameter shard; ZeRO-1/2 then all-gather those 2 bytes.
// Reduction in bf16 (R = 2): the fp32 gradient is cast to a bf16 copy, reduce-scattered (the mean
// over ranks rounded once to 8 mantissa bits) and added into the fp32 gradient shard.
// Plus, every step, one all-reduce of [loss, non-finite flag, squared gradient norm] (12 B).
//
// Gradient accumulation under ZeRO-2/3 (K > 1), ZeroConfig::accum:
//   reduce  every micro-step reduce-scatters each unit's gradient as backward completes it and
//           adds the result into the rank's fp32 gradient shard; a unit's full gradient exists
//           only while its reduction is in flight. Memory 4 psi'/N; traffic K x 4 psi'.
//   local   the first K-1 micro-steps accumulate into a full local gradient buffer (ZeRO-1's);
//           the last one reduce-scatters it once. Memory 4 psi'; traffic 4 psi' (any K).
// Both are exact (the mean over ranks of the sum over micro-steps); they differ only in the
// order of the floating-point additions. ZeRO-1 always keeps the full buffer (its definition).
//
// ZeRO-3 gathers. Before block i's forward its unit is all-gathered (and block i+1's gather is
// issued: prefetch); after the forward its storage is freed -- except the last block's, whose
// backward follows at once (as FSDP keeps its root's last module). A hook on the block's output
// gathers it again when backward reaches the block (and prefetches block i-1); once all its
// gradients have landed its storage is freed again. Unit 0 is gathered at the start of each
// micro-step and freed when its gradients have landed. Under --ep an MoE block is two units,
// its dense part sharded over dp and its experts over the expert-data-parallel group (as
// ZeRO-1/2 shard them): both are gathered, prefetched and freed together, each over its group.
// Storage is freed by releasing the flat buffer's allocation; the parameters stay views of it, so
// the autograd graph, activation checkpointing's recomputation and the optimizer see ordinary
// tensors. Under offload all each gather copies the host shard up first: on a GPU that copy and
// the gather run on a stream of their own (parallel/upload_stream.h), so the prefetched unit's
// copy runs beside the current unit's kernels, and the compute stream waits for it only where the
// unit is used.
//
// ZeRO-3 under pipeline parallelism (torchtitan's FSDP inside PP stages). A stage's units are
// its blocks and its outer units (wte alone; wpe or ln_f + lm_head); the schedule runs forwards
// and backwards of different micro-batches in turn, so nothing assumes they alternate: every use
// of a unit waits for it to be gathered -- a block's forward in the block runner, its backward in
// the hook on its output, the outer units in begin_forward / begin_micro -- and a unit gathered
// for one micro-batch's forward is freed after it (the stage's last block and the outer units
// excepted) and gathered again for that micro-batch's backward, however many forwards come
// between: holding every in-flight micro-batch's blocks would hold the whole stage, which is
// what ZeRO-3 is there to avoid. Saved activations that view a freed parameter (the weight a
// matmul's backward needs) are views of the same storage, valid again once it is regathered.
// The outer units and the last block stay gathered from one use to the next until a backward
// ends (end_micro frees the chunk's units): per 1F1B step that is still one gather of each per
// micro-batch (F F .. F: gathered by the first; steady F B: by each F; cool-down B B: by each B).
// Prefetching stays inside a chunk (the interleaved schedule's next block to run may be
// another chunk's).
//
// Offload (ZeroConfig::offload):
//   optimizer  the fp32 master copy of the shard, its moments and the optimizer step live on the
//              host (optim/cpu_adamw.h over pinned buffers); the reduced gradient shard is copied
//              down, the updated shard copied up (P = 2: the host update writes round16(master)
//              into a page-locked 2-byte buffer, and those 2 bytes go up).
//              Host: 4 psi'/N grads + 12 psi'/N optimizer (+ 2 psi'/N upload buffer when P = 2).
//   all        (ZeRO-3) the parameter shard lives on the host as well; each gather copies it up
//              first. P = 4: it is the master copy; P = 2: a 2-byte shard beside the fp32 master
//              (host: P psi'/N + 4 psi'/N + (8 | 12) psi'/N). Nothing stays on the device. Each
//              micro-step's reduced shard reaches the host shard through the host accumulator
//              (parallel/host_accumulator.h): copied on the step's first micro-step, added after.
//
// Offload optimizer's gradient shards leave as they become final -- a unit's last reduction of
// the step (an expert unit's after its 1/ep) -- copied on the accumulator's copy stream while the
// backward goes on; a shard changed after that (the pipeline's tied embedding, grad_shard_of) is
// copied again by the step.
//
// The overlapped host step (offload). Once the verdict is read (the host needs found_inf and the
// factor), step() copies the gradient shards down and queues one task per unit, in unit order, on
// the engine's host worker (parallel/host_worker.h): AdamW with the factor applied as it reads g
// and the 16-bit copy written in the same pass (cpu_adamw's one-pass form), over the host's cores.
// step() returns without waiting for them. Each unit's result is waited for where it is next
// needed -- ZeRO-1/2: the unit's all-gather, issued in order inside step() as each update lands,
// so unit u's all-gather overlaps the host update of u + 1; ZeRO-3: the unit's next gather, so the
// next step's forward starts on the first units while the host still updates the last ones.
// Everything else that touches the host state (the next step, the norm, checkpoints, loads,
// param_moments) settles first: waits for every update. The arithmetic is the serial step's,
// element for element (KILN_TEST_HOST_WORKER=inline runs the tasks at post, the serial order:
// CPU tests compare the two bit for bit).
//
// The delayed update (ZeroConfig::delayed_update; the "one-step delayed parameter update" of
// Ren et al., "ZeRO-Offload: Democratizing Billion-Scale Model Training", 2021). Offload optimizer only. With M_k the fp32 masters after step k's update
// (M_0 the initial weights) and D_k the working weights step k's forward and backward run on:
//   undelayed   D_k = round(M_{k-1})
//   delayed     D_1 = round(M_0),  D_k = round(M_{k-2}) for k >= 2;  M_k = AdamW(M_{k-1}, g(D_k))
// so each gradient is one update stale. step() of step k first waits for step k-1's host update,
// which ran on the host's cores while step k's forward and backward ran on the device, and
// publishes it (copies it up; ZeRO-1/2 all-gather it), then queues step k's. Nothing waits for an
// update before the forward: the gathers read the published shard. The update itself is the
// undelayed one (the same arithmetic on the same host state), only its publication moves. The
// gradient copies of the next backward wait for the update that reads the host copy they overwrite
// (download): by then it has had the whole forward. publish() publishes at once: the trainer calls
// it before a save, an evaluation or a sample, so each of those sees (and saves) M_k at step k;
// the next step then runs on round(M_k) -- the delay restarts there, in the run that saved and in
// the run that resumes from its checkpoint alike, so a resume is exact. A load (a resume, a
// rollback) replaces the pending update. ZeroConfig::delay_from (--offload-delay-from N): the
// first N updates are published undelayed, as ZeRO-Offload's paper turns the delay on only after
// its first few dozen steps, when the gradients change fastest; D_{k+1} = round(M_k) for k <= N.
// Checked against a reference of the rule written apart
// (tests/test_zero_engine.cpp).
//
// Float8 weights (ZeroConfig::float8_weight; --precision fp8, tensorwise, ZeRO-3 without offload
// all; torchtitan's float8 all-gather for FSDP2). A float8 layer's product reads W only as q_W, its
// e4m3 bytes with one scale s_W = amax(|W|) / 448 (kernels/float8.h), so the gather can carry
// those bytes instead of W's: half of bf16's. A block's float8 weights form a unit of their own
// (after the block's other parameters; padded and sharded as any unit), whose 16-bit flat buffer
// is never gathered. Once per step, at the unit's first gather after the weights changed (an
// update, a publish, a load), each rank takes the amax of each weight's piece in its shard, the
// amaxes of the unit's weights are all-reduced (max) over the unit's group -- and over tp, whose
// ranks hold the weight's other parts -- and the rank's shard is cast to e4m3 with the weights'
// scales into an 8-bit shard (q_shard, kept: n_u'/N bytes). Each gather then all-gathers those
// bytes into the unit's 8-bit flat buffer, and the layers read q_W as views of it
// (Float8Scaling::weight8). The values are the ones the layer would quantise from the whole W,
// bit for bit (the amax of the pieces is the amax of the whole; the cast is elementwise).
// Traffic per step, a block with f float8 elements (padded f'): K (f' + f' again for backward)
// bytes gathered instead of P times as many, plus 2 x 4 x (the unit's weights) bytes of amax
// all-reduce over the group (and as many over tp).
//
// The model is built and initialised on the host; only what the stage keeps on the device is
// ever moved there (under ZeRO-3, shards and one or two gathered units at a time).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "distributed/comm.h"
#include "optim/adamw.h"
#include "parallel/grad_ready.h"
#include "parallel/zero_options.h"

namespace kiln {

class GPT;
class BlockImpl;
struct Float8Tensor;
class HostAccumulator;
class HostWorker;
class UploadStream;

struct ZeroConfig {
  int stage = 1;                        // 1, 2 or 3
  Offload offload = Offload::None;      // All needs stage 3
  ZeroAccum accum = ZeroAccum::Reduce;  // gradient accumulation policy of stages 2 and 3
  int64_t grad_accum = 1;               // micro-steps per optimizer step (K)
  int64_t align = 64;                   // shard alignment, elements
  int max_in_flight = 2;                // reductions in flight before the oldest is waited for
  at::ScalarType param_dtype = at::kFloat;   // working weights: fp32, or bf16 / fp16 with fp32 masters
  at::ScalarType reduce_dtype = at::kFloat;  // the gradient reduce-scatters' wire dtype: fp32 or bf16
  // Under tensor parallelism (parallel/tensor_parallel.h) the engine shards this rank's tp slice
  // over dp; param_moments() then also sums over tp.
  std::shared_ptr<Communicator> tp;  // nullptr: no tensor parallelism
  // How a parameter's elements count in the squared gradient norm and in param_moments(), whose
  // sums over the whole dp x tp (x pp) world must count every element of the model once: runs of
  // (elements, weight) over the flattened parameter, in order. 1/tp for a parameter replicated
  // over tp (LayerNorms, wpe, row biases); KV/tp for c_attn's kv rows when tp replicates the kv
  // heads; 0 for the last pipeline stage's copy of the tied wte. Empty function (or an empty
  // result): weight 1.
  std::function<std::vector<std::pair<int64_t, double>>(const at::Tensor& param)> count_weights;
  // Expert parallelism (parallel/expert_parallel.h), stages 1 and 2: the parameters is_expert
  // picks (this rank's experts) form units of their own -- each MoE block's experts one unit,
  // after the unit of the block's other parameters -- padded and sharded over expert_dp (the
  // M = dp / ep ranks holding the same experts; quantum M A) instead of dp. Their reduced mean
  // over expert_dp is multiplied by 1 / ep (the gradient is then the mean over dp of every rank's
  // loss: parallel/expert_parallel.h, "Gradients"), and param_moments sums them over ep as well.
  // A group of one (dp = ep) skips its collectives: the rank holds its experts' only copy, so the
  // mean over it is the gradient itself (no traffic; a bf16 reduce_dtype does not round it).
  // The squared norm needs nothing more: summed over dp, the expert shards cover every expert once.
  std::function<bool(const at::Tensor& param)> is_expert;  // empty: no expert parallelism
  std::shared_ptr<Communicator> expert_dp, ep;
  // --offload-delayed-update (offload optimizer only): each step's host update reaches the
  // working weights at the next step's step() instead of before its forward, so it runs under
  // that step's forward and backward. See "The delayed update".
  bool delayed_update = false;
  int64_t delay_from = 0;
  // ZeRO-3's 8-bit gather of the float8 layers' weights (see "Float8 weights"): the slot a
  // parameter's layer reads its gathered q_W from (Float8Scaling::weight8), null for a parameter
  // that is not such a weight. Empty: every unit gathered in param_dtype.
  std::function<std::shared_ptr<Float8Tensor>(const at::Tensor& param)> float8_weight;  // the delay starts with the update after this many (--offload-delay-from; 0: the first)
};

// Model-state bytes this rank holds, by kind and place (optimizer: the moments, plus the fp32
// master copy where it is not the parameters themselves; the 0-dim step counters are not
// counted). cast_copies (device only): autocast's 2-byte copies of fp32 weights, held from the
// forward to the backward (optim/precision.h; not the engine's: the trainer counts them).
struct ModelStateBytes {
  struct Place {
    int64_t params = 0, grads = 0, optimizer = 0, cast_copies = 0;
  };
  Place device, host;
};

// This rank's shards frozen for an asynchronous checkpoint (ZeroEngine::snapshot).
struct ZeroSnapshot {
  std::vector<std::array<at::Tensor, 3>> shards;  // per unit: [param (fp32 master), exp_avg, exp_avg_sq]
  int64_t steps = 0;                              // AdamW updates applied
};

class ZeroEngine {
 public:
  // model: built and initialised on the host (fp32, CPU). Its parameters become views of the
  // engine's buffers on `device`; the AdamW state starts at zero (a resume then loads parameters
  // and state with load_param and set_steps_taken). Collective over dp.
  ZeroEngine(GPT& model, c10::Device device, std::shared_ptr<Communicator> dp, ZeroConfig cfg, AdamWConfig adam);
  ~ZeroEngine();
  ZeroEngine(const ZeroEngine&) = delete;
  ZeroEngine& operator=(const ZeroEngine&) = delete;

  // Before micro-step `micro` (0..K-1) of a step: the first one clears the gradient shards;
  // ZeRO-3 gathers unit 0. `chunk` >= 0: a pipeline stage's backward of that model chunk alone
  // (the interleaved schedule runs a micro-batch's backward in one piece a chunk, other
  // micro-batches' between them): only the chunk's units are cleared, counted and reduced, so
  // each chunk's micro-steps are in turn, as the engine needs, though the rank's are not.
  void begin_micro(int64_t micro, int chunk = -1);
  // After its backward: waits for the reductions it launched (and launches any a hook did not).
  void end_micro(int chunk = -1);
  // A pipeline stage (ZeRO-3): before a forward of `chunk` (-1: the stage's only one), which the
  // schedule runs apart from its backward -- gathers the chunk's outer units (the embedding, or
  // ln_f and the head) and prefetches its first block. See "ZeRO-3 under pipeline parallelism".
  void begin_forward(int chunk = -1);

  // The reduced gradient shard (after the last end_micro of a step) of the unit that holds
  // `param` alone -- a pipeline stage's wte (the tied-embedding sync adds the first and last
  // stages' shards). Throws for a parameter that shares its unit.
  at::Tensor grad_shard_of(const at::Tensor& param) const;

  // The squared L2 norm of this rank's reduced gradient shard (fp32 scalar on the device);
  // summed over dp it is the squared global norm.
  at::Tensor local_grad_sq_norm() const;
  // g <- g * grad_factor (clipping and loss-scale division), one AdamW update of the shard with
  // learning rate lr (on the fp32 masters), the working shard rewritten from them (16-bit
  // weights), then (stages 1, 2) the updated parameters all-gathered. grad_factor and found_inf
  // are 0-dim fp32 tensors on the device (found_inf 1: the kernel skips the update, and the step
  // count stays), so without offload the step takes no host synchronisation; the offloaded step
  // runs on the host and reads both there.
  // Without offload the update is kernels/adamw.h's (set_kernels: kiln's one-pass kernel on
  // CUDA, LibTorch's ops as the reference).
  void step(double lr, const at::Tensor& grad_factor, const at::Tensor& found_inf);
  // The delayed update: the last step's host update into the working weights now (ZeRO-1/2: an
  // all-gather, collective over dp). A no-op without a pending one, and without the delay.
  void publish();
  void set_kernels(Kernels k) { kernels_ = k; }

  // Evaluation without backward under ZeRO-3: gathers unit 0 / frees every gathered unit.
  void begin_forward_only();
  void end_forward_only();

  // Checkpoints, one parameter at a time (runtime/checkpoint/consolidate.h). gather_param: collective over
  // dp -- each rank sends dp rank 0 its shard's piece of `param` (one of the model's parameters:
  // this rank's tensor-parallel slice); on dp rank 0 the whole of it (param's shape, fp32, on the
  // device), undefined elsewhere. Param is the fp32 master. ZeRO-1/2's fp32 parameters need no
  // traffic (every rank holds them); their 16-bit ones are gathered from the masters.
  // load_param: `local` (param's shape, any device) into this rank's shards (and ZeRO-1/2's whole
  // parameters); local, no communication.
  at::Tensor gather_param(const at::Tensor& param, StatePart part);
  void load_param(const at::Tensor& param, StatePart part, const at::Tensor& local);
  // Checkpoints written while training goes on (runtime/checkpoint/async_save.h). snapshot: this
  // rank's shards of every unit -- the parameter (the fp32 master where there is one) and AdamW's
  // moments -- and the step count, copied into `into` (tensors made by `alloc(numel)` on the first
  // call and reused: host memory, pinned on a GPU; the copies are queued on the current stream,
  // the caller synchronises). gather_snapshot: gather_param's pieces from a snapshot, over host
  // groups twin to the engine's (`dense`: dp x cp; `experts`: expert-dp, null without --ep), onto
  // their rank 0 (fp32, on the host); undefined elsewhere. Reads only the units' layout, which
  // never changes: safe on another thread while this one trains.
  void snapshot(ZeroSnapshot& into, const std::function<at::Tensor(int64_t)>& alloc);
  int64_t snapshot_numel() const;  // what snapshot allocates: 3 x the rank's shards
  at::Tensor gather_snapshot(const ZeroSnapshot& s, const at::Tensor& param, StatePart part, Communicator& dense,
                             Communicator* experts) const;
  // AdamW updates applied (its bias correction's t). Without offload the count lives on the
  // device (advanced by 1 - found_inf): reading it waits for the device.
  int64_t steps_taken() const;
  void set_steps_taken(int64_t n);

  // Collective over dp: the sum and the sum of squares of all parameters (in double), for
  // comparing runs.
  std::pair<double, double> param_moments();

  ModelStateBytes memory() const;
  int64_t padded_numel() const;     // psi'

 private:
  struct Unit;
  struct Segment;
  void gather_async(Unit& u);
  void wait_gathered(Unit& u);
  void release(Unit& u);
  void quantise_shard(Unit& u);  // float8 unit: its 8-bit shard and scales from the working shard (once per change)
  void on_grad_ready(Unit& u, size_t k);
  void launch_reduction(Unit& u);
  void finish_reduction(Unit& u);
  void wait_reductions(size_t keep);
  // Offload: the unit's queued host update has run and (offload optimizer) its result is copied
  // up; settle: every unit's, every host add landed, and any shard still `fresh` zeroed -- before
  // anything reads or writes the host state (see "The overlapped host step").
  // (Under the delayed update finish_update only waits: publish() uploads.)
  void finish_update(Unit& u) const;
  void settle() const;
  void upload(Unit& u) const;  // offload optimizer: the unit's updated shard up to the device, if not yet
  void publish_units();        // every unit's update waited for, uploaded, and (ZeRO-1/2) all-gathered
  void post_update(Unit& u, double lr, double factor);
  void download(Unit& u);  // offload optimizer: the final gradient shard to the host, off the step
  void post_norm(Unit& u);  // offload all: the final host shard's squared norm, on the host worker
  std::vector<at::Tensor> sq_parts(const Unit& u) const;  // the pieces of the unit's squared norm
  bool host_sums() const { return cfg_.offload == Offload::All && streamed(); }  // grads summed on the host
  bool streamed() const;  // gradients reduce-scattered every micro-step (no full local buffer)
  bool sixteen() const { return cfg_.param_dtype != at::kFloat; }  // 16-bit working weights
  static bool alone(const Unit& u);  // an expert unit whose expert-data-parallel group is one rank
  at::Tensor param_shard(Unit& u) const;
  std::pair<Unit*, size_t> locate(const at::Tensor& param) const;
  at::Tensor shard_of(Unit& u, StatePart part);  // this rank's shard of the part (the master for Param)

  GPT& model_;
  std::function<at::Tensor(BlockImpl&, const at::Tensor&)> inner_runner_;  // the runner ZeRO-3 wraps
  c10::Device device_;
  std::shared_ptr<Communicator> dp_;
  ZeroConfig cfg_;
  AdamWConfig adam_;
  Kernels kernels_ = Kernels::reference;  // the step's update (set_kernels)
  std::vector<std::unique_ptr<Unit>> units_;
  std::vector<std::vector<size_t>> block_units_;  // block i's units (its dense part, then its experts under --ep)
  std::vector<int> unit_chunk_;                   // the model chunk each unit's parameters belong to
  std::vector<int> block_chunk_;                  // the chunk of each block (blocks() order)
  std::vector<size_t> outer_units_;               // the units outside the blocks (wte; wpe, ln_f, lm_head)
  bool in_chunk(size_t unit, int chunk) const { return chunk < 0 || unit_chunk_[unit] == chunk; }
  std::vector<Unit*> in_flight_;  // reductions launched and not yet finished, oldest first
  std::unique_ptr<HostWorker> host_;             // offload: runs the host adds and the per-unit updates, in order
  std::unique_ptr<HostAccumulator> host_adds_;  // offload: reduced shards into (all) / final shards to (optimizer) the host
  std::unique_ptr<UploadStream> uploads_;       // offload all: the gathers' copies up, beside the compute stream
  GradReadyHooks hooks_;
  bool last_micro_ = true;
  int64_t steps_ = 0;   // offload: the host's count
  bool delaying_ = false;  // the delayed update holds the queued updates back (from delay_from on)
  at::Tensor step_t_;   // no offload: the count, a 0-dim fp32 tensor on the device
};

}  // namespace kiln
