// runtime/trainer/trainer.cpp -- set-up, as a recipe of named steps, and evaluation; the loop is
// trainer_loop.cpp's, the step trainer_step.cpp's, the config record trainer_records.cpp's, the
// run's state trainer_run.h's.
#include "runtime/trainer/trainer.h"
#include "runtime/trainer/trainer_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <optional>
#include <thread>
#include <tuple>

#include <ATen/ATen.h>

#include "data/hf_tokenizer.h"
#include "data/loader.h"
#include "data/paths.h"
#include "data/prefetch.h"
#include "data/prep.h"
#include "data/synthetic.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "distributed/backend_choice.h"
#include "distributed/comm_mpi.h"
#include "distributed/comm_self.h"
#include "models/gpt.h"
#include "optim/adamw.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "parallel/activation_checkpoint.h"
#include "parallel/context_parallel.h"
#include "parallel/ddp.h"
#include "parallel/expert_parallel.h"
#include "parallel/pipeline.h"
#include "parallel/pipeline_layout.h"
#include "parallel/sequence_parallel.h"
#include "parallel/tensor_parallel.h"
#include "parallel/zero.h"
#include "runtime/checkpoint/async_save.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/consolidate.h"
#include "runtime/observe/console.h"
#if defined(KILN_WITH_CUDA)
#include "distributed/comm_nccl.h"
#endif
#include "distributed/device.h"
#include "distributed/device_check.h"
#include "distributed/device_peaks.h"
#include "distributed/error.h"
#include "distributed/host_threads.h"
#include "distributed/job_devices.h"
#include "distributed/mesh.h"
#include "distributed/rank0_verdict.h"
#include "distributed/watchdog.h"
#include "models/flops.h"
#include "optim/precision.h"
#include "runtime/inference/generate.h"
#include "runtime/observe/energy.h"
#include "runtime/observe/log_sink.h"
#include "runtime/observe/phase_timer.h"
#include "runtime/observe/profiler.h"
#include "runtime/trainer/config_agreement.h"
#include "runtime/trainer/nonfinite_guard.h"
#include "runtime/trainer/replica_check.h"
#include "runtime/trainer/save_dir_lock.h"
#include "runtime/trainer/stop_requests.h"

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

// The training data as the sample order depends on it, saved with every checkpoint:
// [{"file", "tokens", "fingerprint"}] per source, in the order read.
json data_sources_record(const TokenDataset& data) {
  json out = json::array();
  for (const auto& f : data.fingerprints()) {
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(f.hash));
    out.push_back({{"file", f.name}, {"tokens", f.tokens}, {"fingerprint", hex}});
  }
  return out;
}

// A refused change of the global batch (micro-batch x grad-accum x dp): the flags that keep the
// checkpoint's `global` on this run's dp -- --grad-accum alone where the micro-batch divides it,
// else --micro-batch alone, else both (the largest micro-batch up to this one that divides it).
std::string keep_global_batch(int64_t global, int64_t micro_batch, int64_t grad_accum, int dp) {
  const std::string at = " keeps it at " + std::to_string(global) + " on dp " + std::to_string(dp);
  if (global % dp != 0) {
    return "no --micro-batch x --grad-accum keeps " + std::to_string(global) + " on dp " + std::to_string(dp) +
           " (not a multiple of it): resume on a dp that divides it";
  }
  const int64_t per_rank = global / dp;
  if (per_rank % micro_batch == 0) return "--grad-accum " + std::to_string(per_rank / micro_batch) + at;
  if (per_rank % grad_accum == 0) return "--micro-batch " + std::to_string(per_rank / grad_accum) + at;
  int64_t m = std::min(micro_batch, per_rank);
  while (per_rank % m != 0) --m;
  return "--micro-batch " + std::to_string(m) + " --grad-accum " + std::to_string(per_rank / m) + at;
}

}  // namespace

Trainer::Trainer(TrainConfig cfg, ProcessInfo proc) : cfg_(std::move(cfg)), proc_(proc) {}
Trainer::~Trainer() = default;

// The recipe, in torchtitan's order (its train.py): the launch, the mesh and its communicators,
// the run's guards, data, model, parallelisms and optimizer, the step's parts, the checkpoint to
// resume from, and what observes the run.
void Trainer::setup() {
  run_ = std::make_unique<Run>();
  check_launch();
  build_mesh();
  take_guards();
  build_data();
  build_model();
  if (cfg_.zero == 0) build_optimizer();
  else build_zero();
  build_step_parts();
  build_graphs();
  load_checkpoint();
  build_observers();
}

// Layouts that need more ranks than a world of one without mpirun has.
void Trainer::check_launch() const {
  if (!proc_.mpi && cfg_.tp * cfg_.pp * cfg_.cp > 1) {
    const int64_t n = cfg_.tp * cfg_.pp * cfg_.cp;
    throw ConfigError("--tp " + std::to_string(cfg_.tp) + " x --pp " + std::to_string(cfg_.pp) +
                      (cfg_.cp > 1 ? " x --cp " + std::to_string(cfg_.cp) : std::string()) + " needs " + std::to_string(n) +
                      " ranks: launch with mpirun -np " + std::to_string(n) + " (or a multiple of " + std::to_string(n) +
                      " for data parallelism as well)");
  }
}

// The dp x cp x tp x pp (x ep) shape, the device and precision, the host threads, and -- with
// several ranks or a named backend -- the communicators and the mesh of groups.
void Trainer::build_mesh() {
  Run& r = *run_;
  r.shape = MeshShape::resolve(proc_.world_size, static_cast<int>(cfg_.tp), static_cast<int>(cfg_.pp), static_cast<int>(cfg_.cp));
  r.shape.ep = static_cast<int>(cfg_.ep);
  if (r.shape.dp % r.shape.ep != 0) {
    throw ConfigError("--ep " + std::to_string(cfg_.ep) + " must divide the data-parallel size (dp " + std::to_string(r.shape.dp) +
                      " of " + std::to_string(proc_.world_size) + " ranks): the expert-parallel groups are carved out of dp");
  }
  r.dev = select_device(cfg_.device, proc_.local_rank);
  if (cfg_.deterministic) use_deterministic_algorithms();  // before the first matrix product
  r.precision = parse_precision(cfg_.precision);
  const c10::Device device = r.dev.device;
  if (cfg_.device_memory_cap_gb > 0) cap_device_memory(device, cfg_.device_memory_cap_gb);
  // A node's ranks share its cores, on CPU and GPU runs alike (distributed/host_threads.h).
  r.threads = divide_host_threads(proc_.local_size);
  // Communicators: always with several ranks; in a world of one only when a backend is named
  // (`mpirun -np 1 kiln train --backend nccl` runs the NCCL path and the DDP wrapper alone) or
  // ZeRO runs. ZeRO in one process without mpirun gets a local world (distributed/comm_self.h:
  // its collectives are copies), as a plain run needs no MPI.
  const bool explicit_backend = cfg_.backend != "auto";
  if (!proc_.mpi && cfg_.zero > 0 && !explicit_backend) {
    r.backend = "local";
    r.watchdog = std::make_shared<Watchdog>(cfg_.comm_init_timeout);
    r.mesh = std::make_unique<Mesh>(make_self_communicator("world", "local"), r.shape);
    r.dp_rank = 0;
    r.host_world = make_self_communicator("host", "local");
  } else if (proc_.world_size > 1 || explicit_backend || cfg_.zero > 0) {
    if (!proc_.mpi) {
      throw ConfigError(std::string(cfg_.zero > 0 ? "--zero " + std::to_string(cfg_.zero) : "--backend " + cfg_.backend) +
                        " needs MPI: launch with mpirun (mpirun -np 1 for a world of one)");
    }
    r.watchdog = std::make_shared<Watchdog>(cfg_.comm_init_timeout);  // start-up grace until step 1 is done
    // Checkpoints move host tensors, which NCCL cannot and the run's groups refuse: they go over
    // a host group of their own (MPI, no device; its traffic is not the steps' comm_bytes). First
    // of all it checks that every rank has the same settings (runtime/trainer/config_agreement.h).
    r.host_world = make_mpi_communicator(MPI_COMM_WORLD, "host", r.watchdog);
    const std::string disagreement = config_disagreement(cfg_.to_json(), device, *r.host_world);
    if (!disagreement.empty()) throw ConfigError(disagreement);
    r.backend = choose_backend(cfg_.backend, device, MPI_COMM_WORLD);
    std::shared_ptr<Communicator> world;
#if defined(KILN_WITH_CUDA)
    if (r.backend == "nccl") world = make_nccl_communicator(MPI_COMM_WORLD, "world", device.index(), r.watchdog);
#endif
    if (!world) world = make_mpi_communicator(MPI_COMM_WORLD, "world", r.watchdog, device);
    // The mesh's groups (split from the world) count where a rank stood still in a collective's
    // wait during its forward and backward: its compute without the others' lateness
    // (distributed/wait_clock.h, runtime/observe/stragglers.h).
    r.wait_clock = std::make_shared<WaitClock>();
    world->count_waits_in(r.wait_clock);
    r.mesh = std::make_unique<Mesh>(std::move(world), r.shape);
    r.dp_rank = r.mesh->coord().dp;
  }
}

// One job per save directory, the stop requests, and the communicator the job's devices and
// energy are summed over.
void Trainer::take_guards() {
  Run& r = *run_;
  // One job per save directory, and one that can be written (runtime/trainer/save_dir_lock.h): rank 0
  // takes the lock now, not at the first save, and its verdict ends every rank alike.
  if (!cfg_.save_dir.empty()) {
    decide_on_rank0(r.host_world.get(), [&] { r.save_lock = std::make_unique<SaveDirLock>(cfg_.save_dir); });
  }
  r.stop = std::make_unique<StopRequests>(cfg_.stop_signals, proc_.rank == 0);  // runtime/trainer/stop_requests.h
  // The job's distinct devices and the energy summed over them, over a communicator of their
  // own: the mesh's (host_world too, under the MPI backend) are counted in comm_bytes.
  if (r.mesh) r.metrics_world = proc_.mpi ? make_mpi_communicator(MPI_COMM_WORLD, "metrics", r.watchdog) : make_self_communicator("metrics", "local");
}

// The tokenizer, the training data and its loader (this rank's micro-batches of the global
// batch), the validation data.
void Trainer::build_data() {
  Run& r = *run_;
  // The data's tokenizer (data/tokenizer.h): in the config record, saved with every checkpoint,
  // and what --sample-every decodes with.
  {
    DataTokenizer t =
        tokenizer_for_data(cfg_.tokenizer, cfg_.data.empty() ? std::vector<std::string>{} : expand_paths(cfg_.data, "--data"),
                           cfg_.gpt.vocab_size, cfg_.init_from);
    r.tokenizer = std::move(t.tokenizer);
    r.tokenizer_source = t.source;
  }
  if (cfg_.sample_every > 0 && !r.tokenizer) {  // its ids decode the samples
    throw ConfigError(cfg_.data.empty() ? "--sample-every needs --vocab-size of at least " + std::to_string(kByteVocab) + " (the byte-level tokenizer's ids)"
                                        : "--sample-every needs the data's tokenizer: no tokenizer.json beside the --data files (kiln prep writes one); give --tokenizer FILE");
  }
  r.train_data = training_data(cfg_);
  r.data_sources = data_sources_record(*r.train_data);
  const BatchLayout layout{cfg_.micro_batch, cfg_.grad_accum, r.shape.dp, r.dp_rank};
  r.loader = std::make_unique<DataLoader>(r.train_data, cfg_.seed, /*shuffle=*/true, layout);
  if (!cfg_.val_data.empty()) {
    auto val = std::make_shared<TokenDataset>(TokenDataset::from_paths(
        cfg_.val_data, parse_token_format(cfg_.data_format), cfg_.gpt.seq_len, cfg_.gpt.vocab_size, "--val-data"));
    r.val_loader = std::make_unique<DataLoader>(val, cfg_.seed, /*shuffle=*/false, BatchLayout{cfg_.micro_batch, 1, 1, 0});
    r.val_samples = val->num_samples();
    r.eval_batches = cfg_.eval_batches > 0 ? cfg_.eval_batches : std::max<int64_t>(1, r.val_samples / cfg_.micro_batch);
  }
  r.tokens_per_step = layout.global_batch() * cfg_.gpt.seq_len;
}

// This rank's part of the model, initialised from the seed, on the device unless ZeRO places
// it, with activation checkpointing applied.
void Trainer::build_model() {
  Run& r = *run_;
  const c10::Device device = r.dev.device;
  // Built and initialised on the host; ZeRO moves only what its stage keeps on the device.
  // Tensor parallelism: this rank's slices; pipeline parallelism: this stage's blocks (and the
  // embedding / head). Every layout draws the whole model's parameters from the seed one at a
  // time and keeps its part, so every layout starts from the same weights.
  r.stage_blocks = pipeline_block_counts(cfg_.gpt.n_layer, r.shape.pp, cfg_.pp_split, cfg_.pp_virtual);  // per virtual stage
  {
    ModelShard shard = r.shape.tp > 1 ? make_tensor_parallel_shard(cfg_.gpt, r.mesh->tp(), cfg_.sp) : ModelShard{};
    if (r.shape.cp > 1) shard = make_context_parallel(std::move(shard), cfg_.gpt, r.mesh->cp());
    if (r.shape.pp > 1) shard = pipeline_stage_shard(std::move(shard), r.stage_blocks, r.mesh->coord().pp, static_cast<int>(r.shape.pp));
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
    // Qwen3's q / k norms: each tp rank norms its own heads, so each holds a part of their gradient.
    else if (r.shape.tp > 1 && r.model->config().qk_norm) sum_replicated_gradients_over_tp(*r.model, r.mesh->tp(), /*head_norms_only=*/true);
  }
  if (cfg_.zero == 0) module_to_device(*r.model, device);
  r.model->loss_chunk_rows = cfg_.loss_chunk_rows;
  r.model->logits16 = cfg_.logits_dtype == "bf16";
  if (cfg_.document_mask) {
    if (!r.tokenizer) throw ConfigError("--document-mask needs the data's tokenizer (its end-of-text token opens every document): " + r.tokenizer_source);
    r.model->document_token = r.tokenizer->eot();
    r.model->restart_positions = cfg_.document_positions == "restart";
    if (r.model->restart_positions && !r.model->config().rope())  // the model's shape may come from --init-from: known here
      throw ConfigError("--document-positions restart turns rotary positions (--position rope, the Llama family's); this model's are learned");
  }
  r.model->set_kernels(kernels_on(parse_kernels(cfg_.kernels), device.is_cuda()), cfg_.gelu_epilogue);
  if (r.precision == Precision::FP8) {
    // float8 tensor cores: compute capability 8.9 (Ada) or 9.0 and up (Hopper, Blackwell); before
    // them _scaled_mm refuses inside the first step -- said here, at set-up, in one line
    if (r.dev.device.is_cuda() && r.dev.capability > 0 && r.dev.capability < 89) {
      throw ConfigError("--precision fp8 needs a GPU with float8 tensor cores (compute capability 8.9 or newer: Ada, Hopper, "
                        "Blackwell); " + r.dev.name + " is " + std::to_string(r.dev.capability / 10) + "." +
                        std::to_string(r.dev.capability % 10) + " -- use --precision bf16");
    }
    Float8Scaling scaling = cfg_.fp8_recipe == "rowwise" ? float8_rowwise() : float8_tensorwise();
    scaling.grad_dtype = float8_grad_dtype(cfg_.resolved_fp8_grad());
    scaling.fused = r.model->kernels() == Kernels::fused;  // set_kernels' choice above: kernels/float8.cu on CUDA
    // cp splits every layer's rows (the sequence): an amax over the rows of the inputs or the
    // output gradients is the group's, so each rank scales as one process scales the whole sequence.
    if (r.shape.cp > 1) scaling.m = amax_over(r.mesh->cp());
    r.float8_layers = r.model->set_float8(scaling, cfg_.fp8_filter == "auto");
    // Each float8 layer quantises its weight once an optimizer step (kernels/float8.h,
    // Float8WeightCache); ZeRO-3 gathers its weights instead (in 8 bits under tensorwise: build_zero).
    if (cfg_.zero != 3) r.float8_kept_numel = r.model->keep_float8_weights();
    if (proc_.rank == 0) {
      std::printf("fp8: %lld of the %lld block linear layers%s in float8 (%s scaling, gradients %s, filter %s)\n",
                  static_cast<long long>(r.float8_layers.first), static_cast<long long>(r.float8_layers.second),
                  r.shape.pp > 1 ? " of the first stage" : "", cfg_.fp8_recipe.c_str(), cfg_.resolved_fp8_grad().c_str(), cfg_.fp8_filter.c_str());
    }
  }
  r.model->train();
  // Parallelism applied from outside the model, in torchtitan's order: activation checkpointing,
  // then data parallelism (DDP or ZeRO).
  apply_activation_checkpointing(*r.model, parse_activation_checkpointing(cfg_.activation_checkpointing));
  r.params = r.model->parameters();
}

// ZeRO-0: AdamW over the whole model on every rank, and DDP over dp x cp (with --ep, the dense
// parameters' and the experts' reductions apart).
void Trainer::build_optimizer() {
  Run& r = *run_;
  const AdamWConfig adam{cfg_.beta1, cfg_.beta2, cfg_.adam_eps, cfg_.weight_decay};
  // ZeRO-0 steps this AdamW. 16-bit working weights: it keeps the fp32 masters and casts the
  // model's parameters (optim/adamw.h); gradients then accumulate in the masters' fp32 .grad.
  r.optimizer = std::make_unique<AdamW>(r.params, adam, dtype_named(cfg_.resolved_param_dtype()));
  r.optimizer->set_kernels(r.model->kernels());  // the update in one pass on CUDA (kernels/adamw.h)
  // DDP over dp x cp (distributed/mesh.h), or with --ep the dense and expert reductions apart.
  const bool expert_ddp = r.shape.ep > 1;
  const bool ddp = expert_ddp || (r.mesh && (r.shape.grad_ranks() > 1 || cfg_.backend != "auto"));
  // Nothing to accumulate or reduce (one micro-batch, no DDP, no pipeline's tied-embedding sum):
  // AdamW reads the 16-bit gradients autograd leaves, with no fp32 main grad between (optim/adamw.h).
  if (cfg_.main_grads == "auto" && cfg_.grad_accum == 1 && !ddp && r.shape.pp == 1) r.optimizer->read_working_grads();
  r.grads = r.optimizer->grad_targets();
  if (expert_ddp) {
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
  } else if (ddp) {
    r.ddp = std::make_unique<DistributedDataParallel>(r.params, r.mesh->dp_cp(), DDPConfig{},
                                                      r.optimizer->has_masters() ? r.grads : std::vector<at::Tensor>{},
                                                      dtype_named(cfg_.reduce_dtype));
    r.ddp->broadcast_parameters();
  } else if (r.optimizer->has_masters() && !r.optimizer->reads_working_grads()) {
    r.main_grads = std::make_unique<MainGrads>(r.params, r.grads);
  }
  if (r.optimizer->has_masters()) r.grad_of = [opt = r.optimizer.get()](const at::Tensor& p) { return opt->grad_target(p).grad(); };
}

// ZeRO-1/2/3: the engine that shards the state over dp x cp (the experts over their own group).
void Trainer::build_zero() {
  Run& r = *run_;
  const c10::Device device = r.dev.device;
  const AdamWConfig adam{cfg_.beta1, cfg_.beta2, cfg_.adam_eps, cfg_.weight_decay};
  // Every rank holds the same host model (same seed): each keeps its shards of it.
  ZeroConfig zc;
  zc.stage = static_cast<int>(cfg_.zero);
  zc.offload = parse_offload(cfg_.offload);
  zc.accum = parse_zero_accum(cfg_.zero_accum);
  zc.delayed_update = cfg_.offload_delayed_update;
  zc.delay_from = cfg_.offload_delay_from;
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
  if (r.precision == Precision::FP8 && cfg_.fp8_recipe != "rowwise" && zc.stage == 3 && zc.offload != Offload::All) {
    // ZeRO-3 gathers the float8 layers' weights in 8 bits (parallel/zero.h, "Float8 weights"):
    // each such layer reads q_W from a slot the engine fills. Not c_attn where tp replicates its
    // kv heads (that layer assembles its W from parts before the product). Rowwise requantises W
    // along its columns for dX, and offload all keeps nothing on the device: 16-bit gathers there.
    std::vector<std::pair<at::Tensor, std::shared_ptr<Float8Tensor>>> slots;
    const bool kv_replicated = r.shape.tp > 1 && r.model->config().n_kv_head < r.shape.tp;
    for (LinearImpl* l : r.model->float8_linears(/*with_qkv=*/!kv_replicated)) {
      l->float8.weight8 = std::make_shared<Float8Tensor>();
      slots.emplace_back(l->weight, l->float8.weight8);
    }
    if (!slots.empty()) {
      zc.float8_weight = [slots](const at::Tensor& p) -> std::shared_ptr<Float8Tensor> {
        for (const auto& [w, slot] : slots)
          if (w.is_same(p)) return slot;
        return nullptr;
      };
    }
    if (proc_.rank == 0)
      std::printf("fp8: ZeRO-3 gathers %zu float8 weights in 8 bits%s\n", slots.size(), r.shape.pp > 1 ? " on the first stage" : "");
  }
  zc.param_dtype = dtype_named(cfg_.resolved_param_dtype());  // 16-bit: fp32 master shards with the moments
  zc.reduce_dtype = dtype_named(cfg_.reduce_dtype);
  r.zero = std::make_unique<ZeroEngine>(*r.model, device, r.mesh->dp_cp(), zc, adam);  // sharded over dp x cp
  r.zero->set_kernels(r.model->kernels());
}

// What the step uses besides the model: autocast's cast-copy bytes, the pipeline stage, the loss
// scaler, the LR schedule.
void Trainer::build_step_parts() {
  Run& r = *run_;
  const c10::Device device = r.dev.device;
  if (cfg_.resolved_param_dtype() == "fp32" && r.precision != Precision::FP32) {
    std::vector<std::pair<std::string, int64_t>> named;
    for (const auto& item : r.model->named_parameters()) named.emplace_back(item.key(), item.value().numel());
    const auto mode = parse_activation_checkpointing(cfg_.activation_checkpointing);
    r.cast_copy_bytes = 2 * autocast_cached_numel(named, r.shape.tp > 1, mode == ActivationCheckpointing::Full,
                                                  mode == ActivationCheckpointing::Selective && !r.model->config().swiglu());
  }
  r.cast_copy_bytes += 2 * r.float8_kept_numel;  // the float8 weights' kept 8-bit forms (q_W and its transpose)
  if (r.shape.pp > 1) {
    r.pipe = std::make_unique<PipelineStage>(*r.model, r.mesh->pp(), device, cfg_.micro_batch, r.precision,
                                             cfg_.resolved_pp_schedule() == "zb-h1");
  }
  r.scaler = std::make_unique<LossScaler>(LossScalerConfig{r.precision == Precision::FP16, cfg_.loss_scale,
                                                           cfg_.initial_scale_power, cfg_.loss_scale_window,
                                                           cfg_.hysteresis, cfg_.min_loss_scale});
  r.schedule.emplace(LRSchedule{cfg_.lr, cfg_.resolved_min_lr(), cfg_.warmup, cfg_.resolved_lr_decay_steps(),
                                parse_lr_shape(cfg_.lr_schedule), cfg_.warmup_start_lr, cfg_.warmup_type == "log"});
  // bf16 / fp32: where a non-finite step came from, and --max-skipped-steps (runtime/trainer/nonfinite_guard.h)
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& item : r.model->named_parameters()) named.emplace_back(item.key(), item.value());
  r.nonfinite = std::make_unique<NonfiniteGuard>(std::move(named), proc_.rank);
  if (cfg_.spike_rollback > 0) r.spikes = std::make_unique<SpikeGuard>(cfg_.spike_rollback, cfg_.spike_patience);
  if (cfg_.check_replicas > 0 && r.mesh) {  // --check-replicas (runtime/trainer/replica_check.h)
    const MeshCoord c = r.mesh->coord();
    const std::string stage = std::to_string(c.pp) + "/" + std::to_string(c.tp);
    std::vector<ReplicaTensor> tensors;
    for (const auto& item : r.model->named_parameters()) {
      const bool expert = r.shape.ep > 1 && is_expert_parameter(item.key());
      tensors.push_back({item.key(), item.value(), expert ? stage + "/" + std::to_string(r.mesh->ep()->rank()) : stage});
    }
    r.replicas = std::make_unique<ReplicaCheck>(std::move(tensors), proc_.rank);
  }
}

// Resume (--resume) or start from --init-from's weights, check a resumed run's settings against
// its checkpoint's, and make the checkpointer.
void Trainer::load_checkpoint() {
  Run& r = *run_;
  const c10::Device device = r.dev.device;
  // The whole model, one tensor at a time (runtime/checkpoint/consolidate.h): what checkpoints read and
  // write. Resume: rank 0 checks and reads, every rank keeps its part; while rank 0 reads alone,
  // the others wait under --save-timeout.
  r.state = std::make_unique<WholeModel>(*r.model, r.optimizer.get(), r.zero.get(), r.mesh.get(), r.host_world.get(),
                                         r.stage_blocks, device);
  std::optional<Resumed> resumed;
  {
    Watchdog::Window window(r.watchdog.get(), std::max(cfg_.save_timeout, cfg_.comm_init_timeout),
                            "--save-timeout: rank 0 reads the checkpoint meanwhile");
    // kiln eval names its checkpoint --checkpoint, in its hints too.
    const std::string flag = evaluating_ ? "--checkpoint" : "--resume";
    resumed = resume_training(cfg_.resume, cfg_.save_dir, *r.state, r.host_world.get(), /*weights_only=*/evaluating_, flag);
    // --init-from seeds only a fresh run (runtime/checkpoint/init_from.h): its weights, a fresh optimizer, step 0.
    if (!resumed && !cfg_.init_from.empty())
      r.init_io = load_weights(cfg_.init_from, *r.state, r.host_world.get(), evaluating_ ? "--checkpoint" : "--init-from");
  }
  if (resumed) {
    // The resumed run must be the uninterrupted one continued: settings that would change what it
    // trains on, or how, are refused unless asked for (every rank holds the checkpoint's record).
    const json& saved = resumed->run;
    r.config_changes = config_changes(saved, cfg_, r.shape.dp, r.data_sources);
    std::string breaking;
    for (const auto& c : r.config_changes) {
      if (!c.breaks_replay) continue;
      breaking += (breaking.empty() ? "" : ", ") + c.key + " " + c.saved.dump() + " -> " + c.now.dump();
      if (c.key == "global batch" && c.saved.is_number_integer() && c.saved.get<int64_t>() > 0) {
        breaking += " (" + keep_global_batch(c.saved.get<int64_t>(), cfg_.micro_batch, cfg_.grad_accum, r.shape.dp) + ")";
      }
    }
    if (!breaking.empty() && !cfg_.allow_config_change) {
      throw ConfigError("resuming " + resumed->dir + " with settings it was not saved with: " + breaking +
                        "; resume with its settings (its trainer_state.json lists them), or give --allow-config-change");
    }
    r.resumed_from = resumed->dir;
    r.resume_notice = resumed->notice;
    if (saved.contains("best") && saved.at("best").is_object()) {
      const json& b = saved.at("best");
      r.best = {b.value("val_loss", static_cast<double>(INFINITY)), b.value("step", int64_t{0}), b.value("evals_since", int64_t{0})};
    }
    r.load_io = resumed->io;
    r.progress = resumed->progress;
    if (!r.progress.loss_scaler.empty()) r.scaler->load_state(r.progress.loss_scaler);
    r.loader->resume_at(r.progress.step, r.progress.samples);
  }
  // Data windows never trained on (a spike rollback's, carried by the checkpoint; data/loader.h).
  // Test-only (tests/cli/guards.sh): KILN_TEST_SKIP_SAMPLES=A:B adds stream positions [A, B), the
  // run that never had them, to compare a rollback with.
  r.loader->skip(r.progress.skipped_samples);
  if (const char* spec = std::getenv("KILN_TEST_SKIP_SAMPLES")) {
    long long a = -1, b = -1;
    if (std::sscanf(spec, "%lld:%lld", &a, &b) != 2 || a < 0 || b <= a) throw ConfigError(std::string("KILN_TEST_SKIP_SAMPLES=") + spec + ": want A:B");
    r.progress.skipped_samples = r.loader->with_skipped({{a, b}});
    r.loader->skip(r.progress.skipped_samples);
  }
  if (!cfg_.save_dir.empty()) r.checkpointer = std::make_unique<Checkpointer>(cfg_.save_dir, cfg_.keep_last, proc_.rank == 0);
  if (r.checkpointer && r.tokenizer) r.checkpointer->set_tokenizer(tokenizer_files(*r.tokenizer, cfg_.gpt.seq_len), r.tokenizer->eot(),
                                                                  r.tokenizer->end_tokens(), r.tokenizer->eot_text());
  // --async-save (runtime/checkpoint/async_save.h): the background thread's gathers go over MPI twins
  // of the mesh and the world, with a watchdog of their own at --save-timeout.
  if (r.checkpointer && cfg_.async_save && !evaluating_) {
    std::unique_ptr<Mesh> host_mesh;
    std::shared_ptr<Communicator> host_world;
    if (r.mesh) {
      auto watchdog = std::make_shared<Watchdog>(cfg_.save_timeout);
      host_mesh = std::make_unique<Mesh>(proc_.mpi ? make_mpi_communicator(MPI_COMM_WORLD, "saver", watchdog)
                                                   : make_self_communicator("saver", "local"),
                                         r.shape);
      if (proc_.mpi) host_world = make_mpi_communicator(MPI_COMM_WORLD, "saver-host", watchdog);
    }
    r.saver = std::make_unique<AsyncSaver>(*r.checkpointer, *r.state, std::move(host_mesh), std::move(host_world));
  }
}

// FLOPs, the peak, the phase timer, energy, the job's devices, the log and TensorBoard.
void Trainer::build_observers() {
  Run& r = *run_;
  const c10::Device device = r.dev.device;
  r.flops_per_token = flops_per_token(cfg_.gpt);
  reset_peak_memory(device);  // this run's peak, even in a process that ran others (kiln bench)
  r.timer = std::make_unique<PhaseTimer>(device, r.wait_clock);
  r.energy = std::make_unique<EnergyMeter>(device);
  r.devices = std::make_unique<JobDevices>(device, r.energy->available(), std::move(r.metrics_world));
  r.stragglers = std::make_unique<StragglerWatch>(r.mesh && proc_.mpi ? r.host_world : nullptr, r.mesh ? r.mesh->coord().pp : 0,
                                                  cfg_.straggler_factor);
  // Test-only (tests/cli/guards.sh): KILN_TEST_SLOW_RANK=RANK:MS makes rank RANK's step MS longer,
  // before its forward; RANK:xF makes it F times its own compute of the step before longer (from
  // step 2), so that it stays slow by a factor however loaded the machine is.
  if (const char* spec = std::getenv("KILN_TEST_SLOW_RANK")) {
    int rank = -1;
    double value = 0;
    const bool factor = std::strchr(spec, 'x') != nullptr;
    if (std::sscanf(spec, factor ? "%d:x%lf" : "%d:%lf", &rank, &value) != 2 || value < 0) {
      throw ConfigError(std::string("KILN_TEST_SLOW_RANK=") + spec + ": want RANK:MS or RANK:xFACTOR");
    }
    if (rank == proc_.rank) (factor ? r.test_slow_factor : r.test_slow_ms) = value;
  }
  r.peak = cfg_.peak_tflops > 0 ? std::optional<double>(cfg_.peak_tflops) : peak_tflops_for(r.dev.name);
  // Rank 0 alone opens the log (its --log-json alone counts: the other ranks' may differ); its
  // verdict ends every rank alike (thrown on rank 0 only, the job waited 10 s for the others to
  // fail too, then aborted with a banner: launch/main.cpp's fail()).
  decide_on_rank0(r.host_world.get(), [&] {
    if (!cfg_.log_json.empty()) r.log = LogSink(cfg_.log_json, /*append=*/!r.resumed_from.empty());
  });
  if (!cfg_.tensorboard.empty()) {  // rank 0 writes the event file; its verdict ends every rank alike
    decide_on_rank0(r.host_world.get(), [&] { r.log.also_to(std::make_unique<TensorBoardWriter>(cfg_.tensorboard, r.progress.step)); });
  }
}

namespace {
// How an evaluation's sequences cover the validation set: " (the set once: S samples)", or a
// word when they repeat, which they did without one.
std::string eval_coverage(int64_t read, int64_t samples) {
  if (read > samples) {
    return " -- more than the " + std::to_string(samples) + " samples of --val-data: samples repeat (--eval-batches 0 reads the set once)";
  }
  return " (" + std::to_string(read) + " of the " + std::to_string(samples) + " samples of --val-data)";
}
}  // namespace

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
    // Masked targets: the evaluation's trained targets over its loss terms (batches x cp), as in
    // training (models/gpt.h); every rank evaluates the same batches.
    r.model->loss_targets_per_term = 0.0;
    if (r.val_loader->masked()) {
      int64_t trained = 0;
      for (int64_t b = 0; b < r.eval_batches; ++b) trained += r.val_loader->step_targets(b);
      r.model->loss_targets_per_term = static_cast<double>(std::max<int64_t>(1, trained)) / static_cast<double>(r.eval_batches * r.shape.cp);
    }
    if (r.pipe) {  // forward through the stages; the last one's sum reaches every stage
      total = r.pipe->evaluate(static_cast<int>(r.eval_batches), [&](int b) { return r.val_loader->get(b, 0); });
      r.mesh->pp()->all_reduce(total, ReduceOp::Sum)->wait();
    }
    for (int64_t b = 0; b < (r.pipe ? 0 : r.eval_batches); ++b) {
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
    r.model->loss_targets_per_term = 0.0;  // the next step sets its own
    r.model->train();
    mean = total.item<double>() / static_cast<double>(r.eval_batches);
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
  evaluating_ = true;
  setup();
  Run& r = *run_;
  if (!r.val_loader) throw ConfigError("kiln eval: no validation data (--val-data)");
  // A Hugging Face directory is read as --init-from reads it: its name, at step 0.
  const std::string source = r.resumed_from.empty() ? cfg_.init_from : r.resumed_from;
  if (proc_.rank == 0) {
    std::printf("kiln eval: %s (step %lld), %lld micro-batches of %lld sequences%s, %s on %s, %d rank(s) (dp %d tp %d pp %d)\n",
                source.c_str(), static_cast<long long>(r.progress.step), static_cast<long long>(r.eval_batches),
                static_cast<long long>(cfg_.micro_batch), eval_coverage(r.eval_batches * cfg_.micro_batch, r.val_samples).c_str(),
                cfg_.precision.c_str(), r.dev.name.c_str(), proc_.world_size, r.shape.dp, r.shape.tp, r.shape.pp);
    std::fflush(stdout);
  }
  const double loss = evaluate(r.progress.step);
  return {{"type", "eval"}, {"step", r.progress.step}, {"val_loss", json_num(loss)}, {"checkpoint", source}};
}

}  // namespace kiln
