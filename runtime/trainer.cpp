// runtime/trainer.cpp -- set-up, evaluation, checkpoints and the loop (its step, eval and summary
// records); the step itself is trainer_step.cpp's, the config record trainer_records.cpp's, the
// run's state trainer_run.h's.
#include "runtime/trainer.h"
#include "runtime/trainer_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>
#include <tuple>

#include <ATen/ATen.h>

#include "data/hf_tokenizer.h"
#include "data/loader.h"
#include "data/paths.h"
#include "data/prep.h"
#include "data/prefetch.h"
#include "data/synthetic.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "models/gpt.h"
#include "optim/adamw.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "parallel/activation_checkpoint.h"
#include "parallel/ddp.h"
#include "parallel/expert_parallel.h"
#include "parallel/pipeline.h"
#include "parallel/pipeline_layout.h"
#include "parallel/tensor_parallel.h"
#include "parallel/sequence_parallel.h"
#include "parallel/context_parallel.h"
#include "parallel/zero.h"
#include "runtime/backend_choice.h"
#include "runtime/checkpoint.h"
#include "runtime/console.h"
#include "runtime/consolidate.h"
#include "runtime/comm_mpi.h"
#if defined(KILN_WITH_CUDA)
#include "runtime/comm_nccl.h"
#endif
#include "runtime/device.h"
#include "runtime/device_check.h"
#include "runtime/host_threads.h"
#include "runtime/rank0_verdict.h"
#include "runtime/save_dir_lock.h"
#include "runtime/stop_requests.h"
#include "runtime/energy.h"
#include "runtime/error.h"
#include "runtime/generate.h"
#include "runtime/job_devices.h"
#include "runtime/log_sink.h"
#include "runtime/mesh.h"
#include "runtime/metrics.h"
#include "runtime/phase_timer.h"
#include "runtime/profiler.h"
#include "runtime/precision.h"
#include "runtime/watchdog.h"

namespace kiln {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::shared_ptr<const TokenDataset> training_data(const TrainConfig& cfg) {
  if (cfg.data.empty()) {
    std::vector<std::shared_ptr<const TokenSource>> sources{
        std::make_shared<SyntheticCorpus>(cfg.synthetic_tokens, cfg.gpt.vocab_size)};
    return std::make_shared<TokenDataset>(std::move(sources), cfg.gpt.seq_len, cfg.gpt.vocab_size);
  }
  return std::make_shared<TokenDataset>(TokenDataset::from_paths(
      cfg.data, parse_token_format(cfg.data_format), cfg.gpt.seq_len, cfg.gpt.vocab_size));
}


// The stop request of the wall-time limit, above every signal number (the ranks agree on the
// largest request).
constexpr int64_t kStopWallTime = 1000;


}  // namespace

Trainer::Trainer(TrainConfig cfg, ProcessInfo proc) : cfg_(std::move(cfg)), proc_(proc) {}
Trainer::~Trainer() = default;

void Trainer::setup() {
  run_ = std::make_unique<Run>();
  Run& r = *run_;
  if (!proc_.mpi && cfg_.tp * cfg_.pp * cfg_.cp > 1) {
    const int64_t n = cfg_.tp * cfg_.pp * cfg_.cp;
    throw ConfigError("--tp " + std::to_string(cfg_.tp) + " x --pp " + std::to_string(cfg_.pp) +
                      (cfg_.cp > 1 ? " x --cp " + std::to_string(cfg_.cp) : std::string()) + " needs " + std::to_string(n) +
                      " ranks: launch with mpirun -np " + std::to_string(n) + " (or a multiple of " + std::to_string(n) +
                      " for data parallelism as well)");
  }
  r.shape = MeshShape::resolve(proc_.world_size, static_cast<int>(cfg_.tp), static_cast<int>(cfg_.pp), static_cast<int>(cfg_.cp));
  r.shape.ep = static_cast<int>(cfg_.ep);
  if (r.shape.dp % r.shape.ep != 0) {
    throw ConfigError("--ep " + std::to_string(cfg_.ep) + " must divide the data-parallel size (dp " + std::to_string(r.shape.dp) +
                      " of " + std::to_string(proc_.world_size) + " ranks): the expert-parallel groups are carved out of dp");
  }
  r.dev = select_device(cfg_.device, proc_.local_rank);
  r.precision = parse_precision(cfg_.precision);
  const c10::Device device = r.dev.device;
  if (cfg_.device_memory_cap_gb > 0) cap_device_memory(device, cfg_.device_memory_cap_gb);
  // A node's ranks share its cores, on CPU and GPU runs alike (runtime/host_threads.h).
  r.threads = divide_host_threads(proc_.local_size);
  // Communicators: always with several ranks; in a world of one only when a backend is named
  // (`mpirun -np 1 kiln train --backend nccl` runs the NCCL path and the DDP wrapper alone).
  const bool explicit_backend = cfg_.backend != "auto";
  if (proc_.world_size > 1 || explicit_backend || cfg_.zero > 0) {
    if (!proc_.mpi) {
      throw ConfigError(std::string(cfg_.zero > 0 ? "--zero " + std::to_string(cfg_.zero) : "--backend " + cfg_.backend) +
                        " needs MPI: launch with mpirun (mpirun -np 1 for a world of one)");
    }
    r.backend = choose_backend(cfg_.backend, device, MPI_COMM_WORLD);
    r.watchdog = std::make_shared<Watchdog>(cfg_.comm_init_timeout);  // start-up grace until step 1 is done
    std::shared_ptr<Communicator> world;
#if defined(KILN_WITH_CUDA)
    if (r.backend == "nccl") world = make_nccl_communicator(MPI_COMM_WORLD, "world", device.index(), r.watchdog);
#endif
    if (!world) world = make_mpi_communicator(MPI_COMM_WORLD, "world", r.watchdog, device);
    r.mesh = std::make_unique<Mesh>(std::move(world), r.shape);
    r.dp_rank = r.mesh->coord().dp;
    // Checkpoints move host tensors, which NCCL cannot and the run's groups refuse: they go over
    // a host group of their own (MPI, no device; its traffic is not the steps' comm_bytes).
    r.host_world = make_mpi_communicator(MPI_COMM_WORLD, "host", r.watchdog);
  }
  // One job per save directory, and one that can be written (runtime/save_dir_lock.h): rank 0
  // takes the lock now, not at the first save, and its verdict ends every rank alike.
  if (!cfg_.save_dir.empty()) {
    decide_on_rank0(r.host_world.get(), [&] { r.save_lock = std::make_unique<SaveDirLock>(cfg_.save_dir); });
  }
  r.stop = std::make_unique<StopRequests>(cfg_.stop_signals);  // runtime/stop_requests.h
  // The job's distinct devices and the energy summed over them, over a communicator of their
  // own: the mesh's (host_world too, under the MPI backend) are counted in comm_bytes.
  std::shared_ptr<Communicator> metrics_world;
  if (r.mesh) metrics_world = make_mpi_communicator(MPI_COMM_WORLD, "metrics", r.watchdog);

  // The data's tokenizer (data/tokenizer.h): in the config record, saved with every checkpoint,
  // and what --sample-every decodes with.
  {
    DataTokenizer t =
        tokenizer_for_data(cfg_.tokenizer, cfg_.data.empty() ? std::vector<std::string>{} : expand_paths(cfg_.data, "--data"), cfg_.gpt.vocab_size);
    r.tokenizer = std::move(t.tokenizer);
    r.tokenizer_source = t.source;
  }
  if (cfg_.sample_every > 0 && !r.tokenizer) {  // its ids decode the samples
    throw ConfigError(cfg_.data.empty() ? "--sample-every needs --vocab-size of at least " + std::to_string(kByteVocab) + " (the byte-level tokenizer's ids)"
                                        : "--sample-every needs the data's tokenizer: no tokenizer.json beside the --data files (kiln prep writes one); give --tokenizer FILE");
  }
  r.train_data = training_data(cfg_);
  const BatchLayout layout{cfg_.micro_batch, cfg_.grad_accum, r.shape.dp, r.dp_rank};
  r.loader = std::make_unique<DataLoader>(r.train_data, cfg_.seed, /*shuffle=*/true, layout);
  if (!cfg_.val_data.empty()) {
    auto val = std::make_shared<TokenDataset>(TokenDataset::from_paths(
        cfg_.val_data, parse_token_format(cfg_.data_format), cfg_.gpt.seq_len, cfg_.gpt.vocab_size));
    r.val_loader = std::make_unique<DataLoader>(val, cfg_.seed, /*shuffle=*/false, BatchLayout{cfg_.micro_batch, 1, 1, 0});
  }

  // Built and initialised on the host; ZeRO moves only what its stage keeps on the device.
  // Tensor parallelism: this rank's slices; pipeline parallelism: this stage's blocks (and the
  // embedding / head). Every layout draws the whole model's parameters from the seed one at a
  // time and keeps its part, so every layout starts from the same weights.
  r.stage_blocks = pipeline_block_counts(cfg_.gpt.n_layer, r.shape.pp, cfg_.pp_split);
  {
    ModelShard shard = r.shape.tp > 1 ? make_tensor_parallel_shard(cfg_.gpt, r.mesh->tp(), cfg_.sp) : ModelShard{};
    if (r.shape.cp > 1) shard = make_context_parallel(std::move(shard), cfg_.gpt, r.mesh->cp());
    if (r.shape.pp > 1) shard = pipeline_stage_shard(std::move(shard), r.stage_blocks, r.mesh->coord().pp);
    if (r.shape.ep > 1) {
      r.ep_traffic = std::make_shared<ExpertTraffic>();
      shard = make_expert_parallel(std::move(shard), cfg_.gpt, r.mesh->ep(), r.ep_traffic);
    }
    r.model = std::make_shared<GPT>(cfg_.gpt, at::TensorOptions(), std::move(shard));
    GPT::TensorSlicer slicer = r.shape.tp > 1 ? tp_slicer(cfg_.gpt, r.shape.tp, r.mesh->coord().tp) : nullptr;
    if (r.shape.ep > 1) {  // the experts are not split over tp: their rows of this ep rank
      slicer = [tp = slicer, ep = ep_slicer(r.shape.ep, r.mesh->ep()->rank())](const std::string& name, const at::Tensor& whole) {
        return ep(name, tp ? tp(name, whole) : whole);
      };
    }
    r.model->init_weights(cfg_.seed, slicer);
    // Sequence parallelism: the replicated parameters see their rank's rows; their gradients are summed over tp.
    if (cfg_.sp) sum_replicated_gradients_over_tp(*r.model, r.mesh->tp());
  }
  if (cfg_.zero == 0) module_to_device(*r.model, device);
  r.model->loss_chunk_rows = cfg_.loss_chunk_rows;
  r.model->train();
  // Parallelism applied from outside the model, in torchtitan's order: activation checkpointing,
  // then data parallelism (DDP or ZeRO).
  apply_activation_checkpointing(*r.model, parse_activation_checkpointing(cfg_.activation_checkpointing));
  r.params = r.model->parameters();
  const AdamWConfig adam{cfg_.beta1, cfg_.beta2, cfg_.adam_eps, cfg_.weight_decay};
  if (cfg_.zero == 0) {
    // ZeRO-0 steps this AdamW. 16-bit working weights: it keeps the fp32 masters and casts the
    // model's parameters (optim/adamw.h); gradients then accumulate in the masters' fp32 .grad.
    r.optimizer = std::make_unique<AdamW>(r.params, adam, dtype_named(cfg_.resolved_param_dtype()));
    r.grads = r.optimizer->grad_targets();
    if (r.shape.ep > 1) {
      // Expert parallelism: the dense parameters' mean over dp, the experts' over the ranks
      // holding the same ones (then x 1/ep: parallel/expert_parallel.h).
      std::vector<at::Tensor> dense, experts;
      const auto named = r.model->named_parameters();
      for (size_t k = 0; k < named.size(); ++k) {
        const bool expert = is_expert_parameter(named[k].key());
        (expert ? experts : dense).push_back(r.params[k]);
        (expert ? r.expert_targets : r.dense_targets).push_back(r.grads[k]);
      }
      const bool masters = r.optimizer->has_masters();
      r.ddp = std::make_unique<DistributedDataParallel>(dense, r.mesh->dp_cp(), DDPConfig{}, masters ? r.dense_targets : std::vector<at::Tensor>{},
                                                        dtype_named(cfg_.reduce_dtype));
      DDPConfig alone;
      alone.skip_if_alone = true;
      r.expert_ddp = std::make_unique<DistributedDataParallel>(experts, r.mesh->expert_dp(), alone,
                                                               masters ? r.expert_targets : std::vector<at::Tensor>{},
                                                               dtype_named(cfg_.reduce_dtype));
      r.ddp->broadcast_parameters();
      r.expert_ddp->broadcast_parameters();
    } else if (r.mesh && (r.shape.grad_ranks() > 1 || explicit_backend)) {  // over dp x cp (runtime/mesh.h)
      r.ddp = std::make_unique<DistributedDataParallel>(r.params, r.mesh->dp_cp(), DDPConfig{},
                                                        r.optimizer->has_masters() ? r.grads : std::vector<at::Tensor>{},
                                                        dtype_named(cfg_.reduce_dtype));
      r.ddp->broadcast_parameters();
    } else if (r.optimizer->has_masters()) {
      r.main_grads = std::make_unique<MainGrads>(r.params, r.grads);
    }
    if (r.optimizer->has_masters()) r.grad_of = [opt = r.optimizer.get()](const at::Tensor& p) { return opt->grad_target(p).grad(); };
  } else {
    // Every rank holds the same host model (same seed): each keeps its shards of it.
    ZeroConfig zc;
    zc.stage = static_cast<int>(cfg_.zero);
    zc.offload = parse_offload(cfg_.offload);
    zc.accum = parse_zero_accum(cfg_.zero_accum);
    zc.grad_accum = cfg_.grad_accum;
    if (r.shape.tp > 1) zc.tp = r.mesh->tp();
    if (r.shape.tp > 1 || r.shape.pp > 1) {
      // Every element of the model counted once in the norm and the fingerprint (parallel/pipeline.h).
      std::vector<std::pair<at::Tensor, std::string>> names;
      for (const auto& item : r.model->named_parameters()) names.emplace_back(item.value(), item.key());
      zc.count_weights = [names, model = r.model.get()](const at::Tensor& p) {
        for (const auto& [t, name] : names)
          if (t.is_same(p)) return count_weights(name, p, *model);
        return std::vector<std::pair<int64_t, double>>{};
      };
    }
    if (r.shape.ep > 1) {
      // Expert parallelism: the experts sharded over the ranks holding the same ones (parallel/zero.h).
      std::vector<at::Tensor> experts;
      for (const auto& item : r.model->named_parameters())
        if (is_expert_parameter(item.key())) experts.push_back(item.value());
      zc.is_expert = [experts](const at::Tensor& p) {
        return std::any_of(experts.begin(), experts.end(), [&](const at::Tensor& e) { return e.is_same(p); });
      };
      zc.expert_dp = r.mesh->expert_dp();
      zc.ep = r.mesh->ep();
    }
    zc.param_dtype = dtype_named(cfg_.resolved_param_dtype());  // 16-bit: fp32 master shards with the moments
    zc.reduce_dtype = dtype_named(cfg_.reduce_dtype);
    r.zero = std::make_unique<ZeroEngine>(*r.model, device, r.mesh->dp_cp(), zc, adam);  // sharded over dp x cp
  }
  if (cfg_.resolved_param_dtype() == "fp32" && r.precision != Precision::FP32) {
    std::vector<std::pair<std::string, int64_t>> named;
    for (const auto& item : r.model->named_parameters()) named.emplace_back(item.key(), item.value().numel());
    r.cast_copy_bytes = 2 * autocast_cached_numel(named, r.shape.tp > 1);
  }
  if (r.shape.pp > 1) {
    r.pipe = std::make_unique<PipelineStage>(*r.model, r.mesh->pp(), device, cfg_.micro_batch, r.precision);
  }
  r.scaler = std::make_unique<LossScaler>(LossScalerConfig{r.precision == Precision::FP16, cfg_.loss_scale,
                                                           cfg_.initial_scale_power, cfg_.loss_scale_window,
                                                           cfg_.hysteresis, cfg_.min_loss_scale});
  r.schedule.emplace(LRSchedule{cfg_.lr, cfg_.resolved_min_lr(), cfg_.warmup, cfg_.resolved_lr_decay_steps(),
                                parse_lr_shape(cfg_.lr_schedule), cfg_.warmup_start_lr, cfg_.warmup_type == "log"});

  // The whole model, one tensor at a time (runtime/consolidate.h): what checkpoints read and
  // write. Resume: rank 0 checks and reads, every rank keeps its part; while rank 0 reads alone,
  // the others wait under --save-timeout.
  r.state = std::make_unique<WholeModel>(*r.model, r.optimizer.get(), r.zero.get(), r.mesh.get(), r.host_world.get(),
                                         r.stage_blocks, device);
  std::optional<Resumed> resumed;
  {
    Watchdog::Window window(r.watchdog.get(), std::max(cfg_.save_timeout, cfg_.comm_init_timeout),
                            "--save-timeout: rank 0 reads the checkpoint meanwhile");
    resumed = resume_training(cfg_.resume, cfg_.save_dir, *r.state, r.host_world.get());
    // --init-from seeds only a fresh run (runtime/init_from.h): its weights, a fresh optimizer, step 0.
    if (!resumed && !cfg_.init_from.empty()) r.init_io = load_weights(cfg_.init_from, *r.state, r.host_world.get());
  }
  if (resumed) {
    // The resumed run must be the uninterrupted one continued: settings that would change what it
    // trains on, or how, are refused unless asked for (every rank holds the checkpoint's record).
    const json& saved = resumed->run;
    r.config_changes = config_changes(saved.value("config", json::object()), saved.value("dp", r.shape.dp), cfg_, r.shape.dp);
    std::string breaking;
    for (const auto& c : r.config_changes) {
      if (c.breaks_replay) breaking += (breaking.empty() ? "" : ", ") + c.key + " " + c.saved.dump() + " -> " + c.now.dump();
    }
    if (!breaking.empty() && !cfg_.allow_config_change) {
      throw ConfigError("resuming " + resumed->dir + " with settings it was not saved with: " + breaking +
                        "; resume with its settings (its trainer_state.json lists them), or give --allow-config-change");
    }
    r.resumed_from = resumed->dir;
    r.resume_notice = resumed->notice;
    r.load_io = resumed->io;
    r.progress = resumed->progress;
    if (!r.progress.loss_scaler.empty()) r.scaler->load_state(r.progress.loss_scaler);
    r.loader->resume_at(r.progress.step, r.progress.samples);
  }
  if (!cfg_.save_dir.empty()) r.checkpointer = std::make_unique<Checkpointer>(cfg_.save_dir, cfg_.keep_last, proc_.rank == 0);
  if (r.checkpointer && r.tokenizer) r.checkpointer->set_tokenizer(tokenizer_files(*r.tokenizer, cfg_.gpt.seq_len), r.tokenizer->eot());

  r.flops_per_token = flops_per_token(cfg_.gpt);
  reset_peak_memory(device);  // this run's peak, even in a process that ran others (kiln bench)
  r.timer = std::make_unique<PhaseTimer>(device);
  r.energy = std::make_unique<EnergyMeter>(device);
  r.devices = std::make_unique<JobDevices>(device, r.energy->available(), std::move(metrics_world));
  r.peak = cfg_.peak_tflops > 0 ? std::optional<double>(cfg_.peak_tflops) : peak_tflops_for(r.dev.name);
  r.tokens_per_step = layout.global_batch() * cfg_.gpt.seq_len;
  r.log = (cfg_.log_json.empty() || proc_.rank != 0) ? LogSink() : LogSink(cfg_.log_json, /*append=*/resumed.has_value());
  if (!cfg_.tensorboard.empty()) {  // rank 0 writes the event file; its verdict ends every rank alike
    decide_on_rank0(r.host_world.get(), [&] { r.log.also_to(std::make_unique<TensorBoardWriter>(cfg_.tensorboard, r.progress.step)); });
  }
}


// Mean loss over the first eval_batches micro-batches of the validation data, in eval mode, in
// the run's compute precision.
double Trainer::evaluate(int64_t step) {
  Run& r = *run_;
  const c10::Device device = r.dev.device;
  const auto started = Clock::now();
  double mean = 0.0;
  {
    at::NoGradGuard no_grad;
    r.model->eval();
    if (r.zero) r.zero->begin_forward_only();
    auto total = at::zeros({}, at::TensorOptions().device(device));
    if (r.pipe) {  // forward through the stages; the last one's sum reaches every stage
      total = r.pipe->evaluate(static_cast<int>(cfg_.eval_batches), [&](int b) { return r.val_loader->get(b, 0); });
      r.mesh->pp()->all_reduce(total, ReduceOp::Sum)->wait();
    }
    for (int64_t b = 0; b < (r.pipe ? 0 : cfg_.eval_batches); ++b) {
      auto batch = r.val_loader->get(b, 0);
      AutocastScope autocast(r.precision, device.type());
      total += r.model->loss(to_device(batch.inputs, device), to_device(batch.targets, device)).to(at::kFloat);
    }
    if (r.shape.cp > 1) {  // each cp rank's loss is the mean over its positions: the whole mean is their average
      total = total.reshape({1});
      r.mesh->cp()->all_reduce(total, ReduceOp::Avg)->wait();
      total = total[0];
    }
    if (r.zero) r.zero->end_forward_only();
    r.model->train();
    mean = total.item<double>() / static_cast<double>(cfg_.eval_batches);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  r.log.write({{"type", "eval"}, {"step", step}, {"val_loss", json_num(mean)}, {"perplexity", json_num(std::exp(mean))}, {"seconds", seconds}});
  if (proc_.rank == 0) {
    std::printf("%s\n", format_eval_line(step, mean, seconds).c_str());
    std::fflush(stdout);
  }
  return mean;
}

json Trainer::evaluate_checkpoint() {
  setup();
  Run& r = *run_;
  if (!r.val_loader) throw ConfigError("kiln eval: no validation data (--val-data)");
  if (proc_.rank == 0) {
    std::printf("kiln eval: %s (step %lld), %lld micro-batches of %lld sequences, %s on %s, %d rank(s) (dp %d tp %d pp %d)\n",
                r.resumed_from.c_str(), static_cast<long long>(r.progress.step), static_cast<long long>(cfg_.eval_batches),
                static_cast<long long>(cfg_.micro_batch), cfg_.precision.c_str(), r.dev.name.c_str(), proc_.world_size, r.shape.dp,
                r.shape.tp, r.shape.pp);
    std::fflush(stdout);
  }
  const double loss = evaluate(r.progress.step);
  return {{"type", "eval"}, {"step", r.progress.step}, {"val_loss", json_num(loss)}, {"checkpoint", r.resumed_from}};
}

json Trainer::run() {
  setup();
  Run& r = *run_;
  log_config();
  const c10::Device device = r.dev.device;
  const bool rank0 = proc_.rank == 0;

  const auto run_start = Clock::now();
  double tokens_per_s_sum = 0.0, last_loss = NAN, last_eval = NAN;
  int64_t last_comm_bytes = 0;  // this rank's, in the last step
  int64_t timed_steps = 0, skipped_steps = 0;
  double timed_joules = 0.0, timed_seconds = 0.0;  // over the timed steps, when the meters read
  bool energy_ok = r.devices->energy_known();  // every rank's meter: the job's joules can be summed
  const double devices = static_cast<double>(r.devices->count());
  std::vector<double> losses;
  std::string last_saved;
  std::string stop_reason;  // why the run stopped early, or ""
  int64_t stopped_at = 0;   // the step it stopped after
  double longest_step_s = 0.0, last_save_s = 0.0;  // --max-wall-time's estimate of what comes next
  const int64_t first_step = r.progress.step;
  if (rank0 && first_step >= cfg_.steps && cfg_.steps > 0) {
    std::printf("kiln: the checkpoint is at step %lld, --steps is %lld: nothing left to train\n",
                static_cast<long long>(first_step), static_cast<long long>(cfg_.steps));
  }
  const int64_t end_step = cfg_.stop_at_step > 0 ? std::min(cfg_.stop_at_step, cfg_.steps) : cfg_.steps;
  r.prefetch = std::make_unique<BatchPrefetcher>(*r.loader, cfg_.grad_accum, device.is_cuda(), end_step);
  // --profile: steps [profile_first, profile_end) of the loop (0-based; runtime/profiler.h).
  std::unique_ptr<StepProfiler> profiler;
  int64_t profile_first = 0, profile_end = 0;
  if (!cfg_.profile.empty()) {
    profile_first = cfg_.profile_start > 0 ? cfg_.profile_start - 1 : std::min(first_step + 2, end_step - 1);
    profile_end = profile_first + cfg_.profile_steps;
    if (profile_first < first_step || profile_first >= end_step) {
      throw ConfigError("--profile-start " + std::to_string(profile_first + 1) + " is outside this run's steps " +
                        std::to_string(first_step + 1) + "-" + std::to_string(end_step));
    }
    profiler = std::make_unique<StepProfiler>(cfg_.profile, proc_.rank, device.is_cuda());
  }
  auto profile_stop = [&](int64_t next_step) {
    synchronize(device);  // the window's device work, all of it
    const ProfileSummary s = profiler->stop();
    if (!rank0) return;
    json rec{{"type", "profile"}, {"first_step", profile_first + 1}, {"last_step", next_step}, {"trace", profiler->trace_path()}};
    rec.update(s.to_json());
    r.log.write(rec);
    std::printf("kiln: profiled steps %lld-%lld into %s\n%s", static_cast<long long>(profile_first + 1),
                static_cast<long long>(next_step), profiler->trace_path().c_str(), s.table().c_str());
    std::fflush(stdout);
  };
  // Step N's record and the decisions after it (stop, evaluation, sample, checkpoint), once the
  // host has read it; false: the run stops after N.
  auto record = [&](int64_t step, const StepOutcome& s) -> bool {
    // The step's time: its interval of the phase chain (runtime/phase_timer.h), from the end of
    // the previous step's update to the end of its own -- GPU time on a GPU, the host clock here.
    double step_s = 0.0;
    for (double ms : s.phase_ms) step_s += ms / 1e3;
    const auto joules_after = r.energy->joules();
    const auto& phase_ms = s.phase_ms;
    // The job's joules: every device's, summed (collective only when every meter reads).
    const std::optional<double> step_joules = r.devices->job_joules(r.interval_joules, joules_after);
    r.interval_joules = joules_after;
    if (!step_joules) energy_ok = false;
    r.progress.step = step + 1;
    r.progress.samples = r.loader->samples_before(step + 1);
    r.progress.loss_scaler = r.scaler->state();
    if (s.skipped) ++skipped_steps;

    // The job's figures, and per device (runtime/job_devices.h): mfu = tflops_job / (G x peak).
    const double tokens_per_s = static_cast<double>(r.tokens_per_step) / step_s;
    const double tflops_job = tokens_per_s * r.flops_per_token / 1e12;
    const double tflops = tflops_job / devices;
    const double mem_gb = peak_memory_bytes(device) / 1e9;
    if (step == first_step && r.watchdog) {
      // Every rank switches to the short timeout together (after a barrier), or a fast rank
      // could time out on a slow one still inside its long start-up.
      r.mesh->world()->barrier();
      r.watchdog->set_timeout(cfg_.comm_timeout);
      r.chain_broken = true;
    }
    if (step > first_step) {  // the first step pays for allocation and kernel selection
      tokens_per_s_sum += tokens_per_s;
      timed_seconds += step_s;
      if (step_joules) timed_joules += *step_joules;
      ++timed_steps;
    }
    last_loss = s.loss;
    last_comm_bytes = s.comm_bytes;
    losses.push_back(s.loss);
    const int64_t tokens_seen = r.progress.samples * cfg_.gpt.seq_len;  // the whole run's, resumes included
    const double elapsed_s = std::chrono::duration<double>(Clock::now() - run_start).count();
    json rec{{"type", "step"},          {"step", step + 1},         {"loss", json_num(s.loss)},
             {"lr", s.lr},              {"grad_norm", json_num(s.norm)}, {"loss_scale", s.loss_scale},
             {"skipped", s.skipped},    {"tokens", r.tokens_per_step}, {"tokens_per_s", tokens_per_s},
             {"step_ms", step_s * 1e3}, {"tflops", tflops},         {"tflops_job", tflops_job},
             {"mfu", r.peak ? json(tflops_job / (devices * *r.peak)) : json(nullptr)},
             {"mem_gb", mem_gb},        {"comm_bytes", s.comm_bytes}, {"comm_ms", s.comm_ms},
             {"forward_ms", phase_ms[static_cast<size_t>(Phase::Forward)]},
             {"backward_ms", phase_ms[static_cast<size_t>(Phase::Backward)]},
             {"exposed_comm_ms", phase_ms[static_cast<size_t>(Phase::Comm)]},
             {"optimizer_ms", phase_ms[static_cast<size_t>(Phase::Optimizer)]},
             {"energy_j", step_joules ? json(*step_joules) : json(nullptr)},
             {"watts", step_joules ? json(*step_joules / step_s) : json(nullptr)},
             {"tokens_seen", tokens_seen},
             {"elapsed_s", elapsed_s}};
    if (r.ddp) rec["comm_buckets_in_backward"] = r.ddp->launched_in_backward();
    // The device check mode (tests): the host's reads of device memory from the step's start to
    // its queued update -- 0 for a step without offload (runtime/device_check.h).
    if (device_check_enabled()) rec["host_reads_before_update"] = s.host_reads;
    rec["read_deferred"] = s.read_deferred;  // read after the next step's forward and backward were queued
    if (r.pipe) rec["pp_live_max"] = r.pipe->max_live();  // micro-batches whose activations stage 0 held at once
    if (s.moe) {  // runtime/moe_stats.h
      rec["moe_aux_loss"] = json_num(s.moe->aux_loss);
      rec["moe_z_loss"] = json_num(s.moe->z_loss);
      rec["moe_dropped"] = s.moe->dropped_fraction;
      rec["moe_max_load"] = s.moe->max_load;
      rec["moe_min_load"] = s.moe->min_load;
      rec["moe_max_load_by_layer"] = s.moe->max_load_by_layer;
      // --ep: this rank's expert-parallel traffic, in comm_bytes: the all-to-alls (the counts, 8 E
      // bytes per MoE layer and forward; the rows, which depend on the routing) and, under DDP on
      // one stage, the norm's 16; and the rows its dispatches sent and received over the step's
      // forward passes, which say the all-to-alls' bytes (parallel/expert_parallel.h, "Traffic").
      if (r.shape.ep > 1) {
        rec["ep_comm_bytes"] = s.ep_comm_bytes;
        rec["ep_rows_sent"] = s.ep_rows.rows_sent;
        rec["ep_rows_received"] = s.ep_rows.rows_received;
      }
    }
    r.log.write(rec);
    if (rank0 && ((step + 1) % cfg_.log_every == 0 || step + 1 == end_step || s.skipped)) {
      StepLine line{step + 1, cfg_.steps, s.loss, s.lr, s.norm, step_s * 1e3, tokens_per_s, tflops, tflops_job,
                    r.devices->count() > 1, std::nullopt, mem_gb, std::nullopt, s.skipped,
                    r.precision == Precision::FP16 ? "overflow" : "non-finite", tokens_seen, elapsed_s, 0.0};
      if (r.peak) line.mfu = tflops_job / (devices * *r.peak);
      if (r.precision == Precision::FP16) line.loss_scale = s.loss_scale;
      line.eta_s = static_cast<double>(end_step - step - 1) * (timed_steps > 0 ? timed_seconds / static_cast<double>(timed_steps) : step_s);
      std::printf("%s\n", format_step_line(line).c_str());
      std::fflush(stdout);
    }
    // A request to stop (runtime/stop_requests.h): a signal to any rank, or the wall-time limit
    // ahead; every rank takes the same decision after the same step.
    longest_step_s = std::max(longest_step_s, step_s);
    int64_t request = r.stop->requested();
    if (cfg_.max_wall_time > 0) {
      const double elapsed = std::chrono::duration<double>(Clock::now() - r.started).count();
      const double next = longest_step_s + (cfg_.save_dir.empty() ? 0.0 : last_save_s);
      if (elapsed + next > cfg_.max_wall_time) request = std::max<int64_t>(request, kStopWallTime);
    }
    request = StopRequests::agree(request, r.host_world.get());
    const bool stopping = request != 0 && step + 1 < end_step;
    if (stopping) stop_reason = request == kStopWallTime ? "--max-wall-time" : StopRequests::name(static_cast<int>(request));
    const bool eval_now = r.val_loader && ((cfg_.eval_every > 0 && (step + 1) % cfg_.eval_every == 0) || step + 1 == cfg_.steps);
    const bool save_now = !cfg_.save_dir.empty() && ((cfg_.save_every > 0 && (step + 1) % cfg_.save_every == 0) ||
                                                     step + 1 == end_step || stopping);
    const bool sample_now = cfg_.sample_every > 0 && (step + 1) % cfg_.sample_every == 0;
    if (eval_now || save_now || sample_now) {
      synchronize(device);  // the update of this step, before its weights are read
      r.chain_broken = true;
    }
    if (eval_now) {
      last_eval = evaluate(step + 1);
    }
    if (sample_now && (!r.mesh || r.mesh->coord().dp == 0)) {
      // llm.c's sample (runtime/generate.h): 64 tokens from end-of-text at temperature 1, seeded by the
      // run's seed and the step. No global random number is drawn, so the losses are those of a run
      // without samples. The tp ranks of replica dp 0 take part (collective over tp); rank 0 prints.
      const std::string text = training_sample(*r.model, *r.tokenizer, 64, r.shape.tp > 1 ? r.mesh->tp() : nullptr,
                                               /*temperature=*/1.0, cfg_.seed + static_cast<uint64_t>(step + 1));
      r.log.write({{"type", "sample"}, {"step", step + 1}, {"text", text}});
      if (rank0) {
        std::printf("sample at step %lld:\n---\n%s\n---\n", static_cast<long long>(step + 1), text.c_str());
        std::fflush(stdout);
      }
    }
    if (save_now) {
      // Every rank gathers, rank 0 writes (runtime/checkpoint.h). The others wait for rank 0 under
      // --save-timeout, not --comm-timeout: in the save's collectives, and in the barrier after it,
      // so that no rank enters the next step's collectives while rank 0 is still writing.
      Watchdog::Window window(r.watchdog.get(), cfg_.save_timeout, "--save-timeout: rank 0 writes the checkpoint meanwhile");
      CheckpointIo io;
      const auto save_start = Clock::now();
      const std::string dir = r.checkpointer->save(
          *r.state, r.progress, {{"config", cfg_.to_json()}, {"world", proc_.world_size}, {"dp", r.shape.dp}}, &io);
      if (r.host_world) r.host_world->barrier();
      last_save_s = std::chrono::duration<double>(Clock::now() - save_start).count();
      if (rank0) {
        last_saved = dir;
        json rec{{"type", "checkpoint"}, {"step", step + 1}, {"dir", last_saved}};
        rec.update(io.to_json());
        r.log.write(rec);
        std::printf("kiln: saved %s (%.3f GB in %.2f s, %.2f GB/s; rank 0's peak extra host memory %.3f GB)\n",
                    last_saved.c_str(), io.bytes / 1e9, io.seconds, io.seconds > 0 ? io.bytes / io.seconds / 1e9 : 0.0,
                    io.peak_extra_bytes / 1e9);
        std::fflush(stdout);
      }
    }
    if (stopping) {
      stopped_at = step + 1;
      return false;
    }
    return true;
  };
  // Whether step N's read may wait until step N + 1's forward and backward are queued, so that the
  // device never idles while the host reads, logs and decides (docs/precision.md, "The step"):
  // not when N + 1's backward needs N's loss scale (fp16), nor when work follows N that must not
  // be timed as N + 1's or that reads N's weights before N + 1 is queued (the first step's watchdog
  // switch, an evaluation, a sample, a scheduled checkpoint), nor for the last step.
  auto may_defer = [&](int64_t step) {
    const int64_t n = step + 1;
    const bool eval = r.val_loader && ((cfg_.eval_every > 0 && n % cfg_.eval_every == 0) || n == cfg_.steps);
    const bool save = !cfg_.save_dir.empty() && cfg_.save_every > 0 && n % cfg_.save_every == 0;
    const bool sample = cfg_.sample_every > 0 && n % cfg_.sample_every == 0;
    return r.precision != Precision::FP16 && step != first_step && n < end_step && !eval && !save && !sample;
  };
  std::optional<QueuedStep> queued;  // the step whose update is queued and whose verdict is not yet read
  bool stopped = false;
  for (int64_t step = first_step; step < end_step && !stopped; ++step) {
    if (profiler && profiler->active() && step == profile_end) profile_stop(step);
    if (profiler && !profiler->active() && step == profile_first) profiler->start();
    if (queued && !may_defer(queued->step)) {
      stopped = !record(queued->step, finish_step(*queued));
      queued.reset();
      if (stopped) break;
    }
    QueuedStep q = forward_backward(step);
    if (queued) {  // deferred: read behind this step's forward and backward; a stop discards them
      StepOutcome s = finish_step(*queued);
      s.read_deferred = true;
      stopped = !record(queued->step, s);
      queued.reset();
      if (stopped) break;
    }
    queue_update(q);
    queued = std::move(q);
  }
  if (queued) record(queued->step, finish_step(*queued));  // the last step

  synchronize(device);  // the last update
  if (profiler && profiler->active()) profile_stop(r.progress.step);
  r.prefetch.reset();

  double tail = NAN;
  if (!losses.empty()) {
    const size_t k = std::min<size_t>(10, losses.size());
    tail = 0.0;
    for (size_t i = losses.size() - k; i < losses.size(); ++i) tail += losses[i];
    tail /= static_cast<double>(k);
  }
  // A fingerprint of the final weights, for comparing runs (parity tests): sum and sum of squares.
  const auto [param_sum, param_sq] = weights_fingerprint(*r.model, r.zero.get(), r.optimizer.get(), r.mesh.get(), device);
  // Pipeline: the log's step records are stage 0's (rank 0's); the summary adds every stage's
  // figures (its dp 0, tp 0 rank), gathered once at the end so no step's traffic includes them.
  json stages = nullptr;
  if (r.pipe) {
    const ModelStateBytes st = r.model_state();
    const MeshCoord c = r.mesh->coord();
    const std::vector<int64_t> mine{c.pp, c.dp, c.tp, last_comm_bytes, r.model->num_params(),
                                    st.device.params, st.device.grads, st.device.optimizer,
                                    st.host.params, st.host.grads, st.host.optimizer, st.device.cast_copies};
    const int64_t n = static_cast<int64_t>(mine.size());
    at::Tensor row = at::tensor(mine, at::kLong), all = at::empty({proc_.world_size * n}, at::kLong);
    r.host_world->all_gather(all, row)->wait();
    stages = json::array();
    const int64_t* a = all.data_ptr<int64_t>();
    for (int w = 0; w < proc_.world_size; ++w) {
      const int64_t* x = a + w * n;
      if (x[1] != 0 || x[2] != 0) continue;  // dp 0, tp 0: one rank per stage, in stage order
      ModelStateBytes b;
      b.device = {x[5], x[6], x[7], x[11]};
      b.host = {x[8], x[9], x[10]};
      stages.push_back({{"stage", x[0]}, {"comm_bytes_last_step", x[3]}, {"params_local", x[4]},
                        {"model_state", model_state_json(b)}});
    }
  }
  const double mean_tps = timed_steps > 0 ? tokens_per_s_sum / static_cast<double>(timed_steps) : NAN;
  const double mean_tflops_job = mean_tps * r.flops_per_token / 1e12;
  // Energy of the job (every device) over the timed steps: average watts, joules per token,
  // model TFLOP/s per watt.
  const bool have_energy = energy_ok && timed_steps > 0 && timed_joules > 0.0;
  const double timed_tokens = static_cast<double>(r.tokens_per_step * timed_steps);
  json summary{{"type", "summary"},
               {"steps", cfg_.steps},
               {"start_step", first_step},
               {"updates", r.progress.updates},
               {"skipped_steps", skipped_steps},
               {"final_loss", json_num(last_loss)},
               {"mean_loss_last10", json_num(tail)},
               {"val_loss", json_num(last_eval)},
               {"mean_tokens_per_s", json_num(mean_tps)},
               {"mean_tflops", json_num(mean_tflops_job / devices)},
               {"mean_tflops_job", json_num(mean_tflops_job)},
               {"mean_mfu", r.peak ? json_num(mean_tflops_job / (devices * *r.peak)) : json(nullptr)},
               {"peak_mem_gb", peak_memory_bytes(device) / 1e9},
               {"mean_watts", have_energy ? json(timed_joules / timed_seconds) : json(nullptr)},
               {"joules_per_token", have_energy ? json(timed_joules / timed_tokens) : json(nullptr)},
               {"tflops_per_watt", have_energy ? json(timed_tokens * r.flops_per_token / 1e12 / timed_joules) : json(nullptr)},
               {"param_sum", param_sum},
               {"param_sq", param_sq},
               {"loss_scale", r.scaler->scale()},
               {"checkpoint", last_saved.empty() ? json(nullptr) : json(last_saved)},
               {"wall_s", std::chrono::duration<double>(Clock::now() - run_start).count()}};
  if (r.pipe) summary["pipeline_stages"] = stages;
  summary["stopped"] = stop_reason.empty() ? json(nullptr) : json(stop_reason);
  if (rank0 && !stop_reason.empty()) {
    if (last_saved.empty()) {
      std::printf("kiln: interrupted at step %lld (%s); nothing saved (no --save-dir)\n", static_cast<long long>(stopped_at),
                  stop_reason.c_str());
    } else {
      std::printf("kiln: interrupted at step %lld (%s), saved %s\n", static_cast<long long>(stopped_at), stop_reason.c_str(),
                  last_saved.c_str());
    }
    std::fflush(stdout);
  }
  r.log.write(summary);
  if (rank0) {
    std::printf("%s\n", format_summary(summary, r.progress.samples * cfg_.gpt.seq_len).c_str());
    std::fflush(stdout);
  }
  return summary;
}

}  // namespace kiln
