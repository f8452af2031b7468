// runtime/inference/sampling.cpp -- greedy, temperature, top-k and top-p (the rules in the header).
#include "runtime/inference/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include <ATen/ATen.h>

#include "distributed/error.h"
#include "distributed/strprintf.h"

namespace kiln {

void SamplingConfig::validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0) {
    throw ConfigError(strprintf("--temperature %g: must be 0 (greedy) or positive", temperature));
  }
  if (top_k < 0) throw ConfigError("--top-k " + std::to_string(top_k) + ": must be 0 (off) or positive");
  if (!(top_p > 0.0 && top_p <= 1.0)) throw ConfigError(strprintf("--top-p %g: must be in (0, 1] (1 = off)", top_p));
  if (!(std::isfinite(repetition_penalty) && repetition_penalty > 0.0)) {
    throw ConfigError(strprintf("--repetition-penalty %g: must be positive (1 = off; above 1 discourages repeats)", repetition_penalty));
  }
}

at::Tensor penalized(const at::Tensor& logits, const std::vector<int64_t>& seen, double penalty) {
  at::Tensor z = logits.detach().to(at::kCPU, at::kFloat).reshape({-1}).clone();
  if (penalty == 1.0 || seen.empty()) return z;
  const int64_t V = z.size(0);
  std::vector<int64_t> ids;
  for (const int64_t id : seen)
    if (id >= 0 && id < V) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());  // each id penalised once
  if (ids.empty()) return z;
  const at::Tensor at_ids = at::tensor(ids, at::kLong);
  const at::Tensor v = z.index_select(0, at_ids);
  z.index_copy_(0, at_ids, at::where(v > 0, v / penalty, v * penalty));
  return z;
}

at::Tensor sampling_probs(const at::Tensor& logits, const SamplingConfig& cfg) {
  auto z = logits.detach().to(at::kCPU, at::kFloat).reshape({-1}) / cfg.temperature;
  const int64_t V = z.size(0);
  if (cfg.top_k > 0 && cfg.top_k < V) {
    const auto kth = std::get<0>(z.topk(cfg.top_k)).min();  // the k-th largest logit
    z = z.masked_fill(z < kth, -std::numeric_limits<float>::infinity());
  }
  auto p = at::softmax(z, 0);
  if (cfg.top_p < 1.0) {
    auto [sorted, order] = p.sort(/*dim=*/0, /*descending=*/true);
    // Drop a token when the tokens before it already hold top_p: the first is always kept.
    const auto drop_sorted = (sorted.cumsum(0) - sorted) >= cfg.top_p;
    const auto drop = at::zeros_like(drop_sorted).scatter(0, order, drop_sorted);
    p = p.masked_fill(drop, 0.0f);
    p = p / p.sum();
  }
  return p;
}

int64_t sample_token(const at::Tensor& logits, const SamplingConfig& cfg, at::Generator& gen, const std::vector<int64_t>& seen) {
  const at::Tensor z = cfg.repetition_penalty != 1.0 ? penalized(logits, seen, cfg.repetition_penalty) : logits;
  if (cfg.greedy()) return z.detach().to(at::kCPU, at::kFloat).reshape({-1}).argmax().item<int64_t>();
  return at::multinomial(sampling_probs(z, cfg), 1, /*replacement=*/false, gen).item<int64_t>();
}

}  // namespace kiln
