// parallel/zero_state.cpp -- the engine's state seen whole: a parameter (or its moments) gathered
// from the shards for a checkpoint and loaded back into them, the moments' fingerprint, and the
// model-state bytes by kind and place (parallel/zero.h, "Checkpoints").
#include <algorithm>

#include <ATen/ATen.h>

#include "distributed/device.h"
#include "distributed/device_check.h"
#include "distributed/error.h"
#include "distributed/host_memory.h"
#include "parallel/zero.h"
#include "parallel/zero_unit.h"

namespace kiln {

// ---- checkpoints and reports ---------------------------------------------------------------

std::pair<ZeroEngine::Unit*, size_t> ZeroEngine::locate(const at::Tensor& param) const {
  for (const auto& u : units_)
    for (size_t k = 0; k < u->params.size(); ++k)
      if (u->params[k].is_same(param)) return {u.get(), k};
  throw Error("zero: the parameter is not one of the engine's");
}

at::Tensor ZeroEngine::shard_of(Unit& u, StatePart part) {
  switch (part) {
    case StatePart::Param: return u.master.defined() ? u.master : param_shard(u);
    case StatePart::ExpAvg: return u.exp_avg;
    case StatePart::ExpAvgSq: return u.exp_avg_sq;
  }
  throw Error("zero: unknown state part");
}

namespace {
// The parameter [start, start + len) of a unit whose rank q owns [q s, (q + 1) s), gathered onto
// the group's rank 0 from each rank's `shard` (its s elements): whole there, undefined elsewhere.
at::Tensor gather_pieces(const at::Tensor& shard, int64_t s, int64_t start, int64_t len, Communicator& group,
                         c10::Device device, at::IntArrayRef sizes) {
  const int64_t n = group.size(), me = group.rank();
  auto piece_of = [&](int64_t q) {
    const int64_t a = std::max(start, q * s), b = std::min(start + len, (q + 1) * s);
    return std::make_pair(a, std::max(a, b));
  };
  at::Tensor out;
  std::vector<P2POp> ops;
  at::Tensor sent;  // kept alive until the exchange completes
  if (me == 0) {
    out = at::empty({len}, at::TensorOptions().dtype(at::kFloat).device(device));
    for (int64_t q = 0; q < n; ++q) {
      const auto [a, b] = piece_of(q);
      if (a == b) continue;
      if (q == 0) out.narrow(0, a - start, b - a).copy_(shard.narrow(0, a, b - a));
      else ops.push_back({P2POp::Kind::Recv, out.narrow(0, a - start, b - a), static_cast<int>(q)});
    }
  } else {
    const auto [a, b] = piece_of(me);
    if (a < b) {
      sent = to_device(shard.narrow(0, a - me * s, b - a), device);
      ops.push_back({P2POp::Kind::Send, sent, 0});
    }
  }
  if (!ops.empty()) group.send_recv(ops)->wait();
  return me == 0 ? out.view(sizes) : at::Tensor();
}

int part_index(StatePart part) { return part == StatePart::Param ? 0 : part == StatePart::ExpAvg ? 1 : 2; }
}  // namespace

at::Tensor ZeroEngine::gather_param(const at::Tensor& param, StatePart part) {
  at::NoGradGuard no_grad;
  settle();  // offload: the last step's host updates in (and copied up)
  auto [u, k] = locate(param);
  const int64_t me = u->group->rank(), start = u->offsets[k], len = param.numel();
  if (part == StatePart::Param && cfg_.stage < 3 && !sixteen() && !u->unpublished) {
    // ZeRO-1/2 keep the whole unit on every rank (all-gathered after each step): no traffic.
    // (Not while the delayed update holds its result back: the masters are the step's weights.)
    if (me != 0) return at::Tensor();
    return u->flat.narrow(0, start, len).view(param.sizes()).clone();
  }
  return gather_pieces(shard_of(*u, part), u->shard, start, len, *u->group, device_, param.sizes());
}

void ZeroEngine::snapshot(ZeroSnapshot& into, const std::function<at::Tensor(int64_t)>& alloc) {
  at::NoGradGuard no_grad;
  settle();
  if (into.shards.empty()) {
    for (const auto& u : units_) into.shards.push_back({alloc(u->shard), alloc(u->shard), alloc(u->shard)});
  }
  for (size_t i = 0; i < units_.size(); ++i) {
    Unit& u = *units_[i];
    for (StatePart part : {StatePart::Param, StatePart::ExpAvg, StatePart::ExpAvgSq}) {
      into.shards[i][static_cast<size_t>(part_index(part))].copy_(shard_of(u, part).reshape({-1}), /*non_blocking=*/true);
    }
  }
  into.steps = steps_taken();
}

int64_t ZeroEngine::snapshot_numel() const {
  int64_t n = 0;
  for (const auto& u : units_) n += 3 * u->shard;
  return n;
}

at::Tensor ZeroEngine::gather_snapshot(const ZeroSnapshot& s, const at::Tensor& param, StatePart part, Communicator& dense,
                                       Communicator* experts) const {
  at::NoGradGuard no_grad;
  auto [u, k] = locate(param);
  size_t i = 0;
  while (units_[i].get() != u) ++i;
  Communicator* group = u->expert ? experts : &dense;
  if (!group) throw Error("zero: an expert unit's snapshot needs the expert-data-parallel host group");
  return gather_pieces(s.shards[i][static_cast<size_t>(part_index(part))], u->shard, u->offsets[k], param.numel(), *group,
                       at::kCPU, param.sizes());
}

void ZeroEngine::load_param(const at::Tensor& param, StatePart part, const at::Tensor& local) {
  at::NoGradGuard no_grad;
  settle();  // no host update may still write what this loads
  auto [u, k] = locate(param);
  if (local.sizes() != param.sizes()) throw Error("zero: load_param: the tensor's shape is not the parameter's");
  const int64_t me = u->group->rank(), start = u->offsets[k], len = param.numel();
  const at::Tensor flat_local = local.reshape({-1});
  // The delayed update's pending result is replaced by what is loaded (on every rank alike: each
  // loads every parameter, whether or not its shard holds a piece of it).
  if (part == StatePart::Param) {
    u->unpublished = false;
    u->q_valid = false;  // a float8 unit's 8-bit shard is requantised at its next gather (every rank alike)
  }
  if (part == StatePart::Param && cfg_.stage < 3) u->flat.narrow(0, start, len).copy_(flat_local);
  const int64_t a = std::max(start, me * u->shard), b = std::min(start + len, (me + 1) * u->shard);
  if (a >= b) return;
  const at::Tensor src = flat_local.narrow(0, a - start, b - a);
  if (part == StatePart::Param) {
    if (cfg_.stage == 3) u->shard_params.narrow(0, a - me * u->shard, b - a).copy_(src);
    if (u->master.defined() && !u->master.is_same(u->shard_params)) u->master.narrow(0, a - me * u->shard, b - a).copy_(src);
    return;
  }
  shard_of(*u, part).narrow(0, a - me * u->shard, b - a).copy_(src);
}

std::pair<double, double> ZeroEngine::param_moments() {
  at::NoGradGuard no_grad;
  settle();
  double sums[2][2] = {{0.0, 0.0}, {0.0, 0.0}};  // [dense, experts][sum, sum of squares]
  for (auto& u : units_) {
    auto d = (u->master.defined() ? u->master : param_shard(*u)).to(at::kDouble);
    for (const auto& s : u->segments) {
      auto piece = d.narrow(0, s.offset, s.length);
      sums[u->expert][0] += piece.sum().item<double>() * s.norm_weight;
      sums[u->expert][1] += piece.square().sum().item<double>() * s.norm_weight;
    }
  }
  auto t = to_device(at::tensor({sums[0][0], sums[0][1]}, at::kDouble), device_);
  dp_->all_reduce(t, ReduceOp::Sum)->wait();
  if (cfg_.is_expert) {  // each expert's shards over expert_dp, every expert over ep
    auto e = to_device(at::tensor({sums[1][0], sums[1][1]}, at::kDouble), device_);
    if (cfg_.expert_dp->size() > 1) cfg_.expert_dp->all_reduce(e, ReduceOp::Sum)->wait();
    cfg_.ep->all_reduce(e, ReduceOp::Sum)->wait();
    t = t + e;
  }
  if (cfg_.tp) cfg_.tp->all_reduce(t, ReduceOp::Sum)->wait();
  t = t.cpu();
  return {t[0].item<double>(), t[1].item<double>()};
}

// Read off the buffers themselves. "host" is where offload puts a buffer (on a CPU-only run
// the device is the host too; the split still says which buffers offload moved).
ModelStateBytes ZeroEngine::memory() const {
  ModelStateBytes b;
  auto bytes = [](const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : int64_t{0}; };
  const bool params_on_host = cfg_.offload == Offload::All;
  for (const auto& up : units_) {
    const Unit& u = *up;
    if (cfg_.stage < 3) b.device.params += bytes(u.flat);
    else (params_on_host ? b.host : b.device).params += bytes(u.shard_params) + bytes(u.q_shard);  // q_shard: float8 units' 8-bit shard
    if (streamed()) (params_on_host ? b.host : b.device).grads += bytes(u.grad_shard);
    else b.device.grads += bytes(u.grad_full);
    if (u.host_grad.defined() && !u.host_grad.is_same(u.grad_shard)) b.host.grads += bytes(u.host_grad);
    auto& opt = cfg_.offload == Offload::None ? b.device : b.host;
    opt.optimizer += bytes(u.exp_avg) + bytes(u.exp_avg_sq);
    if (u.master.defined() && !u.master.is_same(u.shard_params)) opt.optimizer += bytes(u.master);
    b.host.params += bytes(u.upload);  // offload optimizer, 16-bit weights: the 2-byte copy that goes up
  }
  return b;
}

}  // namespace kiln
