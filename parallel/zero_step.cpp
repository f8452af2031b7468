// parallel/zero_step.cpp -- the engine's gradient norm and its sharded step: on the device (one
// multi-tensor AdamW), or offloaded -- the host worker's per-unit updates, waited for where each
// unit is next needed, and their publication, at once or one step late (parallel/zero.h, "The
// overlapped host step", "The delayed update").
#include <ATen/ATen.h>

#include "distributed/device.h"
#include "distributed/device_check.h"
#include "distributed/error.h"
#include "kernels/adamw.h"
#include "optim/cpu_adamw.h"
#include "parallel/host_worker.h"
#include "parallel/zero.h"
#include "parallel/zero_unit.h"

namespace kiln {

namespace {
// A unit's squared gradient norm, in the pieces local_grad_sq_norm sums: the whole shard, or each
// segment times its weight (ZeroConfig::count_weights). On the CPU in double: LibTorch's CPU fp32
// norm of a long vector is off by up to 1e-6 relative (measured on the tiny model); CUDA reduces
// in a tree, accurately in fp32.
std::vector<at::Tensor> sq_norm_parts(const at::Tensor& g, const std::vector<std::pair<int64_t, int64_t>>& runs,
                                      const std::vector<double>& weights) {
  auto sq_norm = [](const at::Tensor& x) {
    return at::linalg_vector_norm(x, 2, at::OptionalIntArrayRef(), false, x.is_cpu() ? at::kDouble : at::kFloat)
        .square()
        .to(at::kDouble);
  };
  at::NoGradGuard no_grad;
  if (runs.empty()) return {sq_norm(g)};
  std::vector<at::Tensor> parts;
  for (size_t i = 0; i < runs.size(); ++i) parts.push_back(sq_norm(g.narrow(0, runs[i].first, runs[i].second)) * weights[i]);
  return parts;
}
}  // namespace

std::vector<at::Tensor> ZeroEngine::sq_parts(const Unit& u) const {
  std::vector<std::pair<int64_t, int64_t>> runs;
  std::vector<double> weights;
  if (cfg_.count_weights) {
    for (const auto& s : u.segments) {
      runs.push_back({s.offset, s.length});
      weights.push_back(s.norm_weight);
    }
  }
  return sq_norm_parts(u.grad_shard, runs, weights);
}

void ZeroEngine::post_norm(Unit& u) {
  // Offload all: the host shard's squared norm on the host worker, right after its last add, so
  // the pass over the host gradients overlaps the rest of the backward instead of following it.
  if (!host_sums()) return;
  Unit* unit = &u;
  const ZeroEngine* engine = this;
  u.sq_valid = true;  // read only after a settle(), which waits for the task
  host_->post([engine, unit] { unit->sq_parts = engine->sq_parts(*unit); });
}

at::Tensor ZeroEngine::local_grad_sq_norm() const {
  at::NoGradGuard no_grad;
  settle();
  // Shards on the host (offload all) sum on the host, and their total crosses to the device once.
  // Their pieces were computed by the host worker as each shard became final (post_norm), the
  // same pieces by the same ops as here, summed here in the same order.
  at::Tensor on_device = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device_));
  at::Tensor on_host;
  for (const auto& u : units_) {
    at::Tensor& total = u->grad_shard.device() == device_ ? on_device : on_host;
    for (const auto& sq : u->sq_valid ? u->sq_parts : sq_parts(*u)) total = total.defined() ? total + sq : sq;
  }
  if (on_host.defined()) on_device = on_device + to_device(on_host, device_);
  return on_device.to(at::kFloat);
}

// ---- the step ------------------------------------------------------------------------------

int64_t ZeroEngine::steps_taken() const {
  return cfg_.offload == Offload::None ? static_cast<int64_t>(to_host(step_t_).item<float>()) : steps_;
}

void ZeroEngine::set_steps_taken(int64_t n) {
  steps_ = n;
  at::NoGradGuard no_grad;
  step_t_.fill_(static_cast<double>(n));
}

void ZeroEngine::finish_update(Unit& u) const {
  if (u.update != 0) {
    host_->wait(u.update);
    u.update = 0;
  }
  if (!delaying_) upload(u);
}

void ZeroEngine::upload(Unit& u) const {
  // Offload optimizer: the updated shard up to the device (16-bit weights: the 2-byte copy the
  // host update wrote); offload all: the host update wrote the host shard the gathers read.
  if (!u.unpublished) return;
  u.unpublished = false;
  u.q_valid = false;  // a float8 unit's 8-bit shard is of the old weights
  at::NoGradGuard no_grad;
  param_shard(u).copy_(u.upload.defined() ? u.upload : u.master, /*non_blocking=*/true);
}

void ZeroEngine::publish_units() {
  // Each unit's update in (and up) as soon as it lands; ZeRO-1/2 then give every rank every
  // rank's updated shard -- in place, each rank's shard is its chunk of flat -- so unit u's
  // all-gather overlaps the host update of u + 1.
  std::vector<std::shared_ptr<Work>> works;
  for (auto& u : units_) {
    finish_update(*u);
    upload(*u);
    if (cfg_.stage == 3 || alone(*u)) continue;
    auto own = u->flat.narrow(0, u->group->rank() * u->shard, u->shard);
    works.push_back(u->group->all_gather(u->flat, own));
  }
  for (auto& w : works) w->wait();
}

void ZeroEngine::publish() {
  if (!cfg_.delayed_update) return;
  // The flags change in step on every rank (every rank posts the same updates), so every rank of
  // a group takes the same decision.
  bool pending = false;
  for (const auto& u : units_) pending = pending || u->unpublished;
  if (!pending) return;
  at::NoGradGuard no_grad;
  settle();
  publish_units();
}

void ZeroEngine::settle() const {
  if (!host_) return;
  for (const auto& u : units_) finish_update(*u);
  host_->drain();
  for (const auto& u : units_) {
    if (!u->fresh) continue;  // no gradient reached it this step: it holds the last step's
    at::NoGradGuard no_grad;
    u->grad_shard.zero_();
    u->fresh = false;
  }
}

void ZeroEngine::post_update(Unit& u, double lr, double factor) {
  // The host shards by raw pointer (the task outlives nothing: the engine drains before it dies).
  float* pm = u.master.data_ptr<float>();
  const float* pg = u.host_grad.data_ptr<float>();
  float* pa = u.exp_avg.data_ptr<float>();
  float* pv = u.exp_avg_sq.data_ptr<float>();
  // The 16-bit working copy, written by the same pass: offload all's host shard, or offload
  // optimizer's upload buffer. fp32 weights: the master is the shard (all) or goes up as it is.
  const at::Tensor out = !sixteen() ? at::Tensor() : cfg_.offload == Offload::All ? u.shard_params : u.upload;
  char* po = out.defined() ? static_cast<char*>(out.data_ptr()) : nullptr;
  const CpuWorking working = !out.defined() ? CpuWorking::none
                             : cfg_.param_dtype == at::kBFloat16 ? CpuWorking::bf16
                                                                 : CpuWorking::fp16;
  std::vector<std::pair<Segment, CpuAdamWStep>> work;
  for (const auto& s : u.segments)
    work.push_back({s, {lr, adam_.beta1, adam_.beta2, adam_.eps, s.decay ? adam_.weight_decay : 0.0, steps_, factor}});
  u.unpublished = cfg_.offload == Offload::Optimizer;
  u.update = host_->post([pm, pg, pa, pv, po, working, work = std::move(work)] {
    for (const auto& [s, st] : work)
      cpu_adamw(pm + s.offset, pg + s.offset, pa + s.offset, pv + s.offset, s.length, st,
                po ? po + s.offset * 2 : nullptr, working);
  });
}

void ZeroEngine::step(double lr, const at::Tensor& grad_factor, const at::Tensor& found_inf) {
  at::NoGradGuard no_grad;
  // The float8 units' 8-bit shards are requantised at their next gather: once a step, whatever the
  // verdict (a skipped update leaves the same bytes), so the traffic is the same every step.
  for (auto& u : units_) u->q_valid = false;
  if (cfg_.offload == Offload::None) {
    // One multi-tensor update per decay group over every unit's segments (kernels/adamw.h): the
    // gradients times grad_factor, AdamW on the fp32 masters, the working shard round16(master).
    AdamWGroup groups[2];
    step_t_.add_(1.0 - found_inf);  // the update reads t already advanced
    for (auto& u : units_) {
      auto ps = u->master.defined() ? u->master : param_shard(*u);  // fp32
      for (const auto& s : u->segments) {
        AdamWGroup& g = groups[s.decay ? 1 : 0];
        g.params.push_back(ps.narrow(0, s.offset, s.length));
        g.grads.push_back(u->grad_shard.narrow(0, s.offset, s.length));
        g.exp_avg.push_back(u->exp_avg.narrow(0, s.offset, s.length));
        g.exp_avg_sq.push_back(u->exp_avg_sq.narrow(0, s.offset, s.length));
        g.steps.push_back(step_t_);
        if (sixteen()) g.working.push_back(param_shard(*u).narrow(0, s.offset, s.length));
      }
    }
    for (int d = 0; d < 2; ++d)
      adamw_update(groups[d], {lr, adam_.beta1, adam_.beta2, d ? adam_.weight_decay : 0.0, adam_.eps}, grad_factor, found_inf,
                   kernels_);
  } else {
    // Offload: the host steps, so it reads the verdict (it waits for the gradients anyway).
    settle();  // every add and download landed (the last step's updates long since)
    // Delayed: the last step's update, run under this step's forward and backward, goes up now
    // (its copies ordered before the synchronize below, which this step's update waits for).
    publish();
    if (to_host(found_inf).item<float>() != 0.0f) {  // skipped: nothing moves
      for (auto& u : units_) u->downloaded = false;
      return;
    }
    const double factor = to_host(grad_factor).item<float>();
    ++steps_;
    step_t_.fill_(static_cast<double>(steps_));
    // Gradient shards down (all issued, then one wait), then one host task per unit, in the
    // order the next forward needs them ("The overlapped host step").
    for (auto& u : units_) {
      if (!u->downloaded && !u->host_grad.is_same(u->grad_shard)) u->host_grad.copy_(u->grad_shard, /*non_blocking=*/true);
      u->downloaded = false;
    }
    synchronize(device_);
    // The delay holds this update back when the updates applied before it reach delay_from.
    delaying_ = cfg_.delayed_update && steps_ - 1 >= cfg_.delay_from;
    for (auto& u : units_) post_update(*u, lr, factor);
  }
  // ZeRO-1/2: every rank's updated shard to every rank (delayed: at the next publish()).
  if (cfg_.stage < 3 && !delaying_) publish_units();
}

}  // namespace kiln
