// kernels/swiglu.h -- SwiGLU's silu(gate) * up, fused or composite (kernels/kernel_choice.h).
//
// h [..., 2F]: each row's gate in its first F columns, up in the next F (the layout of the
// model's c_fc, models/gpt.h) -> [..., F] in h's dtype.
// Fused (h on CUDA): kiln's kernels (kernels/swiglu.cu): fp32 inside, one rounding, h alone kept
// for backward. Reference: at::silu(gate) * up.
#pragma once

#include <ATen/core/Tensor.h>

#include "kernels/kernel_choice.h"

namespace kiln {

at::Tensor swiglu(const at::Tensor& h, Kernels kernels);

}  // namespace kiln
