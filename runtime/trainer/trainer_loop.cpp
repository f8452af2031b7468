// runtime/trainer/trainer_loop.cpp -- the loop: steps queued one ahead of their reads, each
// step's record and the decisions after it (stop, evaluation, sample, checkpoint), the profile
// window, the summary.
//
//   run = setup; config record; start_loop; run_steps; finish_run
//   run_steps: for each step s: forward_backward(s), read s - 1 (record), queue_update(s)
//              -- s - 1's read waits behind s's forward and backward unless may_defer says no
//   record(s): the step's figures, its JSONL record and console line, then after_step(s):
//              stop request, evaluation, sample, checkpoint
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>

#include <ATen/ATen.h>

#include "data/prefetch.h"
#include "distributed/device.h"
#include "distributed/device_check.h"
#include "distributed/error.h"
#include "distributed/host_memory.h"
#include "distributed/strprintf.h"
#include "distributed/watchdog.h"
#include "distributed/rank0_verdict.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/consolidate.h"
#include "runtime/inference/generate.h"
#include "runtime/observe/console.h"
#include "runtime/observe/profiler.h"
#include "runtime/trainer/stop_requests.h"
#include "runtime/trainer/trainer.h"
#include "runtime/trainer/trainer_run.h"

namespace kiln {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// The stop request of the wall-time limit, above every signal number (the ranks agree on the
// largest request).
constexpr int64_t kStopWallTime = 1000;

}  // namespace

json Trainer::run() {
  setup();
  log_config();
  Loop loop = start_loop();
  run_steps(loop);
  collect_save(loop, /*wait=*/true);  // --async-save: the end of the run waits for the write
  return finish_run(loop);
}

// The loop's bounds, the prefetcher, and the --profile window.
Trainer::Loop Trainer::start_loop() {
  Run& r = *run_;
  const c10::Device device = r.dev.device;
  Loop loop;
  loop.energy_ok = r.devices->energy_known();
  loop.devices = static_cast<double>(r.devices->count());
  loop.first_step = r.progress.step;
  if (proc_.rank == 0 && loop.first_step >= cfg_.steps && cfg_.steps > 0) {
    std::printf("kiln: the checkpoint is at step %lld, --steps is %lld: nothing left to train\n",
                static_cast<long long>(loop.first_step), static_cast<long long>(cfg_.steps));
  }
  loop.end_step = cfg_.stop_at_step > 0 ? std::min(cfg_.stop_at_step, cfg_.steps) : cfg_.steps;
  r.prefetch = std::make_unique<BatchPrefetcher>(*r.loader, cfg_.grad_accum, pin_for(device), loop.end_step);
  // --profile: steps [profile_first, profile_end) of the loop (0-based; runtime/observe/profiler.h).
  if (!cfg_.profile.empty()) {
    loop.profile_first = cfg_.profile_start > 0 ? cfg_.profile_start - 1 : std::min(loop.first_step + 2, loop.end_step - 1);
    loop.profile_end = loop.profile_first + cfg_.profile_steps;
    if (loop.profile_first < loop.first_step || loop.profile_first >= loop.end_step) {
      throw ConfigError("--profile-start " + std::to_string(loop.profile_first + 1) + " is outside this run's steps " +
                        std::to_string(loop.first_step + 1) + "-" + std::to_string(loop.end_step));
    }
    loop.profiler = std::make_unique<StepProfiler>(cfg_.profile, proc_.rank, device.is_cuda());
  }
  return loop;
}

// Whether step N's read may wait until step N + 1's forward and backward are queued, so that the
// device never idles while the host reads, logs and decides (docs/precision.md, "The step"):
// not when N + 1's backward needs N's loss scale (fp16), nor when work follows N that must not
// be timed as N + 1's or that reads N's weights before N + 1 is queued (the first step's watchdog
// switch, an evaluation, a sample, a scheduled checkpoint, a --check-replicas comparison, whose
// host read would wait behind N + 1's forward and backward), nor for the last step.
bool Trainer::may_defer(const Loop& loop, int64_t step) const {
  const Run& r = *run_;
  const int64_t n = step + 1;
  const bool eval = r.val_loader && ((cfg_.eval_every > 0 && n % cfg_.eval_every == 0) || n == cfg_.steps);
  const bool save = !cfg_.save_dir.empty() && cfg_.save_every > 0 && n % cfg_.save_every == 0;
  const bool sample = cfg_.sample_every > 0 && n % cfg_.sample_every == 0;
  const bool check = r.replicas && n % cfg_.check_replicas == 0;
  return r.precision != Precision::FP16 && step != loop.first_step && n < loop.end_step && !eval && !save && !sample && !check;
}

void Trainer::run_steps(Loop& loop) {
  Run& r = *run_;
  std::optional<QueuedStep> queued;  // the step whose update is queued and whose verdict is not yet read
  bool stopped = false;
  int64_t step = loop.first_step;
  if (r.graphs) r.graphs->capture_at = loop.first_step + 2;  // --cuda-graph: two eager steps first (trainer_graph.cpp)
  // A spike rollback (Trainer::roll_back) sends the loop back to its checkpoint's step; a step whose
  // forward and backward were queued meanwhile is discarded, as a stop discards it.
  auto rewound = [&] {
    if (loop.rollback_to < 0) return false;
    step = loop.rollback_to;
    loop.rollback_to = -1;
    return true;
  };
  while (step < loop.end_step && !stopped) {
    if (loop.profiler && loop.profiler->active() && step == loop.profile_end) profile_stop(loop, step);
    if (loop.profiler && !loop.profiler->active() && step == loop.profile_first) loop.profiler->start();
    if (queued && !may_defer(loop, queued->step)) {
      stopped = !record(loop, queued->step, finish_step(*queued));
      queued.reset();
      if (stopped) break;
      if (rewound()) continue;
    }
    QueuedStep q = forward_backward(step);
    if (queued) {  // deferred: read behind this step's forward and backward; a stop discards them
      StepOutcome s = finish_step(*queued);
      s.read_deferred = true;
      stopped = !record(loop, queued->step, s);
      queued.reset();
      if (stopped) break;
      if (rewound()) continue;
    }
    queue_update(q);
    queued = std::move(q);
    if (++step == loop.end_step) {  // the last step
      record(loop, queued->step, finish_step(*queued));
      queued.reset();
      rewound();
    }
  }

  synchronize(r.dev.device);  // the last update
  if (loop.profiler && loop.profiler->active()) profile_stop(loop, r.progress.step);
  r.prefetch.reset();
}

void Trainer::profile_stop(Loop& loop, int64_t next_step) {
  Run& r = *run_;
  synchronize(r.dev.device);  // the window's device work, all of it
  const ProfileSummary s = loop.profiler->stop();
  if (proc_.rank != 0) return;
  json rec{{"type", "profile"}, {"first_step", loop.profile_first + 1}, {"last_step", next_step}, {"trace", loop.profiler->trace_path()}};
  rec.update(s.to_json());
  r.log.write(rec);
  std::printf("kiln: profiled steps %lld-%lld into %s\n%s", static_cast<long long>(loop.profile_first + 1),
              static_cast<long long>(next_step), loop.profiler->trace_path().c_str(), s.table().c_str());
  std::fflush(stdout);
}

// Step N's record and the decisions after it (stop, evaluation, sample, checkpoint), once the
// host has read it; false: the run stops after N.
bool Trainer::record(Loop& loop, int64_t step, const StepOutcome& s) {
  Run& r = *run_;
  const c10::Device device = r.dev.device;
  StepFigures f;
  // The step's time: its interval of the phase chain (runtime/observe/phase_timer.h), from the end of
  // the previous step's update to the end of its own -- GPU time on a GPU, the host clock here.
  for (double ms : s.phase_ms) f.step_s += ms / 1e3;
  const auto joules_after = r.energy->joules();
  // The job's joules: every device's, summed (collective only when every meter reads).
  f.step_joules = r.devices->job_joules(r.interval_joules, joules_after);
  // Every rank's compute time (runtime/observe/stragglers.h): the step's slowest rank. Its own:
  // forward and backward less where it stood still waiting for the others in a collective.
  const double compute_ms = std::max(0.0, s.phase_ms[static_cast<size_t>(Phase::Forward)] +
                                              s.phase_ms[static_cast<size_t>(Phase::Backward)] - s.compute_wait_ms);
  // This rank's stop request (runtime/trainer/stop_requests.h): a signal to it, or the wall-time
  // limit ahead.
  loop.longest_step_s = std::max(loop.longest_step_s, f.step_s);
  int64_t request = r.stop->requested();
  if (cfg_.max_wall_time > 0) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - r.started).count();
    const double next = loop.longest_step_s + (cfg_.save_dir.empty() ? 0.0 : loop.last_save_s);
    if (elapsed + next > cfg_.max_wall_time) request = std::max<int64_t>(request, kStopWallTime);
  }
  // The step's one host collective (host_world: MPI, outside comm_bytes): every rank's request and
  // compute time. Every rank then takes the largest request (the same decision after the same
  // step), and names the slowest rank. Where the read was not deferred the device is idle here and
  // the wait for the others lands in the next step's forward: the wait clock takes it off there.
  const auto exchange_start = Clock::now();
  const std::vector<double> all = all_gather_doubles(r.host_world.get(), {static_cast<double>(request), compute_ms});
  if (r.wait_clock && !s.read_deferred) r.wait_clock->add_ms(std::chrono::duration<double, std::milli>(Clock::now() - exchange_start).count());
  std::vector<double> computes;
  for (size_t i = 0; i + 1 < all.size(); i += 2) {
    request = std::max(request, static_cast<int64_t>(all[i]));
    computes.push_back(all[i + 1]);
  }
  f.slowest = r.stragglers->step(computes, compute_ms, /*timed=*/step > loop.first_step);
  if (r.test_slow_factor > 0) r.test_own_compute_ms = compute_ms / (1.0 + (step > loop.first_step ? r.test_slow_factor : 0.0));  // test-only
  r.interval_joules = joules_after;
  if (!f.step_joules) loop.energy_ok = false;
  r.progress.step = step + 1;
  r.progress.samples = r.loader->samples_before(step + 1);
  r.progress.loss_scaler = r.scaler->state();
  if (s.skipped) ++loop.skipped_steps;

  // The job's figures, and per device (distributed/job_devices.h): mfu = tflops_job / (G x peak).
  f.tokens_per_s = static_cast<double>(r.tokens_per_step) / f.step_s;
  f.tflops_job = f.tokens_per_s * r.flops_per_token / 1e12;
  f.tflops = f.tflops_job / loop.devices;
  f.mem_gb = peak_memory_bytes(device) / 1e9;
  if (step == loop.first_step && r.watchdog) {
    // Every rank switches to the short timeout together (after a barrier), or a fast rank
    // could time out on a slow one still inside its long start-up.
    r.mesh->world()->barrier();
    r.watchdog->set_timeout(cfg_.comm_timeout);
    r.chain_broken = true;
  }
  if (step > loop.first_step) {  // the first step pays for allocation and kernel selection
    loop.tokens_per_s_sum += f.tokens_per_s;
    loop.timed_seconds += f.step_s;
    if (f.step_joules) loop.timed_joules += *f.step_joules;
    ++loop.timed_steps;
  }
  loop.last_loss = s.loss;
  loop.last_comm_bytes = s.comm_bytes;
  loop.losses.push_back(s.loss);
  f.tokens_seen = r.progress.samples * cfg_.gpt.seq_len;  // the whole run's, resumes included
  f.elapsed_s = std::chrono::duration<double>(Clock::now() - loop.start).count();
  r.log.write(step_record(loop, step, s, f));
  collect_save(loop, /*wait=*/false);  // --async-save: a write that completed (or failed) since the last step
  if (proc_.rank == 0 && ((step + 1) % cfg_.log_every == 0 || step + 1 == loop.end_step || s.skipped)) {
    print_step_line(loop, step, s, f);
  }
  if (r.spikes && !s.skipped) {  // --spike-rollback (runtime/trainer/spike_guard.h)
    const SpikeGuard::Verdict v = r.spikes->observe(step + 1, s.loss);
    if (v.roll_back) {
      roll_back(loop, step, v);
      return true;
    }
  }
  return after_step(loop, step, request);
}

json Trainer::step_record(const Loop& loop, int64_t step, const StepOutcome& s, const StepFigures& f) const {
  const Run& r = *run_;
  const auto& phase_ms = s.phase_ms;
  json rec{{"type", "step"},          {"step", step + 1},         {"loss", json_num(s.loss)},
           {"lr", s.lr},              {"grad_norm", json_num(s.norm)}, {"loss_scale", s.loss_scale},
           {"skipped", s.skipped},    {"tokens", r.tokens_per_step}, {"tokens_per_s", f.tokens_per_s},
           {"step_ms", f.step_s * 1e3}, {"tflops", f.tflops},     {"tflops_job", f.tflops_job},
           {"mfu", r.peak ? json(f.tflops_job / (loop.devices * *r.peak)) : json(nullptr)},
           {"mem_gb", f.mem_gb},      {"comm_bytes", s.comm_bytes}, {"comm_ms", phase_ms[static_cast<size_t>(Phase::Comm)]},
           {"forward_ms", phase_ms[static_cast<size_t>(Phase::Forward)]},
           {"backward_ms", phase_ms[static_cast<size_t>(Phase::Backward)]},
           {"slowest_compute_ms", f.slowest.compute_ms}, {"slowest_rank", f.slowest.rank},
           {"compute_wait_ms", s.compute_wait_ms},
           {"exposed_comm_ms", phase_ms[static_cast<size_t>(Phase::Comm)]},
           {"optimizer_ms", phase_ms[static_cast<size_t>(Phase::Optimizer)]},
           {"energy_j", f.step_joules ? json(*f.step_joules) : json(nullptr)},
           {"watts", f.step_joules ? json(*f.step_joules / f.step_s) : json(nullptr)},
           {"tokens_seen", f.tokens_seen},
           {"elapsed_s", f.elapsed_s}};
  // Masked targets (kiln prep --chat): the targets the loss was taken over (`tokens` counts every
  // position: the throughput's).
  if (s.loss_tokens >= 0) rec["loss_tokens"] = s.loss_tokens;
  if (r.ddp) rec["comm_buckets_in_backward"] = r.ddp->launched_in_backward();
  // The device check mode (tests): the host's reads of device memory from the step's start to
  // its queued update -- 0 for a step without offload (distributed/device_check.h).
  if (host_sync_count_enabled()) rec["host_syncs_before_update"] = s.host_syncs;
  rec["read_deferred"] = s.read_deferred;  // read after the next step's forward and backward were queued
  if (r.pipe) rec["pp_live_max"] = r.pipe->max_live();  // micro-batches whose activations stage 0 held at once
  if (s.moe) {  // models/moe_stats.h
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
  return rec;
}

void Trainer::print_step_line(const Loop& loop, int64_t step, const StepOutcome& s, const StepFigures& f) const {
  const Run& r = *run_;
  StepLine line{step + 1, cfg_.steps, s.loss, s.lr, s.norm, f.step_s * 1e3, f.tokens_per_s, f.tflops, f.tflops_job,
                r.devices->count() > 1, std::nullopt, f.mem_gb, std::nullopt, s.skipped,
                r.precision == Precision::FP16 ? "overflow" : "non-finite", f.tokens_seen, f.elapsed_s, 0.0};
  if (r.peak) line.mfu = f.tflops_job / (loop.devices * *r.peak);
  if (r.precision == Precision::FP16) line.loss_scale = s.loss_scale;
  line.eta_s = static_cast<double>(loop.end_step - step - 1) *
               (loop.timed_steps > 0 ? loop.timed_seconds / static_cast<double>(loop.timed_steps) : f.step_s);
  std::printf("%s\n", format_step_line(line).c_str());
  std::fflush(stdout);
}

// After step N: a stop request, then evaluation, a sample and a checkpoint where they are due.
// False: the run stops after N.
bool Trainer::after_step(Loop& loop, int64_t step, int64_t request) {
  Run& r = *run_;
  // A request to stop (runtime/trainer/stop_requests.h), agreed by every rank in record(): a signal
  // to any rank, or the wall-time limit ahead; every rank takes the same decision after the same step.
  const bool stopping = request != 0 && step + 1 < loop.end_step;
  if (stopping) loop.stop_reason = request == kStopWallTime ? "--max-wall-time" : StopRequests::name(static_cast<int>(request));
  const bool eval_now = r.val_loader && ((cfg_.eval_every > 0 && (step + 1) % cfg_.eval_every == 0) || step + 1 == cfg_.steps);
  bool save_now = !cfg_.save_dir.empty() && ((cfg_.save_every > 0 && (step + 1) % cfg_.save_every == 0) ||
                                             step + 1 == loop.end_step || stopping);
  const bool sample_now = cfg_.sample_every > 0 && (step + 1) % cfg_.sample_every == 0;
  if (eval_now || save_now || sample_now) {
    // --offload-delayed-update: this step's host update into the weights first (the delay restarts).
    if (r.zero) r.zero->publish();
    synchronize(r.dev.device);  // the update of this step, before its weights are read
    r.chain_broken = true;
  }
  // The replicas' weights compared (runtime/trainer/replica_check.h): every --check-replicas steps
  // and before every save, so that a save never writes a corrupt replica's weights.
  if (r.replicas) {
    r.replicas->maybe_inject(step + 1);  // test-only KILN_TEST_FLIP_BIT
    if ((step + 1) % cfg_.check_replicas == 0 || save_now) r.replicas->check(r.host_world.get(), step + 1);
  }
  bool new_best = false;
  if (eval_now) {
    loop.last_eval = evaluate(step + 1);
    new_best = note_evaluation(loop, step, &save_now);
  }
  // the first replica samples (with --ep the first ep group's replicas, whose MoE layers hold
  // the experts between them)
  if (sample_now && (!r.mesh || r.mesh->coord().dp < r.shape.ep)) write_sample(step);
  if (save_now) save_checkpoint(loop, step);
  if (new_best && cfg_.keep_best) {
    collect_save(loop, /*wait=*/true);  // `best` names a committed checkpoint
    r.checkpointer->mark_best(step + 1);
  }
  if (stopping) {
    loop.stopped_at = step + 1;
    return false;
  }
  return loop.early_stopped_at == 0;
}

// --keep-best and --early-stop after an evaluation at step N (every rank computed the same val
// loss): a lower one than every before is the new best, saved (--keep-best) and pointed at by
// save_dir/best after the save; --early-stop ends the run once that many evaluations in a row
// found none lower (the last checkpoint saved as at the end). Returns whether N is a new best.
bool Trainer::note_evaluation(Loop& loop, int64_t step, bool* save_now) {
  Run& r = *run_;
  Run::Best& best = r.best;
  // Rank 0's value (the logged one) decides on every rank: ranks of other dp indices may have
  // read other validation samples, and the ranks must save and stop alike. Without either flag
  // nothing is decided, and no collective is added.
  double val = loop.last_eval;
  if (r.host_world && (cfg_.keep_best || cfg_.early_stop > 0)) {
    at::Tensor v = at::full({1}, val, at::TensorOptions().dtype(at::kDouble));
    r.host_world->broadcast(v, 0)->wait();
    val = v.item<double>();
  }
  const bool improved = std::isfinite(val) && val < best.val_loss;
  if (improved) best = {val, step + 1, 0};
  else ++best.evals_since;
  if (improved && cfg_.keep_best) *save_now = true;
  if (cfg_.early_stop > 0 && best.evals_since >= cfg_.early_stop && step + 1 < loop.end_step) {
    loop.early_stopped_at = step + 1;
    *save_now = *save_now || !cfg_.save_dir.empty();
  }
  return improved;
}

// llm.c's sample (runtime/inference/generate.h): 64 tokens from end-of-text at temperature 1, seeded by the
// run's seed and the step. No global random number is drawn, so the losses are those of a run
// without samples. The tp ranks of replica dp 0 take part (collective over tp); rank 0 prints.
void Trainer::write_sample(int64_t step) {
  Run& r = *run_;
  const std::string text = training_sample(*r.model, *r.tokenizer, 64, r.shape.tp > 1 ? r.mesh->tp() : nullptr,
                                           /*temperature=*/1.0, cfg_.seed + static_cast<uint64_t>(step + 1),
                                           r.shape.ep > 1 ? r.mesh->ep() : nullptr);
  r.log.write({{"type", "sample"}, {"step", step + 1}, {"text", text}});
  if (proc_.rank == 0) {
    std::printf("sample at step %lld:\n---\n%s\n---\n", static_cast<long long>(step + 1), text.c_str());
    std::fflush(stdout);
  }
}

// Every rank gathers, rank 0 writes (runtime/checkpoint/checkpoint.h). The others wait for rank 0 under
// --save-timeout, not --comm-timeout: in the save's collectives, and in the barrier after it,
// so that no rank enters the next step's collectives while rank 0 is still writing.
void Trainer::save_checkpoint(Loop& loop, int64_t step) {
  Run& r = *run_;
  const json run{{"config", cfg_.to_json()}, {"world", proc_.world_size}, {"dp", r.shape.dp}, {"data_sources", r.data_sources},
                 {"best", r.best.step > 0 ? json{{"step", r.best.step}, {"val_loss", r.best.val_loss}, {"evals_since", r.best.evals_since}}
                                          : json(nullptr)}};
  if (r.saver) {  // --async-save: the stall is a copy into host memory (runtime/checkpoint/async_save.h)
    // Rank 0 may still be writing the previous save: every rank waits for it here, under
    // --save-timeout, not in the next step's collectives under --comm-timeout.
    Watchdog::Window window(r.watchdog.get(), cfg_.save_timeout, "--save-timeout: rank 0 writes the checkpoint meanwhile");
    const auto t0 = Clock::now();
    AsyncSaver::Started s = r.saver->start(r.progress, run);
    if (r.host_world) r.host_world->barrier();
    s.waited_s = std::chrono::duration<double>(Clock::now() - t0).count() - s.snapshot_s;  // the previous write, on any rank
    loop.save_stalls[step + 1] = s;
    loop.last_save_s = std::max(loop.last_save_s, s.waited_s + s.snapshot_s);
    // Said only when there was a wait: rank 0's write (the last to finish) was still running.
    // Otherwise waited_s is the barrier's few milliseconds ("waited 0.00 s" at every save).
    if (s.write_running && proc_.rank == 0) {
      std::printf("kiln: step %lld's save waited %.2f s for the previous one's write (at most one in flight)\n",
                  static_cast<long long>(step + 1), s.waited_s);
      std::fflush(stdout);
    }
    return;
  }
  Watchdog::Window window(r.watchdog.get(), cfg_.save_timeout, "--save-timeout: rank 0 writes the checkpoint meanwhile");
  CheckpointIo io;
  const auto save_start = Clock::now();
  const std::string dir = r.checkpointer->save(*r.state, r.progress, run, &io);
  if (r.host_world) r.host_world->barrier();
  loop.last_save_s = std::chrono::duration<double>(Clock::now() - save_start).count();
  saved(loop, step + 1, dir, io, loop.last_save_s, 0.0, false);
}

// A save's record and console line (rank 0), once it is committed: `stall_s`, what the steps
// waited for it (the whole save when synchronous; the wait for the previous write and the copy
// into host memory when asynchronous); `seconds`, the write.
void Trainer::saved(Loop& loop, int64_t step, const std::string& dir, const CheckpointIo& io, double stall_s, double waited_s,
                    bool async) {
  Run& r = *run_;
  if (proc_.rank != 0) return;
  loop.last_saved = dir;
  json rec{{"type", "checkpoint"}, {"step", step}, {"dir", loop.last_saved}};
  rec.update(io.to_json());
  rec["stall_s"] = stall_s;
  rec["async"] = async;
  if (async) rec["waited_s"] = waited_s;
  r.log.write(rec);
  std::printf("kiln: saved %s (%.3f GB in %.2f s, %.2f GB/s; rank 0's peak extra host memory %.3f GB%s)\n", loop.last_saved.c_str(),
              io.bytes / 1e9, io.seconds, io.seconds > 0 ? io.bytes / io.seconds / 1e9 : 0.0, io.peak_extra_bytes / 1e9,
              async ? strprintf("; written in the background, the steps stalled %.3f s", stall_s).c_str() : "");
  std::fflush(stdout);
}

// --async-save: the record of a save whose write has completed (`wait`: block until it has).
// Throws what a failed write threw (rank 0): the job ends with its line, no earlier checkpoint lost.
void Trainer::collect_save(Loop& loop, bool wait) {
  Run& r = *run_;
  if (!r.saver) return;
  std::vector<AsyncSaver::Done> done;
  if (wait) {  // every rank past the write (under --save-timeout, as a synchronous save)
    Watchdog::Window window(r.watchdog.get(), cfg_.save_timeout, "--save-timeout: rank 0 writes the checkpoint meanwhile");
    done = r.saver->wait();
    if (r.host_world) r.host_world->barrier();
  } else {
    done = r.saver->poll();
  }
  for (const AsyncSaver::Done& d : done) {
    const AsyncSaver::Started s = loop.save_stalls[d.step];
    loop.save_stalls.erase(d.step);
    // --max-wall-time's estimate: the run's last save is waited for whole (copy and write)
    loop.last_save_s = s.snapshot_s + d.io.seconds;
    saved(loop, d.step, d.dir, d.io, s.waited_s + s.snapshot_s, s.waited_s, true);
  }
}

// A spike (runtime/trainer/spike_guard.h): steps k0 .. k1 (1-based; k1 = step + 1) spiked. Every rank
// reloads the newest checkpoint from before k0 in place, the data steps c+1 .. k1 consumed is skipped
// from then on, `latest` points at that checkpoint, and the loop goes on from step c + 1.
void Trainer::roll_back(Loop& loop, int64_t step, const SpikeGuard::Verdict& v) {
  Run& r = *run_;
  const auto& spike = r.spikes->spike();
  const int64_t k0 = spike.front().first, k1 = step + 1;
  collect_save(loop, /*wait=*/true);  // a save in flight is committed first (it may be the one to go back to)
  std::string losses;
  for (const auto& [k, l] : spike) losses += (losses.empty() ? "" : ", ") + strprintf("%.4f", l);
  const std::string why = strprintf("loss %s at steps %lld-%lld, above %.4f + %.3g x %.4f (the running mean and standard deviation)",
                                    losses.c_str(), static_cast<long long>(k0), static_cast<long long>(k1), v.mean,
                                    cfg_.spike_rollback, v.std);
  // A run that keeps spiking is not cured by skipping data (a learning rate too high, a bad
  // initialisation, a threshold inside the noise): after --max-rollbacks it ends (57 rollbacks of
  // a 60-step run once read 1,448 sample positions to train on 480).
  if (r.progress.rollbacks >= cfg_.max_rollbacks) {
    throw NumericsError("step " + std::to_string(k1) + ": a loss spike (" + why + ") after " + std::to_string(r.progress.rollbacks) +
                        " rollback(s) already (--max-rollbacks " + std::to_string(cfg_.max_rollbacks) +
                        "): the loss keeps spiking, which skipping data does not cure; lower --lr, raise --spike-rollback above " +
                        strprintf("%g", cfg_.spike_rollback) + " or --max-rollbacks");
  }
  const std::string dir = r.host_world ? broadcast_string(*r.host_world, r.checkpointer->newest_before(k0))
                                       : r.checkpointer->newest_before(k0);
  if (dir.empty()) {
    throw NumericsError("step " + std::to_string(k1) + ": a loss spike (" + why + ") and no checkpoint from before step " +
                        std::to_string(k0) + " in " + cfg_.save_dir + " to roll back to (--spike-rollback; save more often with --save-every)");
  }
  // The data steps c+1 .. k1 consumed, as stream positions (the loader's own numbering).
  r.prefetch.reset();  // it reads the loader; made again below
  const int64_t consumed_end = r.loader->samples_before(k1);
  std::optional<Resumed> back;
  {
    Watchdog::Window window(r.watchdog.get(), cfg_.save_timeout, "--save-timeout: rank 0 reads the checkpoint meanwhile");
    back = resume_training(dir, "", *r.state, r.host_world.get());
  }
  const int64_t c = back->progress.step;
  const std::vector<std::pair<int64_t, int64_t>> window = r.loader->stream_ranges(back->progress.samples, consumed_end);
  const auto skipped = r.loader->with_skipped(window);
  const int64_t rollbacks = r.progress.rollbacks + 1;
  r.progress = back->progress;
  r.progress.skipped_samples = skipped;
  r.progress.rollbacks = rollbacks;
  if (!r.progress.loss_scaler.empty()) r.scaler->load_state(r.progress.loss_scaler);
  r.loader->resume_at(r.progress.step, r.progress.samples);
  r.loader->skip(skipped);
  r.prefetch = std::make_unique<BatchPrefetcher>(*r.loader, cfg_.grad_accum, pin_for(r.dev.device), loop.end_step);
  r.checkpointer->point_latest(c);
  r.spikes->rewind(c);
  r.skipped_in_a_row = 0;
  r.chain_broken = true;
  loop.rollback_to = c;
  ++loop.rollbacks;
  json ranges = json::array();
  for (const auto& [a, b] : window) ranges.push_back({a, b});
  r.log.write({{"type", "rollback"}, {"step", k1}, {"spike_steps", {k0, k1}}, {"reason", why}, {"checkpoint", dir},
               {"to_step", c}, {"skipped_samples", ranges}, {"mean", v.mean}, {"std", v.std}});
  if (proc_.rank == 0) {
    std::string list;
    for (const auto& [a, b] : window) list += (list.empty() ? "" : ", ") + std::to_string(a) + "-" + std::to_string(b - 1);
    std::printf("kiln: rollback after step %lld: %s; reloaded %s, skipping the data of steps %lld-%lld (stream positions %s); "
                "going on from step %lld\n",
                static_cast<long long>(k1), why.c_str(), dir.c_str(), static_cast<long long>(c + 1), static_cast<long long>(k1),
                list.c_str(), static_cast<long long>(c + 1));
    std::fflush(stdout);
  }
}

// Pipeline: the log's step records are stage 0's (rank 0's); the summary adds every stage's
// figures (its dp 0, tp 0 rank), gathered once at the end so no step's traffic includes them.
json Trainer::pipeline_stages(int64_t last_comm_bytes) {
  Run& r = *run_;
  const ModelStateBytes st = r.model_state();
  const MeshCoord c = r.mesh->coord();
  const std::vector<int64_t> mine{c.pp, c.dp, c.tp, last_comm_bytes, r.model->num_params(),
                                  st.device.params, st.device.grads, st.device.optimizer,
                                  st.host.params, st.host.grads, st.host.optimizer, st.device.cast_copies};
  const int64_t n = static_cast<int64_t>(mine.size());
  at::Tensor row = at::tensor(mine, at::kLong), all = at::empty({proc_.world_size * n}, at::kLong);
  r.host_world->all_gather(all, row)->wait();
  json stages = json::array();
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
  return stages;
}

// The summary record (and console lines) of a run that ended or stopped.
json Trainer::finish_run(Loop& loop) {
  Run& r = *run_;
  const c10::Device device = r.dev.device;
  const bool rank0 = proc_.rank == 0;
  double tail = NAN;
  if (!loop.losses.empty()) {
    const size_t k = std::min<size_t>(10, loop.losses.size());
    tail = 0.0;
    for (size_t i = loop.losses.size() - k; i < loop.losses.size(); ++i) tail += loop.losses[i];
    tail /= static_cast<double>(k);
  }
  // A fingerprint of the final weights, for comparing runs (parity tests): sum and sum of squares.
  const auto [param_sum, param_sq] = weights_fingerprint(*r.model, r.zero.get(), r.optimizer.get(), r.mesh.get(), device);
  const json stages = r.pipe ? pipeline_stages(loop.last_comm_bytes) : json(nullptr);
  const std::vector<Straggler> stragglers = r.stragglers->finish();  // collective: every rank
  const double mean_tps = loop.timed_steps > 0 ? loop.tokens_per_s_sum / static_cast<double>(loop.timed_steps) : NAN;
  const double mean_tflops_job = mean_tps * r.flops_per_token / 1e12;
  // Energy of the job (every device) over the timed steps: average watts, joules per token,
  // model TFLOP/s per watt.
  const bool have_energy = loop.energy_ok && loop.timed_steps > 0 && loop.timed_joules > 0.0;
  const double timed_tokens = static_cast<double>(r.tokens_per_step * loop.timed_steps);
  json summary{{"type", "summary"},
               {"steps", cfg_.steps},
               {"start_step", loop.first_step},
               {"end_step", r.progress.step},  // the last step this invocation ran (start_step: none)
               {"updates", r.progress.updates},  // the whole run's, a resumed checkpoint's included
               {"skipped_steps", loop.skipped_steps},
               {"final_loss", json_num(loop.last_loss)},
               {"mean_loss_last10", json_num(tail)},
               {"val_loss", json_num(loop.last_eval)},
               {"mean_tokens_per_s", json_num(mean_tps)},
               {"mean_tflops", json_num(mean_tflops_job / loop.devices)},
               {"mean_tflops_job", json_num(mean_tflops_job)},
               {"mean_mfu", r.peak ? json_num(mean_tflops_job / (loop.devices * *r.peak)) : json(nullptr)},
               {"peak_mem_gb", peak_memory_bytes(device) / 1e9},
               {"mean_watts", have_energy ? json(loop.timed_joules / loop.timed_seconds) : json(nullptr)},
               {"joules_per_token", have_energy ? json(loop.timed_joules / timed_tokens) : json(nullptr)},
               {"tflops_per_watt", have_energy ? json(timed_tokens * r.flops_per_token / 1e12 / loop.timed_joules) : json(nullptr)},
               {"param_sum", param_sum},
               {"param_sq", param_sq},
               {"loss_scale", r.scaler->scale()},
               {"checkpoint", loop.last_saved.empty() ? json(nullptr) : json(loop.last_saved)},
               {"wall_s", std::chrono::duration<double>(Clock::now() - loop.start).count()}};
  if (r.pipe) summary["pipeline_stages"] = stages;
  json slow = json::array();
  for (const Straggler& s : stragglers) {
    slow.push_back({{"rank", s.rank}, {"stage", s.stage}, {"median_compute_ms", s.median_ms}, {"stage_median_compute_ms", s.stage_median_ms}});
    if (rank0) {
      std::printf("kiln: straggler: rank %d (pipeline stage %d) computed %.1f ms a step (median), %.2fx its stage's median %.1f ms "
                  "(--straggler-factor %.2f)\n",
                  s.rank, s.stage, s.median_ms, s.median_ms / s.stage_median_ms, s.stage_median_ms, cfg_.straggler_factor);
    }
  }
  summary["stragglers"] = slow;
  // Spike rollbacks: this invocation's, and the stream positions the run skipped (resumes included).
  int64_t skipped_samples = 0;
  for (const auto& [a, b] : r.progress.skipped_samples) skipped_samples += b - a;
  summary["rollbacks"] = loop.rollbacks;
  summary["skipped_samples"] = skipped_samples;
  summary["stopped"] = loop.stop_reason.empty() ? json(nullptr) : json(loop.stop_reason);
  if (r.best.step > 0) summary["best"] = {{"step", r.best.step}, {"val_loss", r.best.val_loss}};
  if (loop.early_stopped_at > 0) {
    summary["early_stopped"] = loop.early_stopped_at;
    if (rank0) {
      char best_dir[32];
      std::snprintf(best_dir, sizeof(best_dir), "step_%08lld", static_cast<long long>(r.best.step));
      std::printf("kiln: early stop after step %lld: no val loss below %.4f (step %lld) in %lld evaluations (--early-stop)%s\n",
                  static_cast<long long>(loop.early_stopped_at), r.best.val_loss, static_cast<long long>(r.best.step),
                  static_cast<long long>(r.best.evals_since),
                  cfg_.keep_best ? (", best checkpoint " + cfg_.save_dir + "/" + best_dir + " (named in " + cfg_.save_dir + "/best)").c_str() : "");
      std::fflush(stdout);
    }
  }
  if (rank0 && !loop.stop_reason.empty()) {
    if (loop.last_saved.empty()) {
      std::printf("kiln: interrupted at step %lld (%s); nothing saved (no --save-dir): exit %d, not %d -- there is nothing to "
                  "resume, a rerun starts again from step 0\n",
                  static_cast<long long>(loop.stopped_at), loop.stop_reason.c_str(), kExitStoppedUnsaved, kExitStopped);
    } else {
      std::printf("kiln: interrupted at step %lld (%s), saved %s\n", static_cast<long long>(loop.stopped_at),
                  loop.stop_reason.c_str(), loop.last_saved.c_str());
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
