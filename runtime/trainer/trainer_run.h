// runtime/trainer/trainer_run.h -- what a running Trainer holds (Trainer::Run) and what one step reports
// (Trainer::StepOutcome). Private to the trainer's sources: trainer.cpp (set-up, the step,
// evaluation, the loop) and trainer_records.cpp (the config record and the start-up lines).
#pragma once

#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "data/prefetch.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "distributed/cuda_graph.h"
#include "distributed/device.h"
#include "distributed/host_threads.h"
#include "distributed/job_devices.h"
#include "distributed/mesh.h"
#include "distributed/wait_clock.h"
#include "distributed/watchdog.h"
#include "models/gpt.h"
#include "models/moe_stats.h"
#include "optim/adamw.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/precision.h"
#include "parallel/ddp.h"
#include "parallel/expert_parallel.h"
#include "parallel/main_grads.h"
#include "parallel/pipeline.h"
#include "parallel/zero.h"
#include "runtime/checkpoint/async_save.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/consolidate.h"
#include "runtime/observe/energy.h"
#include "runtime/observe/log_sink.h"
#include "runtime/observe/phase_timer.h"
#include "runtime/observe/profiler.h"
#include "runtime/observe/stragglers.h"
#include "runtime/trainer/nonfinite_guard.h"
#include "runtime/trainer/replica_check.h"
#include "runtime/trainer/save_dir_lock.h"
#include "runtime/trainer/spike_guard.h"
#include "runtime/trainer/stop_requests.h"
#include "runtime/trainer/trainer.h"

namespace kiln {

// JSON has no inf or NaN: a non-finite figure is logged as null.
inline nlohmann::json json_num(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

// Model-state bytes as the log writes them: {"device": {params, grads, optimizer}, "host": {...}}.
inline nlohmann::json model_state_json(const ModelStateBytes& b) {
  auto place = [](const ModelStateBytes::Place& p) {
    return nlohmann::json{{"params", p.params}, {"grads", p.grads}, {"optimizer", p.optimizer}};
  };
  nlohmann::json device = place(b.device);
  device["cast_copies"] = b.device.cast_copies;  // autocast's copies (optim/precision.h): the device's alone
  return nlohmann::json{{"device", device}, {"host", place(b.host)}};
}

// --cuda-graph (runtime/trainer/trainer_graph.cpp): the step as two CUDA graphs, captured at the
// run's third step and replayed from then on.
struct StepGraphs {
  CudaGraph step;    // the gradients zeroed, the micro-batches' forward and backward, the norm, the verdict
  CudaGraph update;  // found_inf, the clip factor, AdamW (the rate read from `lr`)
  std::vector<Batch> batches;  // the device inputs the step graph reads: each replay's batch is copied in first
  at::Tensor loss_sum, verdict;  // what the step graph writes, every replay into the same tensors
  at::Tensor lr;                 // 0-dim fp32 on the device: the update's rate, filled in before each replay
  int64_t norm_index = 2;
  int loss_copies = 1, moe_copies = 1;
  int64_t capture_at = -1;  // the step the graphs are captured at (the run's third: two eager steps warm up first)
};

struct Trainer::Run {
  MeshShape shape;
  DeviceInfo dev;
  std::string backend = "none";
  std::shared_ptr<Watchdog> watchdog;
  std::unique_ptr<Mesh> mesh;
  int dp_rank = 0;
  Precision precision = Precision::FP32;
  std::pair<int64_t, int64_t> float8_layers{0, 0};  // --precision fp8: {block layers in float8, of} on this stage

  std::shared_ptr<const TokenDataset> train_data;
  std::shared_ptr<const Tokenizer> tokenizer;  // the data's (data/tokenizer.h); null: none known
  std::string tokenizer_source;                // where it came from, or why there is none
  std::unique_ptr<DataLoader> loader, val_loader;

  std::shared_ptr<GPT> model;
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> grads;               // where gradients accumulate (AdamW's grad targets: fp32)
  std::unique_ptr<MainGrads> main_grads;       // 16-bit working weights without DDP: fp32 accumulation
  // --ep (parallel/expert_parallel.h): the experts' gradient targets and their reduction over the
  // expert-data-parallel group (ddp then holds the dense parameters only).
  std::vector<at::Tensor> dense_targets, expert_targets;
  std::unique_ptr<DistributedDataParallel> expert_ddp;
  std::shared_ptr<ExpertTraffic> ep_traffic;   // the rows the dispatches moved (the step record's ep_rows_*)
  GradOf grad_of;                              // 16-bit working weights: a parameter's main grad (else empty: .grad())
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<ZeroEngine> zero;            // --zero 1..3: shards, reductions and the step
  std::unique_ptr<PipelineStage> pipe;         // --pp > 1: this rank's stage and its 1F1B schedule
  std::vector<int64_t> stage_blocks;           // blocks per pipeline stage
  std::shared_ptr<Communicator> host_world;    // MPI over the world, for host tensors under NCCL
  std::shared_ptr<Communicator> metrics_world; // MPI over the world for the job's devices and energy (not comm_bytes), until JobDevices takes it
  std::unique_ptr<StragglerWatch> stragglers;  // each step's slowest rank, the run's slow ranks (runtime/observe/stragglers.h)
  std::shared_ptr<WaitClock> wait_clock;       // the mesh's waits, by phase-timer interval (distributed/wait_clock.h)
  double test_slow_ms = 0;                     // test-only KILN_TEST_SLOW_RANK: this rank's steps so much longer
  double test_slow_factor = 0;                 // ... or this many times its own compute of the step before
  double test_own_compute_ms = 0;              // that compute, less the delay (record())
  std::unique_ptr<AdamW> optimizer;            // ZeRO-0 (ZeRO: only while resuming, on the host)
  std::unique_ptr<LossScaler> scaler;
  std::unique_ptr<SpikeGuard> spikes;          // --spike-rollback (runtime/trainer/spike_guard.h)
  std::unique_ptr<ReplicaCheck> replicas;      // --check-replicas: the replicas' weights compared
  std::unique_ptr<NonfiniteGuard> nonfinite;   // bf16/fp32: a non-finite step's origin, --max-skipped-steps
  int64_t skipped_in_a_row = 0;                // bf16/fp32: non-finite steps skipped since the last finite one
  std::optional<LRSchedule> schedule;
  std::unique_ptr<SaveDirLock> save_lock;      // rank 0, with --save-dir: one job per save directory
  std::unique_ptr<StopRequests> stop;          // the signals that stop the run cleanly
  std::vector<ConfigChange> config_changes;    // a resumed run's settings that differ from its checkpoint's
  int64_t val_samples = 0;                     // the validation set's samples (--val-data)
  int64_t eval_batches = 0;                    // micro-batches per evaluation: --eval-batches, or the set once (0)
  nlohmann::json data_sources;                 // the training data's files, token counts, fingerprints (saved with checkpoints)
  std::unique_ptr<WholeModel> state;           // the whole model tensor by tensor, for checkpoints
  std::unique_ptr<Checkpointer> checkpointer;  // every rank, with --save-dir (rank 0 writes)
  std::unique_ptr<AsyncSaver> saver;           // --async-save: the save in flight (after checkpointer: destroyed first)
  std::string resume_notice;                   // a repair of the save directory at resume, or ""
  std::optional<CheckpointIo> load_io;         // what the resume read
  std::optional<CheckpointIo> init_io;         // what --init-from read (a fresh run started from its weights)

  TrainProgress progress;     // steps done, updates applied, data position, scaler state
  // The lowest val loss so far (--keep-best, --early-stop), carried in checkpoints ("best").
  struct Best {
    double val_loss = INFINITY;
    int64_t step = 0;          // where it was measured (0: no evaluation yet)
    int64_t evals_since = 0;   // evaluations since, none lower
  } best;
  std::string resumed_from;   // checkpoint directory, or empty
  std::optional<double> peak;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();  // the run's start, for --max-wall-time
  HostThreads threads;                  // this rank's share of its node's cores
  std::unique_ptr<PhaseTimer> timer;    // forward / backward / comm / optimizer split of a step
  std::unique_ptr<StepGraphs> graphs;          // --cuda-graph
  std::unique_ptr<BatchPrefetcher> prefetch;  // the next step's micro-batches, made meanwhile
  // A step's interval runs from the previous step's one host synchronisation (its verdict's read)
  // to its own; a new chain starts at the first step and after an evaluation or a save.
  bool chain_broken = true;
  std::optional<double> interval_joules;  // this rank's energy counter at the last step's record (or the chain's start)
  std::unique_ptr<EnergyMeter> energy;  // the GPU's energy counter (unavailable on the CPU)
  std::unique_ptr<JobDevices> devices;  // distinct devices of the job; the energy summed over them
  double flops_per_token = 0.0;
  int64_t tokens_per_step = 0;
  LogSink log;

  // This rank's model-state bytes by kind and place (parallel/zero.h's table): ZeRO's read off its
  // buffers; otherwise 4 B of parameter, 4 B of gradient and 8 B of AdamW moments per parameter.
  at::Tensor verdict_host;  // the verdict's host copy (pinned on a GPU), reused every step (trainer_step.cpp)
  int64_t cast_copy_bytes = 0;  // autocast's 16-bit copies of fp32 weights (optim/precision.h), and
                                // fp8's kept 8-bit weight forms (2 bytes an element of float8_kept_numel)
  int64_t float8_kept_numel = 0;  // --precision fp8 outside ZeRO-3: the float8 layers' weights quantised once a step
  ModelStateBytes model_state() const {
    ModelStateBytes state = zero ? zero->memory() : ModelStateBytes{};
    state.device.cast_copies = cast_copy_bytes;
    if (zero) return state;
    const int64_t psi = model->num_params();  // this rank's (its tp slices, its stage)
    // 16-bit working weights (optim/adamw.h): 2-byte parameters, fp32 main grads (or the 2-byte
    // gradients themselves where AdamW reads those), and the fp32 master with the optimizer's moments.
    const bool masters = optimizer && optimizer->has_masters();
    const int64_t grad_bytes = masters && optimizer->reads_working_grads() ? 2 : 4;
    state.device = {masters ? 2 * psi : 4 * psi, grad_bytes * psi, masters ? 12 * psi : 8 * psi, cast_copy_bytes};
    return state;
  }

  int64_t comm_bytes() const {
    return mesh ? mesh->bytes_sent() : int64_t{0};
  }
};

// A step queued on the device, not yet read by the host (runtime/trainer/trainer.cpp: forward_backward,
// queue_update, finish_step).
struct Trainer::QueuedStep {
  int64_t step = 0;
  double loss_scale = 1.0, lr = 0.0;
  int64_t comm_bytes = 0;  // this rank's traffic in the step (comm_bytes() at its start, then the difference)
  int64_t ep_comm_bytes = 0;  // of it, the expert-parallel group's (the same way)
  ExpertTraffic ep_rows;      // the dispatches' rows (the same way)
  int64_t host_syncs = 0;  // host_syncs() at its start, then the waits up to its queued update
  int64_t loss_tokens = -1;  // masked data: the global batch's trained targets (the prefetcher's count); -1: unmasked
  int loss_copies = 1;     // the ranks whose losses the verdict's loss sums
  int moe_copies = 1;      // the copies of each MoE stats row the verdict sums (tp, when reduced over the world)
  at::Tensor verdict;      // [mean loss, non-finite, MoE stats rows (MoE models), norm (or summed squares)], reduced, on the device
  int64_t norm_index = 2;  // where the norm is in it
  at::Tensor host;         // its copy in host memory (Run::verdict_host), queued after the update
  size_t mark = 0;         // the PhaseTimer mark after the update and that copy
  bool graphed = false;    // its forward and backward ran as the step graph: its update runs as the update graph
};

// What the loop keeps across its steps (trainer_loop.cpp).
struct Trainer::Loop {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();  // after set-up
  int64_t first_step = 0, end_step = 0;  // this invocation's steps, [first, end)
  double tokens_per_s_sum = 0.0, last_loss = NAN, last_eval = NAN;
  int64_t last_comm_bytes = 0;  // this rank's, in the last step
  int64_t timed_steps = 0, skipped_steps = 0;
  double timed_joules = 0.0, timed_seconds = 0.0;  // over the timed steps, when the meters read
  bool energy_ok = false;       // every rank's meter: the job's joules can be summed
  double devices = 1.0;         // the job's distinct devices (distributed/job_devices.h)
  std::vector<double> losses;
  std::string last_saved;
  std::string stop_reason;  // why the run stopped early, or ""
  int64_t stopped_at = 0;   // the step it stopped after
  int64_t early_stopped_at = 0;  // --early-stop ended the run after this step (0: it did not)
  double longest_step_s = 0.0, last_save_s = 0.0;  // --max-wall-time's estimate of what comes next
  std::map<int64_t, AsyncSaver::Started> save_stalls;  // --async-save: each save in flight's stall, by step
  int64_t rollback_to = -1;  // a spike rollback's step to go on from (0-based, the checkpoint's step), or -1
  int64_t rollbacks = 0;     // spike rollbacks made by this invocation
  std::unique_ptr<StepProfiler> profiler;          // --profile (runtime/observe/profiler.h)
  int64_t profile_first = 0, profile_end = 0;      // its window, 0-based [first, end)
};

// One step's figures as its record and console line give them.
struct Trainer::StepFigures {
  double step_s = 0.0, tokens_per_s = 0.0, tflops = 0.0, tflops_job = 0.0, mem_gb = 0.0, elapsed_s = 0.0;
  std::optional<double> step_joules;  // the job's, when every meter reads
  SlowestRank slowest;                // the rank with the longest compute (forward + backward) this step
  int64_t tokens_seen = 0;
};

struct Trainer::StepOutcome {
  double loss = NAN, norm = NAN, lr = 0.0, loss_scale = 1.0;
  bool skipped = false;
  int64_t comm_bytes = 0;  // this rank's traffic in the step
  int64_t ep_comm_bytes = 0;  // of it, the expert-parallel group's: the MoE all-to-alls and the norm's expert part
  ExpertTraffic ep_rows;      // the rows the all-to-alls moved (parallel/expert_parallel.h)
  int64_t host_syncs = 0;  // host_syncs() from the step's start to its queued update
  int64_t loss_tokens = -1;  // masked data: the targets the loss was taken over; -1: unmasked
  bool read_deferred = false;  // its verdict read after the next step's forward and backward were queued
  std::optional<MoEStepStats> moe;  // MoE models: the step's routing (models/moe_stats.h)
  std::array<double, kNumPhases> phase_ms{};  // the step's interval, by phase (PhaseTimer::cut): its sum is the step's time
  double compute_wait_ms = 0;  // of its forward and backward, the time this rank stood still in collectives' waits
};

}  // namespace kiln
