// parallel/ddp.h -- distributed data parallelism: bucketed gradient all-reduce, overlapped with
// backward, with gradient-accumulation sync skipping. (LibTorch's C++ API has no DDP.)
//
// Every dp rank holds the whole model and computes gradients on its slice of the global batch;
// after backward each gradient is replaced by its mean over the dp ranks:
//   g <- (1/dp) sum_r g_r
// so every rank takes the same optimizer step as one process on the whole batch would.
//
// Buckets (as PyTorch's reducer): parameters in reverse registration order (roughly the order
// backward produces their gradients), packed into contiguous fp32 buffers of about
// bucket_bytes (the first one smaller, first_bucket_bytes, so communication starts early).
// Each parameter's .grad() is a view into its bucket, so accumulation writes straight into the
// buffer that is communicated. A post-hook on each parameter's AccumulateGrad node counts the
// bucket down; when its last gradient lands, the whole bucket's all-reduce is launched while
// backward goes on. finish_backward() launches buckets whose parameters got no gradient and
// waits for all.
//
// Sync skipping: with gradient accumulation over K micro-batches, set_sync(false) for the first
// K-1 backward passes: the hooks do nothing and the gradients only accumulate locally; the
// last backward (set_sync(true)) reduces the accumulated sum once. Traffic per optimizer step is
// therefore the same for any K: one all-reduce of every gradient (2(n-1)/n x 4 bytes/param on
// a ring).
//
// 16-bit working weights (optim/adamw.h, --param-dtype): the buckets hold the fp32 main grads
// (the masters' .grad views) and the hook first moves each 16-bit gradient into its main grad
// (parallel/main_grads.h), on every micro-step, then counts down as before: accumulation stays
// fp32 whatever the reduction's dtype.
// Reduction dtype (--reduce-dtype): fp32 by default; bf16 casts each bucket to a bf16 copy,
// all-reduces that (2(n-1)/n x 2 bytes/param: half the traffic) and writes the mean back into
// the fp32 bucket, rounded to bf16's 8 bits once per step (the sum itself is formed by the
// backend: NCCL in bf16, kiln's MPI backend widening each pair to fp32).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "distributed/comm.h"
#include "parallel/grad_ready.h"

namespace kiln {

struct DDPConfig {
  int64_t bucket_bytes = 25 << 20;       // target bucket size, bytes (PyTorch's default, 25 MiB)
  int64_t first_bucket_bytes = 1 << 20;  // the first (last-layer) bucket, bytes
  // A group of one rank: no collective (the mean of one gradient is itself). Off by default, so
  // `mpirun -np 1 --backend X` exercises the backend; on for expert parallelism's expert-data-
  // parallel groups, which hold one copy when dp = ep (parallel/expert_parallel.h).
  bool skip_if_alone = false;
};

class DistributedDataParallel {
 public:
  // params: the model's parameters in registration order, on one device. targets: where each
  // one's gradient accumulates and is reduced (fp32; empty: the parameters themselves, which must
  // then be fp32). reduce_dtype: kFloat or kBFloat16 (see above).
  DistributedDataParallel(std::vector<at::Tensor> params, std::shared_ptr<Communicator> dp, DDPConfig cfg = {},
                          std::vector<at::Tensor> targets = {}, at::ScalarType reduce_dtype = at::kFloat);
  ~DistributedDataParallel();

  // Broadcasts every parameter (and target) from dp rank 0, then checks that all ranks agree (a
  // checksum compared by all-reduce max and min). Throws Error if they do not.
  void broadcast_parameters();

  // Whether the next backward reduces (true) or only accumulates (false).
  void set_sync(bool sync) { sync_ = sync; }

  // Zeroes the gradient buckets in place (the .grad views stay valid). Call once per step.
  void zero_grad();

  // After a synced backward: launches what the hooks did not, waits for every bucket.
  void finish_backward();

  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }
  // Buckets of the last synced backward whose all-reduce was launched by a hook, that is,
  // before backward returned (the overlap).
  int64_t launched_in_backward() const { return launched_in_backward_; }

 private:
  struct Bucket {
    at::Tensor flat;                 // fp32, contiguous
    at::Tensor wire;                 // flat in the reduction dtype, while its all-reduce runs (bf16)
    std::vector<size_t> params;      // indices into params_
    int64_t pending = 0;             // gradients not yet landed in this backward
    std::shared_ptr<Work> work;      // the launched all-reduce
  };
  void on_grad_ready(size_t param_index);
  void launch(Bucket& b);

  std::vector<at::Tensor> params_, targets_;  // targets_[k] is params_[k] for fp32 working weights
  std::shared_ptr<Communicator> dp_;
  at::ScalarType reduce_dtype_;
  bool skip_if_alone_ = false;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // param index -> bucket index
  GradReadyHooks hooks_;
  bool sync_ = true;
  int64_t launched_in_backward_ = 0;
};

}  // namespace kiln
