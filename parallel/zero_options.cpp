// parallel/zero_options.cpp -- parsing and naming ZeRO's option values.
#include "parallel/zero_options.h"

#include "distributed/error.h"

namespace kiln {

Offload parse_offload(const std::string& name) {
  if (name == "none") return Offload::None;
  if (name == "optimizer") return Offload::Optimizer;
  if (name == "all") return Offload::All;
  throw ConfigError("--offload must be one of none, optimizer, all (got '" + name + "')");
}

ZeroAccum parse_zero_accum(const std::string& name) {
  if (name == "reduce") return ZeroAccum::Reduce;
  if (name == "local") return ZeroAccum::Local;
  throw ConfigError("--zero-accum must be one of reduce, local (got '" + name + "')");
}

std::string to_string(Offload o) { return o == Offload::None ? "none" : o == Offload::Optimizer ? "optimizer" : "all"; }
std::string to_string(ZeroAccum a) { return a == ZeroAccum::Reduce ? "reduce" : "local"; }

}  // namespace kiln
