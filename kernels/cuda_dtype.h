// kernels/cuda_dtype.h -- LibTorch's side of kernels/cuda_launch.h: a tensor's DType tag, and a
// launcher's error as an exception naming the kernel. Only compiled with the kernels
// (KILN_WITH_KERNELS).
#pragma once

#include <string>

#include <ATen/core/Tensor.h>

#include "distributed/error.h"
#include "kernels/cuda_launch.h"

namespace kiln::kernels {

inline bool supported_dtype(const at::Tensor& t) {
  const auto s = t.scalar_type();
  return s == at::kFloat || s == at::kBFloat16 || s == at::kHalf;
}

inline DType dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::f32;
    case at::kBFloat16: return DType::bf16;
    case at::kHalf: return DType::f16;
    default: throw Error(std::string("kiln kernels: no kernel for dtype ") + c10::toString(t.scalar_type()));
  }
}

inline void check_launch(cudaError_t e, const char* kernel) {
  if (e != cudaSuccess) throw Error(std::string("kiln kernel ") + kernel + ": " + cudaGetErrorString(e));
}

}  // namespace kiln::kernels
