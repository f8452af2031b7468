// launch/flags.h -- cxxopts parsing shared by the subcommands (train, eval, prep, sample, plan):
// unknown options are collected rather than thrown, so the message is kiln's one line.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <cxxopts.hpp>

namespace kiln {

// Parses `args` (the arguments after the subcommand `command`). Throws ConfigError with one line:
// "unknown flag '--x' (did you mean '--y'?) (see kiln COMMAND --help)" -- every unknown flag in
// that line, "2 unknown flags: '--x' (...), '--z' (see ...)" -- or "kiln COMMAND: unexpected
// argument 'a' (HINT)" for a stray positional argument, or cxxopts' own complaint. `aliases`:
// other tools' names for the flags ("--learning-rate" -> "--lr"), suggested before edit distance.
cxxopts::ParseResult parse_or_throw(cxxopts::Options& opts, const std::vector<std::string>& args, const std::string& command,
                                    const std::string& positional_hint, const std::map<std::string, std::string>& aliases = {});

}  // namespace kiln
