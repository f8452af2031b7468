// kernels/cuda_launch.h -- what the C++ entries and the .cu files agree on, without LibTorch:
// element types by tag, and the launchers' error reporting (a launcher returns cudaSuccess or the
// launch's error; the entry turns it into an exception naming the kernel).
#pragma once

#include <cuda_runtime_api.h>

namespace kiln::kernels {

// The element types a kernel is instantiated for.
enum class DType { f32, bf16, f16 };

}  // namespace kiln::kernels
