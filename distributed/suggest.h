// distributed/suggest.h -- "did you mean" for a near-miss name (a flag, a model preset, a command).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

// " (did you mean 'X'?)" for the choice closest to `given` (Levenshtein distance at most 2, or a
// choice that `given` is a prefix of), "" when none is close.
std::string did_you_mean(const std::string& given, const std::vector<std::string>& choices);

// The same, but a name `aliases` holds -- another tool's name for a setting (the Hugging Face
// Trainer's learning_rate, nanoGPT's max_iters) mapped to this one's -- is answered from it first:
// no edit distance finds 'lr' from 'learning_rate'.
std::string did_you_mean(const std::string& given, const std::vector<std::string>& choices,
                         const std::map<std::string, std::string>& aliases);

// One message for every unknown name at once (a file's typos were reported one per run):
// `one` + " 'x' (did you mean 'y'?)" for one, "N " + `many` + ": 'x' (...), 'z'" for more;
// `unknown` holds each name with its did_you_mean suffix ("" for none).
std::string unknown_names(const std::string& one, const std::string& many,
                          const std::vector<std::pair<std::string, std::string>>& unknown);

}  // namespace kiln
