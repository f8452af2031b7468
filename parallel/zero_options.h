// parallel/zero_options.h -- ZeRO's option values, shared by the engine (parallel/zero.h) and the
// cost model (plan/cost_model.h). Torch-free, so kiln_plan builds without LibTorch.
#pragma once

#include <string>

namespace kiln {

enum class Offload { None, Optimizer, All };  // --offload
enum class ZeroAccum { Reduce, Local };       // --zero-accum: ZeRO-2/3 with K > 1

// Throw ConfigError with one line naming the flag and its choices.
Offload parse_offload(const std::string& name);      // none | optimizer | all
ZeroAccum parse_zero_accum(const std::string& name);  // reduce | local
std::string to_string(Offload o);
std::string to_string(ZeroAccum a);

}  // namespace kiln
