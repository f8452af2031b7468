// optim/loss_scaler.cpp -- the dynamic / static FP16 loss-scaling rule.
#include "optim/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "distributed/error.h"

namespace kiln {

LossScaler::LossScaler(const LossScalerConfig& cfg)
    : cfg_(cfg),
      scale_(!cfg.enabled ? 1.0
             : cfg.static_scale > 0.0 ? cfg.static_scale
                                      : std::ldexp(1.0, static_cast<int>(cfg.initial_scale_power))),
      hysteresis_left_(cfg.hysteresis) {}

bool LossScaler::update(bool overflow) {
  if (!cfg_.enabled) return false;
  const bool dynamic = cfg_.static_scale <= 0.0;
  if (overflow && dynamic) {
    if (hysteresis_left_ <= 1) {
      if (scale_ <= cfg_.min_scale) {
        throw NumericsError("fp16 gradients overflow at the minimum loss scale (" + nlohmann::json(scale_).dump() +
                            ", --min-loss-scale): the model diverges in fp16; use --precision bf16 or fp32, a "
                            "lower --lr, or a smaller --min-loss-scale");
      }
      scale_ = std::max(scale_ / 2.0, cfg_.min_scale);
    } else {
      --hysteresis_left_;
    }
    last_overflow_ = iter_;
  } else if (!overflow && dynamic) {
    if ((iter_ - last_overflow_) % cfg_.window == 0) {
      scale_ *= 2.0;
      hysteresis_left_ = cfg_.hysteresis;
    }
  }
  ++iter_;
  return overflow;
}

nlohmann::json LossScaler::state() const {
  return {{"dynamic", cfg_.enabled && cfg_.static_scale <= 0.0},
          {"scale", scale_},
          {"hysteresis_left", hysteresis_left_},
          {"iter", iter_},
          {"last_overflow", last_overflow_}};
}

void LossScaler::load_state(const nlohmann::json& s) {
  // Only a dynamic scaler's state carries over, and only into a dynamic scaler: a run resumed in
  // another precision (or with a static scale) starts its scaler from its own flags.
  if (!(cfg_.enabled && cfg_.static_scale <= 0.0) || !s.value("dynamic", false)) return;
  scale_ = s.at("scale").get<double>();
  hysteresis_left_ = s.at("hysteresis_left").get<int64_t>();
  iter_ = s.at("iter").get<int64_t>();
  last_overflow_ = s.at("last_overflow").get<int64_t>();
}

}  // namespace kiln
