// runtime/trainer/nonfinite_guard.cpp -- the device flags, the hooks, and the all-gathered line.
#include "runtime/trainer/nonfinite_guard.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

#include <ATen/ATen.h>

#include "distributed/comm.h"
#include "distributed/error.h"
#include "distributed/rank0_verdict.h"

namespace kiln {

NonfiniteGuard::NonfiniteGuard(std::vector<std::pair<std::string, at::Tensor>> params, int rank) : rank_(rank) {
  for (auto& [name, t] : params)
    if (t.requires_grad()) params_.push_back({name, t});
  // Test-only: KILN_TEST_NAN_GRAD=RANK:STEP[:COUNT]. Registered before the trace hooks, so they see it.
  if (const char* spec = std::getenv("KILN_TEST_NAN_GRAD")) {
    long long r = -1, first = -1, count = 1;
    if (std::sscanf(spec, "%lld:%lld:%lld", &r, &first, &count) < 2 || first < 1 || count < 1) {
      throw ConfigError(std::string("KILN_TEST_NAN_GRAD=") + spec + ": want RANK:STEP[:COUNT], STEP and COUNT >= 1");
    }
    if (r == rank_) {
      inject_first_ = first - 1, inject_count_ = count;
      size_t target = 0;
      for (size_t i = 0; i < params_.size(); ++i)
        if (params_[i].name.find("mlp") != std::string::npos) {
          target = i;
          break;
        }
      if (!params_.empty()) {
        params_[target].tensor.register_hook([this](const at::Tensor& g) -> at::Tensor {
          if (current_step_ < inject_first_ || current_step_ >= inject_first_ + inject_count_) return at::Tensor();
          at::Tensor bad = g.clone();
          bad.view(-1)[0] = std::numeric_limits<float>::quiet_NaN();
          return bad;
        });
      }
    }
  }
}

void NonfiniteGuard::begin_step(int64_t step) {
  current_step_ = step;
  if (!armed_) return;
  // A fresh trace for this step: inf where no non-finite gradient has been seen.
  const at::Tensor t = at::full({static_cast<int64_t>(params_.size())}, std::numeric_limits<double>::infinity(),
                                at::TensorOptions().dtype(at::kDouble).device(params_.empty() ? at::kCPU : params_[0].tensor.device()));
  traces_[step] = t;
  order_ = 0;
}

void NonfiniteGuard::note_local_loss(int64_t step, const at::Tensor& loss_sum) {
  loss_flags_[step] = at::logical_not(at::isfinite(loss_sum.detach())).to(at::kFloat);
  while (loss_flags_.size() > 4) loss_flags_.erase(loss_flags_.begin());  // the steps in flight
}

void NonfiniteGuard::arm() {
  armed_ = true;
  if (hooked_) return;
  hooked_ = true;
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].tensor.register_hook([this, i](const at::Tensor& g) {
      if (!armed_) return;
      auto it = traces_.find(current_step_);
      if (it == traces_.end()) return;
      const double order = static_cast<double>(order_++);
      const at::Tensor bad = at::logical_not(at::isfinite(g).all());
      at::Tensor slot = it->second.narrow(0, static_cast<int64_t>(i), 1);
      slot.copy_(at::where(bad, at::minimum(slot, at::full_like(slot, order)), slot));
    });
  }
}

void NonfiniteGuard::step_read(int64_t step, bool nonfinite) {
  if (!nonfinite) {  // the run of skipped steps (if any) is over
    run_losses_.clear();
    traces_.clear();
    traced_step_ = -1;
    trace_.clear();
    armed_ = false;
    loss_flags_.erase(loss_flags_.begin(), loss_flags_.upper_bound(step));
    return;
  }
  if (auto it = loss_flags_.find(step); it != loss_flags_.end()) run_losses_.emplace_back(step, it->second);
  if (auto it = traces_.find(step); it != traces_.end()) {
    if (traced_step_ < 0) {
      traced_step_ = step;
      const at::Tensor h = it->second.to(at::kCPU).contiguous();
      trace_.assign(h.data_ptr<double>(), h.data_ptr<double>() + h.numel());
    }
    traces_.erase(it);
  }
  arm();
}

std::string NonfiniteGuard::local_findings() {
  int64_t loss_step = -1;
  for (const auto& [step, flag] : run_losses_)
    if (flag.item<float>() > 0) {
      loss_step = step;
      break;
    }
  std::string first;
  int64_t count = 0;
  double best = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < trace_.size(); ++i) {
    if (!std::isfinite(trace_[i])) continue;
    ++count;
    if (trace_[i] < best) best = trace_[i], first = params_[i].name;
  }
  return std::to_string(loss_step) + ";" + std::to_string(traced_step_) + ";" + first + ";" + std::to_string(count);
}

std::string NonfiniteGuard::origin(Communicator* host) {
  const std::string mine = local_findings();
  const std::vector<std::string> all = host && host->size() > 1 ? all_gather_strings(*host, mine) : std::vector<std::string>{mine};
  struct Row {
    int64_t loss_step, traced_step, count;
    std::string param;
  };
  std::vector<Row> rows;
  for (const std::string& s : all) {
    std::istringstream in(s);
    std::string a, b, c, d;
    std::getline(in, a, ';'), std::getline(in, b, ';'), std::getline(in, c, ';'), std::getline(in, d, ';');
    rows.push_back({std::stoll(a), std::stoll(b), std::stoll(d), c});
  }
  // The local loss: the earliest step at which some rank's was not finite, and those ranks.
  int64_t loss_step = -1;
  for (const Row& r : rows)
    if (r.loss_step >= 0 && (loss_step < 0 || r.loss_step < loss_step)) loss_step = r.loss_step;
  std::string out;
  auto rank_list = [&](auto pick) {
    std::string list;
    int n = 0;
    for (size_t k = 0; k < rows.size(); ++k)
      if (pick(rows[k])) list += (n++ ? ", " : "") + std::to_string(k);
    return std::make_pair(list, n);
  };
  if (loss_step >= 0) {
    const auto [list, n] = rank_list([&](const Row& r) { return r.loss_step == loss_step; });
    out = "the local loss was not finite first at step " + std::to_string(loss_step + 1) + " on rank" + (n > 1 ? "s " : " ") +
          list;
  } else {
    out = "every rank's local loss was finite (a gradient)";
  }
  int64_t traced = -1;
  for (const Row& r : rows) traced = std::max(traced, r.traced_step);
  if (traced < 0) {
    out += "; the gradients were not traced (a step is traced from the second one after the first skip: "
           "--on-nonfinite skip with --max-skipped-steps 3 or more traces a persistent fault)";
    return out;
  }
  const auto [list, n] = rank_list([&](const Row& r) { return r.count > 0; });
  if (n == 0) return out + "; traced at step " + std::to_string(traced + 1) + ": no rank's own gradients were non-finite before the reductions";
  out += "; traced at step " + std::to_string(traced + 1) + ": non-finite gradients before the reductions on rank" +
         (n > 1 ? "s " : " ") + list + ", first in";
  for (size_t k = 0; k < rows.size(); ++k)
    if (rows[k].count > 0) {
      out += " " + rows[k].param + " (rank " + std::to_string(k) + ", " + std::to_string(rows[k].count) + " parameter" +
             (rows[k].count > 1 ? "s" : "") + " in all)";
      break;
    }
  return out;
}

}  // namespace kiln
