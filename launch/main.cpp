// launch/main.cpp -- the `kiln` executable: subcommand dispatch and the one place that turns
// errors into exit codes.
//
//   kiln train [flags]   train a GPT (see `kiln train --help`)
//   kiln eval  --checkpoint DIR [flags]   validation loss and perplexity of a checkpoint
//   kiln sample --checkpoint DIR --prompt TEXT [flags]   text from a checkpoint (launch/sample_cli.h)
//   kiln prep  [flags]   text files -> token shards
//   kiln bench [flags]   measure a training configuration (throughput, MFU, memory, energy)
//   kiln plan  [flags]   memory, communication, time and energy of a layout (no training)
//   kiln report LOGS --out PNG   plots runs from their JSONL logs (tools/report.py, matplotlib)
// Every kiln::Error becomes one line "kiln: error: ..." on stderr and its exit code; anything
// else escaping is a bug, reported the same way with exit code 70. Under mpirun an error every
// rank finds alike ends the job cleanly with one line; any other failing rank takes the whole job
// down with it (MPI_Abort) rather than leave its peers waiting.
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <memory>
#include <string>
#include <vector>

#include <c10/util/Exception.h>
#include <mpi.h>
#include <unistd.h>

#include "data/prep.h"
#include "distributed/cuda_backend.h"
#include "distributed/env.h"
#include "distributed/error.h"
#include "distributed/python_tool.h"
#include "distributed/suggest.h"
#include "launch/bench.h"
#include "launch/cli.h"
#include "launch/deepspeed_config.h"
#include "launch/plan_cli.h"
#include "launch/sample_cli.h"
#include "runtime/trainer/stop_requests.h"
#include "runtime/trainer/trainer.h"

namespace {

const char* kUsage =
    "usage: kiln <command> [flags]\n"
    "commands:\n"
    "  train   train a GPT model (kiln train --help)\n"
    "  eval    validation loss and perplexity of a checkpoint, on any layout (kiln eval --help)\n"
    "  sample  text from a checkpoint: kiln sample --checkpoint DIR --prompt TEXT (kiln sample --help)\n"
    "  prep    turn text files into token shards (kiln prep --help)\n"
    "  bench   measure a training configuration on synthetic data (kiln bench --help)\n"
    "  plan    predict memory, communication, step time and energy; search layouts;\n"
    "          compare with a run's log (kiln plan --help)\n"
    "  report  plot runs from their --log-json files: kiln report RUN.jsonl [MORE.jsonl] --out report.png\n"
    "  version print the version\n";

// `kiln report`: the plotting is Python's (matplotlib); this process becomes
// `KILN_PYTHON tools/report.py ARGS...`, which reports its own errors (one line, exit 2).
int report(const std::vector<std::string>& args) {
  kiln::exec_python_tool("report.py", args, "kiln report needs Python with matplotlib");
}

int run(const std::vector<std::string>& argv, const kiln::ProcessInfo& proc) {
  if (argv.empty() || argv[0] == "-h" || argv[0] == "--help" || argv[0] == "help") {
    std::fputs(kUsage, argv.empty() ? stderr : stdout);
    return argv.empty() ? 2 : 0;
  }
  const std::string& cmd = argv[0];
  const std::vector<std::string> rest(argv.begin() + 1, argv.end());
  if (cmd == "version" || cmd == "--version") {
    std::printf("kiln %s\n", KILN_VERSION);
    return 0;
  }
  if (cmd == "train") {
    auto args = kiln::parse_train_args(rest, proc.world_size);
    if (args.help) {
      std::fputs(args.help_text.c_str(), stdout);
      return 0;
    }
    if (proc.rank == 0 && !args.config.deepspeed.empty()) {
      for (const auto& line : kiln::deepspeed_console_lines(args.config.deepspeed_used)) std::printf("kiln: deepspeed: %s\n", line.c_str());
    }
    const auto summary = kiln::Trainer(args.config, proc).run();
    // A run that trained and saved nothing (no --save-dir, the default: a default directory would
    // make the next `kiln train` resume this one, or be refused by its lock): where to keep it.
    const bool trained = summary.value("end_step", int64_t{0}) > summary.value("start_step", int64_t{0});
    if (proc.rank == 0 && trained && args.config.save_dir.empty() && summary.value("stopped", nlohmann::json()).is_null()) {
      std::printf("kiln: nothing saved: give --save-dir DIR to keep the model (then: kiln sample --checkpoint DIR --prompt TEXT)\n");
      std::fflush(stdout);
    }
    // Stopped on request (a signal, --max-wall-time): saved, and to be resumed (75) -- or, with
    // no --save-dir, nothing to resume (every rank knows it; the checkpoint path is rank 0's).
    if (summary.value("stopped", nlohmann::json()).is_null()) return 0;
    return args.config.save_dir.empty() ? kiln::kExitStoppedUnsaved : kiln::kExitStopped;
  }
  if (cmd == "bench") {
    auto args = kiln::parse_bench_args(rest);
    if (args.help) {
      std::fputs(args.help_text.c_str(), stdout);
      return 0;
    }
    kiln::run_bench(args.config, proc);
    return 0;
  }
  if (cmd == "prep") {
    auto args = kiln::parse_prep_args(rest);
    if (args.help) {
      std::fputs(args.help_text.c_str(), stdout);
      return 0;
    }
    auto result = kiln::run_prep(args.config);
    std::printf("kiln prep: %lld tokens from %lld document(s) in %lld input file(s) into %zu shard(s)\n",
                static_cast<long long>(result.total_tokens), static_cast<long long>(result.documents),
                static_cast<long long>(result.input_files), result.files.size());
    for (const auto& f : result.files) std::printf("  %s\n", f.c_str());
    std::printf("kiln prep: tokenizer %s (%lld ids, end-of-text %lld) in %s: a model needs --vocab-size %lld or more "
                "(kiln train takes it from there when --vocab-size is left out)\n",
                result.tokenizer.c_str(), static_cast<long long>(result.vocab_size), static_cast<long long>(result.eot),
                result.tokenizer_file.c_str(), static_cast<long long>(result.vocab_size));
    if (result.trained_tokens >= 0) {
      std::printf("kiln prep: chat: %lld of the %lld tokens are trained on (the assistant's turns; a mask beside every shard), "
                  "the chat template in %s\n",
                  static_cast<long long>(result.trained_tokens), static_cast<long long>(result.total_tokens),
                  result.chat_template_file.c_str());
    }
    if (args.config.val_tokens == 0) {
      std::printf("kiln prep: no validation shard (--val-tokens 0, the default): give --val-tokens N for val_000000.bin, "
                  "which --val-data reads\n");
    }
    return 0;
  }
  if (cmd == "plan") {
    auto args = kiln::parse_plan_args(rest);
    if (args.help) {
      std::fputs(args.help_text.c_str(), stdout);
      return 0;
    }
    return kiln::run_plan(args);
  }
  if (cmd == "report") return report(rest);
  if (cmd == "eval") {
    auto args = kiln::parse_eval_args(rest);
    if (args.help) {
      std::fputs(args.help_text.c_str(), stdout);
      return 0;
    }
    kiln::Trainer(args.config, proc).evaluate_checkpoint();
    return 0;
  }
  if (cmd == "sample") {
    auto args = kiln::parse_sample_args(rest);
    if (args.help) {
      std::fputs(args.help_text.c_str(), stdout);
      return 0;
    }
    return kiln::run_sample(args, proc);
  }
  throw kiln::ConfigError("unknown command '" + cmd + "'" +
                          kiln::did_you_mean(cmd, {"train", "eval", "sample", "prep", "bench", "plan", "report", "version"}) +
                          " (commands: train, eval, sample, prep, bench, plan, report, version)");
}

// Reports a failure: one line on stderr, then the exit code. In a multi-rank job a configuration
// or data error is usually found by every rank alike, before any of them waits on another: then
// every rank arrives at Environment::all_ranks_failing, rank 0 alone prints the line, and every
// rank finalises MPI and exits with the code (no MPI_Abort banner). Otherwise -- one rank failed
// while the others are elsewhere, or any other error -- the failing rank names itself and aborts
// the whole job (MPI_Abort), so no peer is left waiting for it in a collective.
int fail(kiln::Environment* env, const std::string& message, int code, bool found_by_every_rank) {
  const bool multi = env != nullptr && env->info().world_size > 1;
  if (!multi) {
    std::fprintf(stderr, "kiln: error: %s\n", message.c_str());
    return code;
  }
  const int rank = env->info().rank;
  if (found_by_every_rank && env->all_ranks_failing(/*seconds=*/10.0)) {
    if (rank == 0) std::fprintf(stderr, "kiln: error: %s\n", message.c_str());
    std::fflush(stderr);
    return code;  // ~Environment finalises MPI on every rank
  }
  const std::string me = "rank " + std::to_string(rank) + ": ";
  std::fprintf(stderr, "kiln: error: %s%s\n", message.rfind(me, 0) == 0 ? "" : me.c_str(), message.c_str());
  std::fflush(stderr);
  kiln::abort_job(code);  // MPI_Abort, and this process ends within a grace period whatever it does
}

}  // namespace

int main(int argc, char** argv) {
  // MKL (LibTorch's CPU BLAS) may use fewer threads than it was given when the machine is busy
  // (MKL_DYNAMIC, on by default), and a matrix product split another way rounds another way: a
  // resumed CPU run would then not replay the uninterrupted one bit for bit, nor two layouts
  // agree. Off, unless the user set it; read by MKL at its first call, so before anything else.
  setenv("MKL_DYNAMIC", "FALSE", /*overwrite=*/0);
  std::unique_ptr<kiln::Environment> env;
  try {
    env = std::make_unique<kiln::Environment>(&argc, &argv);  // MPI under mpirun; a world of one without it
    std::vector<std::string> args(argv + 1, argv + argc);
    // LibTorch's CUDA half before anything of LibTorch's runs, for a command that may use a GPU
    // (distributed/cuda_backend.h: a CPU run never loads it, 0.15 s of each start-up).
    if (kiln::command_may_use_cuda(args)) kiln::load_cuda_backend();
    return run(args, env->info());
  } catch (const kiln::ConfigError& e) {
    return fail(env.get(), e.what(), e.exit_code(), /*found_by_every_rank=*/true);
  } catch (const kiln::DataError& e) {
    return fail(env.get(), e.what(), e.exit_code(), /*found_by_every_rank=*/true);
  } catch (const kiln::NumericsError& e) {  // decided by the step's verdict, the same on every rank
    return fail(env.get(), e.what(), e.exit_code(), /*found_by_every_rank=*/true);
  } catch (const kiln::Error& e) {
    return fail(env.get(), e.what(), e.exit_code(), false);
  } catch (const c10::Error& e) {
    // LibTorch's messages carry a C++ backtrace; the first line is the useful one.
    std::string msg = e.what_without_backtrace();
    return fail(env.get(), msg.substr(0, msg.find('\n')), 70, false);
  } catch (const std::exception& e) {
    return fail(env.get(), e.what(), 70, false);
  }
}
