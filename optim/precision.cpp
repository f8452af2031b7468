// optim/precision.cpp -- precision names and the autocast scope.
#include "optim/precision.h"

#include <ATen/autocast_mode.h>

#include "distributed/error.h"

namespace kiln {

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::FP32;
  if (name == "bf16") return Precision::BF16;
  if (name == "fp16") return Precision::FP16;
  if (name == "fp8") return Precision::FP8;
  throw ConfigError("--precision must be fp32, bf16, fp16 or fp8 (got '" + name + "')");
}

at::ScalarType compute_dtype(Precision p) {
  switch (p) {
    case Precision::BF16:
    case Precision::FP8: return at::kBFloat16;
    case Precision::FP16: return at::kHalf;
    case Precision::FP32: break;
  }
  return at::kFloat;
}

at::ScalarType dtype_named(const std::string& name) {
  if (name == "bf16") return at::kBFloat16;
  if (name == "fp16") return at::kHalf;
  if (name == "fp32") return at::kFloat;
  throw ConfigError("not a dtype: '" + name + "' (fp32, bf16 or fp16)");
}

AutocastScope::AutocastScope(Precision p, c10::DeviceType device) : active_(p != Precision::FP32), device_(device) {
  if (!active_) return;
  prev_enabled_ = at::autocast::is_autocast_enabled(device_);
  prev_dtype_ = at::autocast::get_autocast_dtype(device_);
  at::autocast::set_autocast_dtype(device_, compute_dtype(p));
  at::autocast::set_autocast_enabled(device_, true);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_, prev_enabled_);
  at::autocast::set_autocast_dtype(device_, prev_dtype_);
}

int64_t autocast_cached_numel(const std::vector<std::pair<std::string, int64_t>>& named_numels, bool tensor_parallel,
                              bool blocks_recomputed, bool gelu_proj_recomputed) {
  if (blocks_recomputed) return 0;
  auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  int64_t n = 0;
  for (const auto& [name, numel] : named_numels) {
    const bool product = ends_with(name, "attn.c_attn.weight") || ends_with(name, "attn.c_attn.bias") ||
                         ends_with(name, "mlp.c_fc.weight") || ends_with(name, "mlp.c_fc.bias") || ends_with(name, "c_proj.weight") ||
                         (!tensor_parallel && ends_with(name, "c_proj.bias"));
    const bool recast = gelu_proj_recomputed && (ends_with(name, "mlp.c_proj.weight") || ends_with(name, "mlp.c_proj.bias"));
    if (product && !recast) n += numel;
  }
  return n;
}

}  // namespace kiln
