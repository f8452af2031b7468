// optim/loss_scaler.h -- the FP16 loss scaler, with DeepSpeed's knobs and meanings.
//
// FP16 keeps 5 exponent bits: gradients below 2^-24 flush to zero. The loss is multiplied by a
// scale S before backward, so every gradient is S times larger and stays representable; the
// optimizer sees g / S. A gradient that overflowed (inf or NaN on any rank) means S was too
// large: the step is skipped -- weights, optimizer state and the LR schedule untouched -- and
// S may come down.
//
// Dynamic rule (DeepSpeed's DynamicLossScaler, consecutive_hysteresis = false), per step:
//   overflow:  if hysteresis_left == 1:  S = max(S / 2, min_scale)   (an error if S was already
//                                                                     at min_scale: no way down)
//              else:                     hysteresis_left -= 1        (tolerated, S kept)
//              last_overflow = iter
//   clean:     if (iter - last_overflow) % window == 0:  S = 2 S,  hysteresis_left = hysteresis
//   iter += 1
// with iter starting at 0, last_overflow at -1, S = 2^initial_scale_power, hysteresis_left =
// hysteresis. So the scale doubles after `window` clean steps in a row, the first `hysteresis - 1`
// overflows since the last growth are tolerated without halving, and every one after that halves.
// Every overflowing step is skipped, tolerated or not.
//
// Static rule (--loss-scale S > 0): S never changes; an overflowing step is still skipped.
// Disabled (bf16, fp32): S = 1, nothing is ever skipped by the scaler.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

namespace kiln {

struct LossScalerConfig {
  bool enabled = false;            // fp16 only
  double static_scale = 0.0;       // > 0: static scale; 0: dynamic
  int64_t initial_scale_power = 16;  // dynamic: S starts at 2^N
  int64_t window = 1000;           // dynamic: clean steps before S doubles
  int64_t hysteresis = 2;          // dynamic: overflows tolerated (minus one) before S halves
  double min_scale = 1.0;          // dynamic: S never goes below
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerConfig& cfg);

  // The scale to multiply this step's loss by.
  double scale() const { return scale_; }
  // Records the outcome of a step (overflow agreed across ranks) and returns true when the
  // step must be skipped. Throws NumericsError when the dynamic scale is already at its minimum
  // and the step still overflows.
  bool update(bool overflow);

  int64_t hysteresis_left() const { return hysteresis_left_; }
  int64_t iteration() const { return iter_; }

  // The state a checkpoint carries, and its inverse. load_state ignores the state unless both
  // this scaler and the one that saved it are dynamic (fp16, --loss-scale 0).
  nlohmann::json state() const;
  void load_state(const nlohmann::json& state);

 private:
  LossScalerConfig cfg_;
  double scale_;
  int64_t hysteresis_left_;
  int64_t iter_ = 0;
  int64_t last_overflow_ = -1;
};

}  // namespace kiln
