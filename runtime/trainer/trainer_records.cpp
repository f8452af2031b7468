// runtime/trainer/trainer_records.cpp -- the run's config record (the JSONL log's first record: settings,
// layout, devices, data, model-state bytes, versions) and the start-up lines rank 0 prints.
#include <cstdio>

#include <torch/version.h>
#if defined(KILN_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

#include "distributed/error.h"
#include "parallel/pipeline_interleaved.h"
#include "parallel/pipeline_zero_bubble.h"
#include "plan/compare.h"
#include "runtime/observe/console.h"
#include "runtime/trainer/trainer.h"
#include "runtime/trainer/trainer_run.h"

namespace kiln {

namespace {

using json = nlohmann::json;

json versions() {
  json v{{"kiln", KILN_VERSION}, {"torch", TORCH_VERSION}};
#if defined(KILN_WITH_CUDA)
  v["cuda_runtime"] = CUDART_VERSION;
#endif
  return v;
}

json changes_json(const std::vector<ConfigChange>& changes) {
  json out = json::array();
  for (const auto& c : changes) out.push_back({{"key", c.key}, {"saved", c.saved}, {"now", c.now}, {"breaks_replay", c.breaks_replay}});
  return out;
}
}  // namespace

void Trainer::log_config() {
  Run& r = *run_;
  r.log.write(config_record());
  if (r.load_io) {
    // Marks where the resumed stretch begins: steps after it repeat any the log already has.
    json rec{{"type", "resume"}, {"dir", r.resumed_from}, {"step", r.progress.step}};
    rec.update(r.load_io->to_json());
    if (!r.resume_notice.empty()) rec["notice"] = r.resume_notice;
    r.log.write(rec);
  }
  if (proc_.rank != 0) return;
  print_start_lines();
  print_state_lines();
  std::fflush(stdout);
}

// The config record: the settings, the layout, the model's sizes, the device, the data and
// tokenizer, and kiln plan's estimate of this rank's activations.
json Trainer::config_record() const {
  const Run& r = *run_;
  const ModelStateBytes state = r.model_state();
  json record({{"type", "config"},
               {"config", cfg_.to_json()},
               {"world", {{"size", proc_.world_size}, {"dp", r.shape.dp}, {"tp", r.shape.tp}, {"pp", r.shape.pp},
                          {"sp", cfg_.sp}, {"cp", r.shape.cp}, {"backend", r.backend}, {"ddp_buckets", r.ddp ? r.ddp->num_buckets() : 0}}},
               {"pipeline", {{"stages", r.shape.pp}, {"blocks", r.stage_blocks},  // per virtual stage
                             {"schedule", cfg_.resolved_pp_schedule()}, {"virtual", cfg_.pp_virtual},
                             {"bubble", cfg_.resolved_pp_schedule() == "zb-h1"
                                            ? zb_h1_bubble_fraction(r.shape.pp, static_cast<int>(cfg_.grad_accum))
                                            : interleaved_bubble_fraction(r.shape.pp, static_cast<int>(cfg_.pp_virtual),
                                                                          static_cast<int>(cfg_.grad_accum))}}},
               {"zero", {{"stage", cfg_.zero}, {"offload", cfg_.offload}, {"accum", cfg_.zero_accum}, {"delayed_update", cfg_.offload_delayed_update},
                         {"padded_params", r.zero ? json(r.zero->padded_numel()) : json(nullptr)}}},
               {"model_state", model_state_json(state)},
               // --async-save's snapshot pool, this rank's host memory from set-up (kiln plan: docs/plan.md s5)
               {"snapshot_pool_bytes", r.saver ? r.saver->snapshot_bytes() : int64_t{0}},
               {"params", cfg_.gpt.num_params()},
               {"params_local", r.model->num_params()},
               {"params_non_embedding_pos", cfg_.gpt.num_params_non_embedding_pos()},
               {"params_active", cfg_.gpt.num_active_params()},  // MoE: k experts per layer (= params, dense)
               {"params_active_non_embedding_pos", cfg_.gpt.num_active_params_non_embedding_pos()},
               {"flops_per_token", r.flops_per_token},
               {"tokens_per_step", r.tokens_per_step},
               {"device", r.dev.name},
               {"devices", r.devices->count()},
               {"topology", {{"nodes", proc_.nodes}, {"ranks_per_node", proc_.local_size}}},
               {"host_threads", {{"intra_op", r.threads.intra_op}, {"cores", r.threads.cores},
                                 {"cpus_allowed", r.threads.cpus_allowed}, {"ranks_on_node", r.threads.ranks_on_node},
                                 {"rule", r.threads.rule}}},
               {"peak_tflops", r.peak ? json(*r.peak) : json(nullptr)},
               {"compute_dtype", c10::toString(compute_dtype(r.precision))},
               {"float8_layers", r.precision == Precision::FP8 ? json{{"float8", r.float8_layers.first}, {"of", r.float8_layers.second}}
                                                               : json(nullptr)},
               {"kernels", kernels_name(r.model->kernels())},  // what ran: fused only on CUDA (kernels/kernel_choice.h)
               {"resumed_from", r.resumed_from.empty() ? json(nullptr) : json(r.resumed_from)},
               {"initialised_from", r.init_io ? json(cfg_.init_from) : json(nullptr)},
               {"config_changes", changes_json(r.config_changes)},
               {"start_step", r.progress.step},
               {"data", {{"tokens", r.train_data->num_tokens()}, {"samples", r.train_data->num_samples()},
                         {"source", cfg_.data.empty() ? json("synthetic") : json(cfg_.data)}}},
               {"tokenizer", {{"kind", r.tokenizer ? json(r.tokenizer->name()) : json(nullptr)},
                              {"vocab_size", r.tokenizer ? json(r.tokenizer->vocab_size()) : json(nullptr)},
                              {"eot", r.tokenizer ? json(r.tokenizer->eot()) : json(nullptr)},
                              {"source", r.tokenizer_source}}},
               {"versions", versions()}});
  // The cost model's activation bytes for this rank (kiln plan's "activations": stage 0's, every
  // micro-batch in flight; docs/plan.md): what --sp and --cp divide.
  try {
    record["activations"] = {{"estimate_bytes", plan::predicted_activation_bytes(record)}, {"source", "kiln plan"}};
  } catch (const ConfigError& e) {
    record["activations"] = {{"estimate_bytes", nullptr}, {"source", std::string("kiln plan: ") + e.what()}};
  }
  return record;
}

// Rank 0's first lines: the run in one line, notices, and settings that would do nothing.
void Trainer::print_start_lines() const {
  const Run& r = *run_;
  if (cfg_.gpt.is_moe()) {
    std::printf("kiln: Mixture-of-Experts: %lld of %lld blocks, %lld experts, top-%lld, capacity %s, %lld parameters active per token\n",
                static_cast<long long>(cfg_.gpt.n_moe_layers()), static_cast<long long>(cfg_.gpt.n_layer),
                static_cast<long long>(cfg_.gpt.n_experts), static_cast<long long>(cfg_.gpt.top_k),
                cfg_.gpt.moe_capacity_factor > 0 ? ("factor " + json(cfg_.gpt.moe_capacity_factor).dump() + " per sequence").c_str() : "dropless",
                static_cast<long long>(cfg_.gpt.num_active_params()));
  }
  std::printf("kiln: %s, %lld parameters, %s on %s, %d rank(s) (%s) on %d device(s) of %d node(s), %lld tokens/step, %lld steps\n",
              (cfg_.init_from.empty() ? cfg_.model_description() : "--init-from " + cfg_.init_from).c_str(),
              static_cast<long long>(cfg_.gpt.num_params()), cfg_.precision.c_str(), r.dev.name.c_str(), proc_.world_size,
              format_layout(r.shape.dp, r.shape.ep, r.shape.cp, r.shape.tp, cfg_.sp, r.shape.pp).c_str(), r.devices->count(), proc_.nodes,
              static_cast<long long>(r.tokens_per_step), static_cast<long long>(cfg_.steps));
  if (!cfg_.vocab_from.empty()) {
    std::printf("kiln: vocab_size %lld from %s (no --vocab-size given, and the %s preset's %lld cannot hold its ids; padded to %lld)\n",
                static_cast<long long>(cfg_.gpt.vocab_size), cfg_.vocab_from.c_str(), cfg_.model.c_str(),
                static_cast<long long>(GPTConfig::preset(cfg_.model).vocab_size), static_cast<long long>(cfg_.gpt.padded_vocab_size()));
  }
  if (!r.resume_notice.empty()) std::printf("kiln: %s\n", r.resume_notice.c_str());
  if (r.save_lock && !r.save_lock->notice().empty()) std::printf("kiln: %s\n", r.save_lock->notice().c_str());
  if (!r.log.moved_to().empty()) {
    std::printf("kiln: %s held an earlier run's log: moved aside to %s\n", cfg_.log_json.c_str(), r.log.moved_to().c_str());
  }
  for (const auto& c : r.config_changes) {
    std::printf("kiln: %s: %s -> %s%s\n", c.key.c_str(), c.saved.dump().c_str(), c.now.dump().c_str(),
                c.breaks_replay ? " (--allow-config-change: the run no longer replays the one it resumes)" : "");
  }
  if (!r.tokenizer && !cfg_.save_dir.empty()) {
    std::printf("kiln: note: checkpoints carry no tokenizer (%s)\n", r.tokenizer_source.substr(r.tokenizer_source.find(": ") + 2).c_str());
  }
  // Settings that would silently do nothing.
  if (cfg_.eval_every > 0 && cfg_.val_data.empty()) {
    std::printf("kiln: warning: --eval-every %lld does nothing without --val-data\n", static_cast<long long>(cfg_.eval_every));
  }
  if (cfg_.save_every > 0 && cfg_.save_dir.empty()) {
    std::printf("kiln: warning: --save-every %lld does nothing without --save-dir\n", static_cast<long long>(cfg_.save_every));
  }
  if (cfg_.warmup > cfg_.steps) {
    std::printf("kiln: warning: --warmup %lld is longer than --steps %lld: the learning rate never reaches --lr\n",
                static_cast<long long>(cfg_.warmup), static_cast<long long>(cfg_.steps));
  } else if (cfg_.warmup == cfg_.steps && cfg_.steps > 0) {
    // The default --warmup 20 with --steps 20: said, as a longer one is.
    std::printf("kiln: warning: --warmup %lld is all of --steps %lld: the whole run is warm-up (give --warmup below --steps)\n",
                static_cast<long long>(cfg_.warmup), static_cast<long long>(cfg_.steps));
  }
  if (r.val_loader && r.eval_batches * cfg_.micro_batch > r.val_samples) {
    std::printf("kiln: note: --eval-batches %lld x --micro-batch %lld = %lld sequences, more than the %lld samples of --val-data: "
                "each evaluation repeats samples (--eval-batches 0 reads the set once)\n",
                static_cast<long long>(r.eval_batches), static_cast<long long>(cfg_.micro_batch),
                static_cast<long long>(r.eval_batches * cfg_.micro_batch), static_cast<long long>(r.val_samples));
  }
  if (cfg_.check_replicas > 0 && r.shape.grad_ranks() == 1) {
    // Not an error: the same flags may serve the job's larger launches.
    std::printf("kiln: warning: --check-replicas %lld does nothing with a single replica (dp 1, cp 1): there is no other copy "
                "of the weights to compare with\n",
                static_cast<long long>(cfg_.check_replicas));
  }
  if (cfg_.max_wall_time > 0 && cfg_.save_dir.empty()) {
    std::printf("kiln: warning: --max-wall-time stops the run, but without --save-dir nothing is saved to resume from\n");
  }
}

// Rank 0's lines on where the weights came from and how the state and the stages are laid out.
void Trainer::print_state_lines() const {
  const Run& r = *run_;
  const ModelStateBytes state = r.model_state();
  if (r.init_io) {
    std::printf("kiln: weights from %s (--init-from: fresh optimizer, step 0; %.3f GB in %.2f s)\n", cfg_.init_from.c_str(),
                r.init_io->bytes / 1e9, r.init_io->seconds);
  } else if (!cfg_.init_from.empty() && !r.resumed_from.empty()) {
    std::printf("kiln: --init-from %s not used: resuming %s (--init-from seeds only a fresh run)\n", cfg_.init_from.c_str(),
                r.resumed_from.c_str());
  }
  if (!r.resumed_from.empty()) {
    const CheckpointIo& io = *r.load_io;
    std::printf("kiln: resumed from %s at step %lld (%.3f GB in %.2f s, %.2f GB/s; rank 0's peak extra host memory %.3f GB)\n",
                r.resumed_from.c_str(), static_cast<long long>(r.progress.step), io.bytes / 1e9, io.seconds,
                io.seconds > 0 ? io.bytes / io.seconds / 1e9 : 0.0, io.peak_extra_bytes / 1e9);
  }
  if (r.zero) {
    const auto& d = state.device;
    const auto& h = state.host;
    std::printf("kiln: ZeRO-%lld over %d dp rank(s), offload %s: model state per rank %.3f GB on the device, %.3f GB on the host\n",
                static_cast<long long>(cfg_.zero), r.shape.dp, cfg_.offload.c_str(),
                (d.params + d.grads + d.optimizer) / 1e9, (h.params + h.grads + h.optimizer) / 1e9);
  }
  if (r.shape.pp > 1) {
    std::string split;
    for (int64_t n : r.stage_blocks) split += (split.empty() ? "" : ",") + std::to_string(n);
    const double bubble = interleaved_bubble_fraction(r.shape.pp, static_cast<int>(cfg_.pp_virtual), static_cast<int>(cfg_.grad_accum));
    if (cfg_.resolved_pp_schedule() == "zb-h1") {
      std::printf("kiln: pipeline of %d stages (blocks %s), ZB-H1 over %lld micro-batches: bubble %.1f%% of each step "
                  "(equal forward, input and weight passes; 1F1B %.1f%%)\n",
                  r.shape.pp, split.c_str(), static_cast<long long>(cfg_.grad_accum),
                  100.0 * zb_h1_bubble_fraction(r.shape.pp, static_cast<int>(cfg_.grad_accum)), 100.0 * bubble);
    } else if (cfg_.pp_virtual > 1) {
      std::printf("kiln: pipeline of %d stages x %lld chunks (blocks %s a virtual stage), interleaved 1F1B over %lld "
                  "micro-batches: bubble %.1f%% of each step\n",
                  r.shape.pp, static_cast<long long>(cfg_.pp_virtual), split.c_str(), static_cast<long long>(cfg_.grad_accum),
                  100.0 * bubble);
    } else {
      std::printf("kiln: pipeline of %d stages (blocks %s), 1F1B over %lld micro-batches: bubble %.1f%% of each step\n",
                  r.shape.pp, split.c_str(), static_cast<long long>(cfg_.grad_accum), 100.0 * bubble);
    }
    if (cfg_.grad_accum < r.shape.pp) {
      std::printf("kiln: warning: --grad-accum %lld is below --pp %d: the stages idle most of each step; use at least "
                  "%d micro-batches (4 x pp keeps the bubble under 20%%)\n",
                  static_cast<long long>(cfg_.grad_accum), r.shape.pp, r.shape.pp);
    }
  }
  if (cfg_.offload != "none" && r.threads.cpus_allowed == 1 && r.threads.cores > 1) {
    std::printf("kiln: warning: this rank may run on 1 of the node's %d CPUs (mpirun binds each rank to a core by "
                "default): the host AdamW of --offload runs on one thread; launch with --bind-to none\n",
                r.threads.cores);
  }
  if (!r.peak) std::printf("kiln: no peak FLOP/s known for '%s': MFU not reported (give --peak-tflops)\n", r.dev.name.c_str());
}

}  // namespace kiln
