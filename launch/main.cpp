// launch/main.cpp -- the `kiln` executable: subcommand dispatch and the one place that turns
// errors into exit codes.
//
//   kiln train [flags]   train a GPT (see `kiln train --help`)
//   kiln prep  [flags]   text files -> token shards
// Every kiln::Error becomes one line "kiln: error: ..." on stderr and its exit code; anything
// else escaping is a bug, reported the same way with exit code 70.
#include <cstdio>
#include <string>
#include <vector>

#include <c10/util/Exception.h>

#include "data/prep.h"
#include "launch/cli.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/trainer.h"

namespace {

const char* kUsage =
    "usage: kiln <command> [flags]\n"
    "commands:\n"
    "  train   train a GPT model (kiln train --help)\n"
    "  prep    turn text files into token shards (kiln prep --help)\n"
    "  version print the version\n";

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
    auto args = kiln::parse_train_args(rest);
    if (args.help) {
      std::fputs(args.help_text.c_str(), stdout);
      return 0;
    }
    kiln::Trainer(args.config, proc).run();
    return 0;
  }
  if (cmd == "prep") {
    auto args = kiln::parse_prep_args(rest);
    if (args.help) {
      std::fputs(args.help_text.c_str(), stdout);
      return 0;
    }
    auto result = kiln::run_prep(args.config);
    std::printf("kiln prep: %lld tokens in %zu files\n", static_cast<long long>(result.total_tokens),
                result.files.size());
    for (const auto& f : result.files) std::printf("  %s\n", f.c_str());
    return 0;
  }
  throw kiln::ConfigError("unknown command '" + cmd + "' (commands: train, prep, version)");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    kiln::Environment env(&argc, &argv);  // MPI under mpirun; a world of one without it
    std::vector<std::string> args(argv + 1, argv + argc);
    return run(args, env.info());
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "kiln: error: %s\n", e.what());
    return e.exit_code();
  } catch (const c10::Error& e) {
    // LibTorch's messages carry a C++ backtrace; the first line is the useful one.
    std::string msg = e.what_without_backtrace();
    std::fprintf(stderr, "kiln: error: %s\n", msg.substr(0, msg.find('\n')).c_str());
    return 70;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln: error: %s\n", e.what());
    return 70;
  }
}
