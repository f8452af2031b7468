// parallel/ddp.cpp -- buckets, AccumulateGrad hooks, and the reduction.
#include "parallel/ddp.h"

#include <ATen/ATen.h>

#include "distributed/error.h"
#include "parallel/main_grads.h"

namespace kiln {

DistributedDataParallel::DistributedDataParallel(std::vector<at::Tensor> params, std::shared_ptr<Communicator> dp,
                                                 DDPConfig cfg, std::vector<at::Tensor> targets, at::ScalarType reduce_dtype)
    : params_(std::move(params)), targets_(targets.empty() ? params_ : std::move(targets)), dp_(std::move(dp)),
      reduce_dtype_(reduce_dtype), skip_if_alone_(cfg.skip_if_alone), bucket_of_(params_.size()) {
  if (targets_.size() != params_.size()) throw Error("ddp: one gradient target per parameter");
  if (reduce_dtype_ != at::kFloat && reduce_dtype_ != at::kBFloat16) throw Error("ddp: the reduction dtype must be fp32 or bf16");
  // Reverse registration order: the head's gradients arrive first in backward.
  int64_t current_bytes = 0, limit = cfg.first_bucket_bytes;
  std::vector<std::vector<size_t>> groups(1);
  for (size_t k = targets_.size(); k-- > 0;) {
    const auto& p = targets_[k];
    if (p.scalar_type() != at::kFloat) throw Error("ddp: gradients accumulate in fp32 (got " + std::string(c10::toString(p.scalar_type())) + ")");
    if (current_bytes > 0 && current_bytes + static_cast<int64_t>(p.nbytes()) > limit) {
      groups.emplace_back();
      current_bytes = 0;
      limit = cfg.bucket_bytes;
    }
    groups.back().push_back(k);
    current_bytes += static_cast<int64_t>(p.nbytes());
  }
  for (auto& g : groups) {
    Bucket b;
    int64_t numel = 0;
    for (size_t k : g) numel += targets_[k].numel();
    b.flat = at::zeros({numel}, targets_[g.front()].options());
    int64_t offset = 0;
    for (size_t k : g) {
      auto& p = targets_[k];
      p.mutable_grad() = b.flat.narrow(0, offset, p.numel()).view(p.sizes());
      offset += p.numel();
      bucket_of_[k] = buckets_.size();
    }
    b.params = std::move(g);
    buckets_.push_back(std::move(b));
  }
  for (size_t k = 0; k < params_.size(); ++k) hooks_.add(params_[k], [this, k] { on_grad_ready(k); }, "ddp");
  for (auto& b : buckets_) b.pending = static_cast<int64_t>(b.params.size());
}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::broadcast_parameters() {
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < params_.size(); ++k) {
    at::Tensor data = params_[k].detach();  // shares p's storage: the broadcast lands in the parameter
    dp_->broadcast(data, 0)->wait();
    if (targets_[k].is_same(params_[k])) continue;
    at::Tensor master = targets_[k].detach();
    dp_->broadcast(master, 0)->wait();
  }
  // Every rank must now hold the same weights: compare a checksum's max and min over dp. The
  // checksum is made on the parameters' device (the communicator may be NCCL, which refuses host
  // tensors), and read once.
  if (params_.empty()) return;
  at::Tensor sum = at::zeros({1}, targets_.front().options().dtype(at::kDouble));
  for (const auto& p : targets_) sum += p.detach().to(at::kDouble).abs().sum();
  at::Tensor hi = sum, lo = sum.clone();
  dp_->all_reduce(hi, ReduceOp::Max)->wait();
  dp_->all_reduce(lo, ReduceOp::Min)->wait();
  const double h = hi.item<double>(), l = lo.item<double>();
  if (h != l) {
    throw Error("ddp: parameters differ across dp ranks after the broadcast (checksums " + std::to_string(l) + " .. " +
                std::to_string(h) + ")");
  }
}

void DistributedDataParallel::zero_grad() {
  for (auto& b : buckets_) b.flat.zero_();
  launched_in_backward_ = 0;
}

void DistributedDataParallel::on_grad_ready(size_t k) {
  if (!targets_[k].is_same(params_[k])) move_grad_to_main(params_[k], targets_[k]);  // every micro-step
  if (!sync_) return;
  Bucket& b = buckets_[bucket_of_[k]];
  if (--b.pending == 0) {
    launch(b);
    ++launched_in_backward_;
  }
}

namespace {
struct DoneWork : public Work {
  void wait() override {}
  bool is_completed() override { return true; }
};
}  // namespace

void DistributedDataParallel::launch(Bucket& b) {
  if (skip_if_alone_ && dp_->size() == 1) {
    b.work = std::make_shared<DoneWork>();
    return;
  }
  if (reduce_dtype_ == at::kFloat) {
    b.work = dp_->all_reduce(b.flat, ReduceOp::Avg);
    return;
  }
  b.wire = b.flat.to(reduce_dtype_);
  b.work = dp_->all_reduce(b.wire, ReduceOp::Avg);
}

void DistributedDataParallel::finish_backward() {
  for (auto& b : buckets_)
    if (!b.work) launch(b);  // parameters without a gradient in this backward
  for (auto& b : buckets_) {
    b.work->wait();
    b.work.reset();
    if (b.wire.defined()) {
      b.flat.copy_(b.wire);
      b.wire = at::Tensor();
    }
    b.pending = static_cast<int64_t>(b.params.size());
  }
}

}  // namespace kiln
