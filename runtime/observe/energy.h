// runtime/observe/energy.h -- the GPU's energy counter, through NVML, for joules per token.
//
// NVML's total-energy counter (millijoules since the driver loaded; Volta and later) read at the
// start and end of a stretch gives its energy exactly, whatever the sampling; average watts =
// joules / seconds. Efficiency figures built on it: joules per token = J / tokens, and model
// TFLOP/s per watt = (model FLOPs / s) / W = model FLOPs / J / 1e12 (the figure the
// supercomputer studies compare: 0.165 on Summit, 0.235 on Crusher for GPT-175B).
// libnvidia-ml is opened at run time (dlopen), so kiln starts on machines without the driver; there,
// and on the CPU, the meter is unavailable and the figures are reported as null.
#pragma once

#include <memory>
#include <optional>

#include <c10/core/Device.h>

namespace kiln {

class EnergyMeter {
 public:
  explicit EnergyMeter(c10::Device device);  // never throws: unavailable instead
  ~EnergyMeter();
  bool available() const { return impl_ != nullptr; }
  // Joules the device has used since the driver loaded (only differences mean anything);
  // nothing when unavailable or the read fails.
  std::optional<double> joules() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
