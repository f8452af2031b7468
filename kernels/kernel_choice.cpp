// kernels/kernel_choice.cpp -- the --kernels choice.
#include "kernels/kernel_choice.h"

#include "distributed/error.h"

namespace kiln {

Kernels parse_kernels(const std::string& name) {
  if (name == "fused") return Kernels::fused;
  if (name == "reference") return Kernels::reference;
  throw ConfigError("--kernels must be fused or reference (got '" + name + "')");
}

const char* kernels_name(Kernels k) { return k == Kernels::fused ? "fused" : "reference"; }

bool fused_kernels_built() {
#ifdef KILN_WITH_KERNELS
  return true;
#else
  return false;
#endif
}

Kernels kernels_on(Kernels requested, bool device_is_cuda) {
  return requested == Kernels::fused && device_is_cuda && fused_kernels_built() ? Kernels::fused : Kernels::reference;
}

}  // namespace kiln
