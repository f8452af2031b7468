// runtime/checkpoint/finite_check.cpp -- non-finite weights refused at load (see the header).
#include "runtime/checkpoint/finite_check.h"

#include <algorithm>

#include <ATen/ATen.h>

#include "distributed/error.h"
#include "distributed/rank0_verdict.h"

namespace kiln {

bool all_finite(const at::Tensor& t) {
  if (!at::isFloatingType(t.scalar_type())) return true;
  const at::Tensor flat = t.reshape({-1});
  constexpr int64_t kSlice = int64_t{1} << 24;  // bounds the bool tensor isfinite makes
  for (int64_t at0 = 0; at0 < flat.numel(); at0 += kSlice) {
    if (!at::isfinite(flat.narrow(0, at0, std::min(kSlice, flat.numel() - at0))).all().item<bool>()) return false;
  }
  return true;
}

void NonFiniteTensors::note(const at::Tensor& t, const std::string& file, const std::string& tensor) {
  if (!tensor_.empty() || all_finite(t)) return;
  file_ = file;
  tensor_ = tensor;
}

void NonFiniteTensors::decide(Communicator* host, const std::string& where) const {
  decide_on_rank0(host, [&] {
    if (!tensor_.empty()) {
      throw DataError(where + ": tensor '" + tensor_ + "' of " + file_ +
                      " holds NaN or infinity, which kiln does not load (it would compute NaN from it)");
    }
  });
}

}  // namespace kiln
