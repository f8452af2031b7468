// launch/flags.h -- cxxopts parsing shared by the subcommands (train, eval, prep, sample, plan):
// unknown options are collected rather than thrown, so the message is kiln's one line.
#pragma once

#include <string>
#include <vector>

#include <cxxopts.hpp>

namespace kiln {

// Parses `args` (the arguments after the subcommand `command`). Throws ConfigError with one line:
// "unknown flag '--x' (did you mean '--y'?) (see kiln COMMAND --help)", or "kiln COMMAND:
// unexpected argument 'a' (HINT)" for a stray positional argument, or cxxopts' own complaint.
cxxopts::ParseResult parse_or_throw(cxxopts::Options& opts, const std::vector<std::string>& args, const std::string& command,
                                    const std::string& positional_hint);

}  // namespace kiln
