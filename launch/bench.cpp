// launch/bench.cpp -- flags, one measured run, the sweep, the table.
#include "launch/bench.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include <c10/util/Exception.h>

#include "distributed/device.h"
#include "distributed/error.h"
#include "launch/cli.h"
#include "runtime/trainer/trainer.h"

namespace kiln {

namespace {

using json = nlohmann::json;

const char* kBenchHelp =
    "usage: kiln bench [bench flags] [kiln train flags]\n"
    "Measures a training configuration on synthetic data (see kiln train --help for the rest).\n"
    "  --warmup N           steps run before measuring (default 3)\n"
    "  --measure N          steps measured (default 10)\n"
    "  --sweep              try micro-batch 1, 2, 4, ... under each activation-checkpointing mode;\n"
    "                       pick the fastest that fits (a world of one)\n"
    "  --max-micro-batch N  largest micro-batch the sweep tries (default 64)\n"
    "  --json FILE          write the report as JSON\n"
    "  --profile FILE       (a train flag) trace the measured steps and print their top costs; the\n"
    "                       figures of a profiled run include the profiler's own cost\n";

int64_t positive(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0') throw ConfigError("kiln bench: " + flag + ": '" + v + "' is not an integer");
  if (n < 1) throw ConfigError("kiln bench: " + flag + " must be at least 1 (got " + v + ")");
  return n;
}

// JSON has no inf or NaN.
json num(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

// One run: warmup + measure steps of `t`; the figures over the measured steps (rank 0).
json measure(TrainConfig t, const BenchConfig& b, const ProcessInfo& proc, int index) {
  t.steps = b.warmup + b.measure;
  t.stop_at_step = 0;
  t.data.clear();
  t.val_data.clear();
  t.save_dir.clear();
  t.resume = "none";
  t.log_every = t.steps;
  if (!t.profile.empty()) {  // the measured steps (their figures then include the profiler's cost)
    t.profile_start = b.warmup + 1;
    t.profile_steps = b.measure;
  }
  t.log_json = proc.rank == 0 ? "/tmp/kiln-bench-" + std::to_string(getpid()) + "-" + std::to_string(index) + ".jsonl" : "";
  t.validate();
  Trainer(t, proc).run();
  if (proc.rank != 0) return json();

  std::ifstream in(t.log_json);
  std::vector<json> records;
  for (std::string line; std::getline(in, line);) records.push_back(json::parse(line));
  std::remove(t.log_json.c_str());
  const json& config = records.front();
  double seconds = 0, tokens = 0, joules = 0, mem_gb = 0;
  double phase[4] = {0, 0, 0, 0};
  const char* phase_key[4] = {"forward_ms", "backward_ms", "exposed_comm_ms", "optimizer_ms"};
  bool energy = true;
  int64_t n = 0;
  for (const auto& r : records) {
    if (r["type"] != "step" || r["step"].get<int64_t>() <= b.warmup) continue;
    ++n;
    seconds += r["step_ms"].get<double>() / 1e3;
    tokens += r["tokens"].get<double>();
    mem_gb = std::max(mem_gb, r["mem_gb"].get<double>());
    for (int k = 0; k < 4; ++k) phase[k] += r[phase_key[k]].get<double>();
    if (r["energy_j"].is_null()) energy = false;
    else joules += r["energy_j"].get<double>();
  }
  // The job's figures and per device (distributed/job_devices.h): mfu = tflops_job / (G x peak).
  const double tps = tokens / seconds;
  const double flops_per_token = config["flops_per_token"].get<double>();
  const double devices = config["devices"].get<double>();
  const double tflops_job = tps * flops_per_token / 1e12;
  json out{{"model", t.model},
           {"params", config["params"]},
           {"precision", t.precision},
           {"kernels", config.value("kernels", std::string("reference"))},  // what ran (kernels/kernel_choice.h)
           {"float8_layers", config.value("float8_layers", json(nullptr))},  // --precision fp8: {float8, of}
           {"micro_batch", t.micro_batch},
           {"grad_accum", t.grad_accum},
           {"activation_checkpointing", t.activation_checkpointing},
           {"zero", t.zero},
           {"offload", t.offload},
           {"world", config["world"]},
           {"device", config["device"]},
           {"devices", config["devices"]},
           {"measured_steps", n},
           {"tokens_per_s", num(tps)},
           {"tflops", num(tflops_job / devices)},
           {"tflops_job", num(tflops_job)},
           {"mfu", config["peak_tflops"].is_null() ? json(nullptr)
                                                   : num(tflops_job / (devices * config["peak_tflops"].get<double>()))},
           {"peak_mem_gb", mem_gb},
           {"model_state", config["model_state"]},
           {"fits", true}};
  for (int k = 0; k < 4; ++k) out[phase_key[k]] = phase[k] / static_cast<double>(n);
  out["step_ms"] = seconds * 1e3 / static_cast<double>(n);
  // The step records' energy is the job's (every device's, summed by the trainer).
  out["watts"] = energy && joules > 0 ? num(joules / seconds) : json(nullptr);
  out["joules_per_token"] = energy && joules > 0 ? num(joules / tokens) : json(nullptr);
  out["tflops_per_watt"] = energy && joules > 0 ? num(tokens * flops_per_token / 1e12 / joules) : json(nullptr);
  return out;
}

std::string cell(const json& v, const char* fmt, double scale = 1.0) {
  if (v.is_null()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, fmt, v.get<double>() * scale);
  return buf;
}

void print_table(const std::vector<json>& runs, const json* best) {
  // TFLOP/s per device, then the job's; W and J/token: the job's (every device).
  std::printf("\n%5s %-9s %10s %8s %8s %6s %7s %7s %7s %7s %7s %6s %8s %9s\n", "micro", "ac", "tokens/s", "TFLOP/s",
              "job TF/s", "MFU", "mem GB", "fwd ms", "bwd ms", "comm ms", "opt ms", "W", "J/token", "TFLOP/s/W");
  for (const auto& r : runs) {
    if (!r["fits"].get<bool>()) {
      std::printf("%5lld %-9s %10s\n", static_cast<long long>(r["micro_batch"].get<int64_t>()),
                  r["activation_checkpointing"].get<std::string>().c_str(), "out of memory");
      continue;
    }
    std::printf("%5lld %-9s %10s %8s %8s %6s %7s %7s %7s %7s %7s %6s %8s %9s%s\n",
                static_cast<long long>(r["micro_batch"].get<int64_t>()), r["activation_checkpointing"].get<std::string>().c_str(),
                cell(r["tokens_per_s"], "%.0f").c_str(), cell(r["tflops"], "%.2f").c_str(),
                cell(r["tflops_job"], "%.2f").c_str(), cell(r["mfu"], "%.1f%%", 100).c_str(),
                cell(r["peak_mem_gb"], "%.2f").c_str(), cell(r["forward_ms"], "%.1f").c_str(), cell(r["backward_ms"], "%.1f").c_str(),
                cell(r["exposed_comm_ms"], "%.1f").c_str(), cell(r["optimizer_ms"], "%.1f").c_str(), cell(r["watts"], "%.0f").c_str(),
                cell(r["joules_per_token"], "%.4f").c_str(), cell(r["tflops_per_watt"], "%.3f").c_str(),
                &r == best ? "  <- best" : "");
  }
  std::fflush(stdout);
}

}  // namespace

BenchArgs parse_bench_args(const std::vector<std::string>& args) {
  BenchArgs out;
  std::vector<std::string> train;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i], value;
    const bool has_eq = a.rfind("--", 0) == 0 && a.find('=') != std::string::npos;
    if (has_eq) {
      value = a.substr(a.find('=') + 1);
      a = a.substr(0, a.find('='));
    }
    auto take = [&]() -> std::string {
      if (has_eq) return value;
      if (i + 1 >= args.size()) throw ConfigError("kiln bench: " + a + " needs a value");
      return args[++i];
    };
    if (a == "-h" || a == "--help") {
      out.help = true;
      out.help_text = kBenchHelp;
      return out;
    }
    if (a == "--measure") out.config.measure = positive(a, take());
    else if (a == "--warmup") out.config.warmup = positive(a, take());
    else if (a == "--max-micro-batch") out.config.max_micro_batch = positive(a, take());
    else if (a == "--json") out.config.json_path = take();
    else if (a == "--sweep") out.config.sweep = true;
    else train.push_back(args[i]);
  }
  out.config.train = parse_train_args(train).config;
  return out;
}

json run_bench(const BenchConfig& cfg, const ProcessInfo& proc) {
  if (cfg.sweep && proc.world_size > 1) {
    throw ConfigError("kiln bench: --sweep runs in a world of one (an out-of-memory on one rank would leave the others waiting)");
  }
  if (cfg.sweep && !cfg.train.profile.empty()) {
    throw ConfigError("kiln bench: --profile records one run's measured steps, not a --sweep's (give the micro-batch)");
  }
  std::vector<json> runs;
  int index = 0;
  if (!cfg.sweep) {
    runs.push_back(measure(cfg.train, cfg, proc, index++));
  } else {
    const c10::Device device = select_device(cfg.train.device).device;
    for (const char* ac : {"none", "selective", "full"}) {
      for (int64_t mb = 1; mb <= cfg.max_micro_batch; mb *= 2) {
        TrainConfig t = cfg.train;
        t.activation_checkpointing = ac;
        t.micro_batch = mb;
        try {
          runs.push_back(measure(t, cfg, proc, index++));
        } catch (const c10::OutOfMemoryError&) {
          release_cached_memory(device);
          runs.push_back(json{{"micro_batch", mb}, {"activation_checkpointing", ac}, {"fits", false}});
          break;  // larger micro-batches will not fit either
        }
      }
    }
  }
  if (proc.rank != 0) return json();

  const json* best = nullptr;
  for (const auto& r : runs) {
    if (!r["fits"].get<bool>() || r["tokens_per_s"].is_null()) continue;
    if (!best || r["tokens_per_s"].get<double>() > (*best)["tokens_per_s"].get<double>()) best = &r;
  }
  const json& first = runs.front();
  std::printf("\nkiln bench: %s, %s, %s kernels, %lld rank(s), %lld measured steps after %lld warm-up, on %s x %lld\n",
              cfg.train.model.c_str(), cfg.train.precision.c_str(),
              first.contains("kernels") ? first["kernels"].get<std::string>().c_str() : "?",
              static_cast<long long>(proc.world_size),
              static_cast<long long>(cfg.measure), static_cast<long long>(cfg.warmup),
              first.contains("device") ? first["device"].get<std::string>().c_str() : "?",
              first.contains("devices") ? static_cast<long long>(first["devices"].get<int64_t>()) : 0LL);
  print_table(runs, best);
  if (best && cfg.sweep) {
    std::printf("best: micro-batch %lld with activation checkpointing %s, %.0f tokens/s\n",
                static_cast<long long>((*best)["micro_batch"].get<int64_t>()),
                (*best)["activation_checkpointing"].get<std::string>().c_str(), (*best)["tokens_per_s"].get<double>());
  }
  json report{{"type", "bench"}, {"warmup", cfg.warmup}, {"measure", cfg.measure}, {"sweep", cfg.sweep},
              {"runs", runs}, {"best", best ? *best : json(nullptr)}};
  if (!cfg.json_path.empty()) {
    std::ofstream out(cfg.json_path);
    if (!out) throw ConfigError("kiln bench: --json " + cfg.json_path + ": cannot open for writing");
    out << report.dump(2) << "\n";
  }
  return report;
}

}  // namespace kiln
