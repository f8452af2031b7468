// runtime/trainer.cpp -- the step loop, evaluation, and the records it logs.
#include "runtime/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>

#include <ATen/ATen.h>
#include <torch/version.h>
#if defined(KILN_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

#include "data/loader.h"
#include "data/synthetic.h"
#include "data/token_dataset.h"
#include "models/gpt.h"
#include "optim/adamw.h"
#include "optim/grad_clip.h"
#include "optim/lr_schedule.h"
#include "parallel/ddp.h"
#include "runtime/comm_mpi.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/log_sink.h"
#include "runtime/mesh.h"
#include "runtime/metrics.h"
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

json versions() {
  json v{{"kiln", KILN_VERSION}, {"torch", TORCH_VERSION}};
#if defined(KILN_WITH_CUDA)
  v["cuda_runtime"] = CUDART_VERSION;
#endif
  return v;
}

// Mean loss over the first eval_batches micro-batches of the validation data, in eval mode.
double evaluate(GPT& model, const DataLoader& val, int64_t batches, const c10::Device& device) {
  at::NoGradGuard no_grad;
  model.eval();
  auto total = at::zeros({}, at::TensorOptions().device(device));
  for (int64_t b = 0; b < batches; ++b) {
    auto batch = val.get(b, 0);
    total += model.loss(batch.inputs.to(device), batch.targets.to(device));
  }
  model.train();
  return total.item<double>() / static_cast<double>(batches);
}

std::string human(double v) {
  char buf[32];
  if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e3) std::snprintf(buf, sizeof buf, "%.1fK", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

}  // namespace

Trainer::Trainer(TrainConfig cfg, ProcessInfo proc) : cfg_(std::move(cfg)), proc_(proc) {}

json Trainer::run() {
  const bool rank0 = proc_.rank == 0;
  const MeshShape shape = MeshShape::resolve(proc_.world_size, static_cast<int>(cfg_.tp), static_cast<int>(cfg_.pp));
  const DeviceInfo dev = select_device(cfg_.device, proc_.local_rank);
  const c10::Device device = dev.device;
  std::unique_ptr<Mesh> mesh;
  std::shared_ptr<Watchdog> watchdog;
  std::string backend = "none";
  if (proc_.world_size > 1) {
    backend = cfg_.backend == "auto" ? "mpi" : cfg_.backend;
    if (backend == "nccl") throw ConfigError("--backend nccl is not supported yet (the NCCL communicator is not implemented in this build)");
    watchdog = std::make_shared<Watchdog>(cfg_.comm_init_timeout);  // start-up grace until step 1 is done
    mesh = std::make_unique<Mesh>(make_mpi_communicator(MPI_COMM_WORLD, "world", watchdog), shape);
  }
  const int dp_rank = mesh ? mesh->coord().dp : 0;
  at::manual_seed(cfg_.seed + static_cast<uint64_t>(proc_.rank));  // dropout streams; weights have their own generator

  auto train_data = training_data(cfg_);
  BatchLayout layout{cfg_.micro_batch, cfg_.grad_accum, shape.dp, dp_rank};
  DataLoader loader(train_data, cfg_.seed, /*shuffle=*/true, layout);
  std::unique_ptr<DataLoader> val_loader;
  if (!cfg_.val_data.empty()) {
    auto val = std::make_shared<TokenDataset>(TokenDataset::from_paths(
        cfg_.val_data, parse_token_format(cfg_.data_format), cfg_.gpt.seq_len, cfg_.gpt.vocab_size));
    val_loader = std::make_unique<DataLoader>(val, cfg_.seed, /*shuffle=*/false,
                                              BatchLayout{cfg_.micro_batch, 1, 1, 0});
  }

  auto model = std::make_shared<GPT>(cfg_.gpt);
  model->init_weights(cfg_.seed);
  model->to(device);
  model->train();
  std::vector<at::Tensor> params = model->parameters();
  std::unique_ptr<DistributedDataParallel> ddp;
  if (mesh && shape.dp > 1) {
    ddp = std::make_unique<DistributedDataParallel>(params, mesh->dp());
    ddp->broadcast_parameters();
  }
  auto comm_bytes = [&] { return mesh ? mesh->world()->stats().bytes + mesh->dp()->stats().bytes : int64_t{0}; };
  AdamW optimizer(params, AdamWConfig{cfg_.beta1, cfg_.beta2, cfg_.adam_eps, cfg_.weight_decay});
  const LRSchedule schedule{cfg_.lr, cfg_.resolved_min_lr(), cfg_.warmup, cfg_.steps};

  const double fpt = flops_per_token(cfg_.gpt);
  std::optional<double> peak = cfg_.peak_tflops > 0 ? std::optional<double>(cfg_.peak_tflops)
                                                    : peak_tflops_for(dev.name);
  const int64_t tokens_per_step = layout.global_batch() * cfg_.gpt.seq_len;

  LogSink log = (cfg_.log_json.empty() || !rank0) ? LogSink() : LogSink(cfg_.log_json);
  log.write({{"type", "config"},
             {"config", cfg_.to_json()},
             {"world", {{"size", proc_.world_size}, {"dp", shape.dp}, {"tp", shape.tp}, {"pp", shape.pp},
                        {"backend", backend}, {"ddp_buckets", ddp ? ddp->num_buckets() : 0}}},
             {"params", model->num_params()},
             {"params_non_embedding_pos", cfg_.gpt.num_params_non_embedding_pos()},
             {"flops_per_token", fpt},
             {"tokens_per_step", tokens_per_step},
             {"device", dev.name},
             {"peak_tflops", peak ? json(*peak) : json(nullptr)},
             {"data", {{"tokens", train_data->num_tokens()}, {"samples", train_data->num_samples()},
                       {"source", cfg_.data.empty() ? json("synthetic") : json(cfg_.data)}}},
             {"versions", versions()}});
  if (rank0) {
    std::printf("kiln: %s, %lld parameters, %s on %s, %d rank(s) (dp %d tp %d pp %d), %lld tokens/step, %lld steps\n",
                cfg_.model.c_str(), static_cast<long long>(model->num_params()), cfg_.precision.c_str(),
                dev.name.c_str(), proc_.world_size, shape.dp, shape.tp, shape.pp,
                static_cast<long long>(tokens_per_step), static_cast<long long>(cfg_.steps));
    if (!peak) std::printf("kiln: no peak FLOP/s known for '%s': MFU not reported (give --peak-tflops)\n", dev.name.c_str());
    std::fflush(stdout);
  }

  const auto run_start = Clock::now();
  double tokens_per_s_sum = 0.0, last_loss = NAN, last_eval = NAN;
  int64_t timed_steps = 0;
  std::vector<double> losses;
  for (int64_t step = 0; step < cfg_.steps; ++step) {
    const auto t0 = Clock::now();
    const double lr = schedule.at(step);
    const int64_t bytes_before = comm_bytes();
    if (ddp) ddp->zero_grad();
    else model->zero_grad(/*set_to_none=*/true);
    auto loss_sum = at::zeros({}, at::TensorOptions().device(device));
    for (int64_t micro = 0; micro < cfg_.grad_accum; ++micro) {
      if (ddp) ddp->set_sync(micro + 1 == cfg_.grad_accum);  // sync skipping
      Batch batch = loader.get(step, micro);
      auto loss = model->loss(batch.inputs.to(device, /*non_blocking=*/true),
                              batch.targets.to(device, /*non_blocking=*/true));
      (loss / static_cast<double>(cfg_.grad_accum)).backward();
      loss_sum += loss.detach();
    }
    if (ddp) ddp->finish_backward();
    at::Tensor norm = clip_grad_norm(params, cfg_.grad_clip);
    // Loss and norm are read together, once: the host waits here so that a non-finite step is
    // refused before the update (the only other wait is the timing synchronise below).
    auto both = at::stack({loss_sum / static_cast<double>(cfg_.grad_accum), norm.to(loss_sum.device())}).cpu();
    if (mesh && shape.dp > 1) {
      // The step's loss is the mean over the global batch; every rank's norm is already the same.
      auto loss_mean = both.narrow(0, 0, 1).contiguous();
      mesh->dp()->all_reduce(loss_mean, ReduceOp::Avg)->wait();
      both[0] = loss_mean[0];
    }
    const double loss_v = both[0].item<double>(), norm_v = both[1].item<double>();
    if (!std::isfinite(loss_v) || !std::isfinite(norm_v)) {
      throw NumericsError("step " + std::to_string(step + 1) + ": loss " + std::to_string(loss_v) +
                          ", gradient norm " + std::to_string(norm_v) + " is not finite; stopping before the update");
    }
    optimizer.step(lr);
    synchronize(device);
    const double step_s = std::chrono::duration<double>(Clock::now() - t0).count();

    const double tokens_per_s = static_cast<double>(tokens_per_step) / step_s;
    const double tflops = tokens_per_s * fpt / 1e12;
    const double mem_gb = peak_memory_bytes(device) / 1e9;
    if (step == 0 && watchdog) {
      // Every rank switches to the short timeout together (after a barrier), or a fast rank
      // could time out on a slow one still inside its long start-up.
      mesh->world()->barrier();
      watchdog->set_timeout(cfg_.comm_timeout);
    }
    if (step > 0) {  // the first step pays for allocation and kernel selection
      tokens_per_s_sum += tokens_per_s;
      ++timed_steps;
    }
    last_loss = loss_v;
    losses.push_back(loss_v);
    json rec{{"type", "step"},        {"step", step + 1},       {"loss", loss_v},
             {"lr", lr},              {"grad_norm", norm_v},    {"loss_scale", 1.0},
             {"skipped", false},      {"tokens", tokens_per_step}, {"tokens_per_s", tokens_per_s},
             {"step_ms", step_s * 1e3}, {"tflops", tflops},      {"mfu", peak ? json(tflops / *peak) : json(nullptr)},
             {"mem_gb", mem_gb},      {"comm_bytes", comm_bytes() - bytes_before},
             {"comm_ms", ddp ? ddp->exposed_comm_ms() : 0.0}};
    if (ddp) rec["comm_buckets_in_backward"] = ddp->launched_in_backward();
    log.write(rec);
    if (rank0 && ((step + 1) % cfg_.log_every == 0 || step + 1 == cfg_.steps)) {
      std::printf("step %6lld/%lld | loss %.4f | lr %.2e | norm %.3f | %7.1f ms | %s tok/s | %.2f TFLOP/s",
                  static_cast<long long>(step + 1), static_cast<long long>(cfg_.steps), loss_v, lr, norm_v,
                  step_s * 1e3, human(tokens_per_s).c_str(), tflops);
      if (peak) std::printf(" | mfu %.1f%%", 100.0 * tflops / *peak);
      std::printf(" | mem %.2f GB\n", mem_gb);
      std::fflush(stdout);
    }
    const bool eval_now = val_loader && ((cfg_.eval_every > 0 && (step + 1) % cfg_.eval_every == 0) ||
                                         step + 1 == cfg_.steps);
    if (eval_now) {
      last_eval = evaluate(*model, *val_loader, cfg_.eval_batches, device);
      log.write({{"type", "eval"}, {"step", step + 1}, {"val_loss", last_eval}});
      if (rank0) {
        std::printf("eval   %6lld | val loss %.4f\n", static_cast<long long>(step + 1), last_eval);
        std::fflush(stdout);
      }
    }
  }

  double tail = NAN;
  if (!losses.empty()) {
    const size_t k = std::min<size_t>(10, losses.size());
    tail = 0.0;
    for (size_t i = losses.size() - k; i < losses.size(); ++i) tail += losses[i];
    tail /= static_cast<double>(k);
  }
  // A fingerprint of the final weights, for comparing runs (parity tests): sum and sum of squares.
  double param_sum = 0.0, param_sq = 0.0;
  for (const auto& p : params) {
    auto d = p.detach().to(at::kDouble);
    param_sum += d.sum().item<double>();
    param_sq += d.pow(2).sum().item<double>();
  }
  const double mean_tps = timed_steps > 0 ? tokens_per_s_sum / static_cast<double>(timed_steps) : NAN;
  json summary{{"type", "summary"},
               {"steps", cfg_.steps},
               {"final_loss", last_loss},
               {"mean_loss_last10", tail},
               {"val_loss", last_eval},
               {"mean_tokens_per_s", mean_tps},
               {"mean_tflops", mean_tps * fpt / 1e12},
               {"mean_mfu", peak ? json(mean_tps * fpt / 1e12 / *peak) : json(nullptr)},
               {"peak_mem_gb", peak_memory_bytes(device) / 1e9},
               {"param_sum", param_sum},
               {"param_sq", param_sq},
               {"wall_s", std::chrono::duration<double>(Clock::now() - run_start).count()}};
  log.write(summary);
  return summary;
}

}  // namespace kiln
