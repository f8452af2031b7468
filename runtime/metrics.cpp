// runtime/metrics.cpp -- FLOP count and the peak table.
#include "runtime/metrics.h"

#include <utility>
#include <vector>

namespace kiln {

double flops_per_token(const GPTConfig& cfg) {
  const double N = static_cast<double>(cfg.num_active_params_non_embedding_pos());  // = all of them, dense
  return 6.0 * N + 12.0 * static_cast<double>(cfg.n_layer) * static_cast<double>(cfg.d_model) *
                       static_cast<double>(cfg.seq_len);
}

std::optional<double> peak_tflops_for(const std::string& name) {
  // Most specific first: the first entry whose key is a substring of the name wins.
  // Sources: NVIDIA data sheets (dense, without sparsity); torchtitan tools/utils.py.
  static const std::vector<std::pair<std::string, double>> table = {
      {"H100 NVL", 835.0}, {"H100 PCIe", 756.0}, {"H100", 989.0}, {"H200", 989.0},
      {"H20", 148.0},      {"B200", 2250.0},     {"A100", 312.0},
      {"A800", 312.0},     {"L40S", 362.0},      {"A10G", 70.0},   {"V100", 125.0},
  };
  for (const auto& [key, tflops] : table)
    if (name.find(key) != std::string::npos) return tflops;
  return std::nullopt;
}

}  // namespace kiln
