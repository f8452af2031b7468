// distributed/device_peaks.cpp -- the peak table.
#include "distributed/device_peaks.h"

#include <utility>
#include <vector>

namespace kiln {

std::optional<double> peak_tflops_for(const std::string& name) {
  // Most specific first: the first entry whose key is a substring of the name wins.
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
