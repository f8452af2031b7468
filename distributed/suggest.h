// distributed/suggest.h -- "did you mean" for a near-miss name (a flag, a model preset, a command).
#pragma once

#include <string>
#include <vector>

namespace kiln {

// " (did you mean 'X'?)" for the choice closest to `given` (Levenshtein distance at most 2, or a
// choice that `given` is a prefix of), "" when none is close.
std::string did_you_mean(const std::string& given, const std::vector<std::string>& choices);

}  // namespace kiln
