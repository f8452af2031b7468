// kernels/kernel_choice.h -- which implementation of a fused op runs: kiln's CUDA kernel or the
// composite LibTorch ops it replaces.
//
// `--kernels fused` (the default) runs kiln's kernels where they exist: on a CUDA tensor, in a
// build that compiled them (KILN_WITH_KERNELS: nvcc and a CUDA LibTorch were found). Everywhere
// else -- the CPU, `--kernels reference` -- the composite ops run: they are each kernel's
// reference, the CPU's path, and what a fused result is compared against (gpu.kernels). A run
// records what ran (the config record's "kernels"), so every figure is an A/B and a wrong result
// can be bisected by rerunning with `--kernels reference`.
#pragma once

#include <string>

namespace kiln {

enum class Kernels { reference, fused };

// "fused" | "reference" -> the choice; anything else throws ConfigError naming the flag.
Kernels parse_kernels(const std::string& name);
const char* kernels_name(Kernels k);

// True when this kiln compiled its CUDA kernels (KILN_WITH_KERNELS).
bool fused_kernels_built();

// What runs for a choice on a device: fused only on CUDA, in a build with the kernels.
Kernels kernels_on(Kernels requested, bool device_is_cuda);

}  // namespace kiln
