// models/flops.cpp -- the FLOP count.
#include "models/flops.h"

namespace kiln {

double flops_per_token(const GPTConfig& cfg) {
  const double N = static_cast<double>(cfg.num_active_params_non_embedding_pos());  // = all of them, dense
  return 6.0 * N + 12.0 * static_cast<double>(cfg.n_layer) * static_cast<double>(cfg.attn_width()) *
                       static_cast<double>(cfg.seq_len);
}

}  // namespace kiln
