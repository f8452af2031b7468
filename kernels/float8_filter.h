// kernels/float8_filter.h -- which linear layers take float8 products (`--precision fp8`,
// `--fp8-filter`; kernels/float8.h): LibTorch-free, so that `kiln plan` (plan/, torch-free)
// counts the same layers the trainer quantises.
#pragma once

#include <cstdint>

namespace kiln {

// Whether a layer of W [N, K] takes float8 products: _scaled_mm wants K and N multiples of 16;
// `auto_filter` also leaves out the shapes where torchao measured no gain on an H100 for the
// tensorwise recipe: N <= 4096 with K <= 1024 (torchao's _auto_filter_for_tensorwise, which names
// weight.shape K, N -- the other way round). GPT-2 124M keeps only mlp.c_proj [768, 3072].
inline bool float8_layer_eligible(int64_t n, int64_t k, bool auto_filter) {
  if (n % 16 != 0 || k % 16 != 0) return false;
  return !auto_filter || !(n <= 4096 && k <= 1024);
}

}  // namespace kiln
