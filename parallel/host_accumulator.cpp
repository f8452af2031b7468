// parallel/host_accumulator.cpp -- page-locked slots, a CUDA event each, one worker thread.
#include "parallel/host_accumulator.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>

#include <ATen/ATen.h>
#if defined(KILN_WITH_CUDA)
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include "distributed/error.h"
#include "distributed/host_memory.h"

namespace kiln {

struct HostAccumulator::Slot {
  at::Tensor buffer;        // capacity fp32 elements on the host
  int64_t ticket = 0;       // the issue number of the add using it (0: none yet)
#if defined(KILN_WITH_CUDA)
  cudaEvent_t copied = nullptr;  // recorded after the copy into buffer
#endif
};

HostAccumulator::HostAccumulator(c10::Device device, int64_t capacity, int slots)
    : device_(device), capacity_(capacity) {
  if (slots < 1) throw Error("host accumulator: needs at least one slot");
  // Tests only: each add lands this late, so a reader that forgot to drain() reads early for sure.
  if (const char* d = std::getenv("KILN_TEST_HOST_ADD_DELAY_MS")) test_delay_ms_ = std::max(0, std::atoi(d));
  for (int i = 0; i < slots; ++i) {
    auto s = std::make_unique<Slot>();
    s->buffer = host_buffer(capacity, /*pinned=*/pin_for(device));
#if defined(KILN_WITH_CUDA)
    if (device.is_cuda() && cudaEventCreateWithFlags(&s->copied, cudaEventDisableTiming) != cudaSuccess) {
      (void)cudaGetLastError();
      throw Error("host accumulator: cudaEventCreate failed");
    }
#endif
    slots_.push_back(std::move(s));
  }
  worker_ = std::thread([this] { work(); });
}

HostAccumulator::~HostAccumulator() {
  try {
    drain();
  } catch (...) {
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
#if defined(KILN_WITH_CUDA)
  for (auto& s : slots_)
    if (s->copied) cudaEventDestroy(s->copied);
#endif
}

void HostAccumulator::finish(Slot& s) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return landed_ >= s.ticket || !error_.empty(); });
  if (!error_.empty()) throw Error("host accumulator: " + error_);
}

void HostAccumulator::add(const at::Tensor& src, const at::Tensor& dst) {
  if (src.numel() != dst.numel() || src.numel() > capacity_ || src.scalar_type() != at::kFloat ||
      dst.scalar_type() != at::kFloat || !dst.is_cpu() || !src.is_contiguous() || !dst.is_contiguous()) {
    throw Error("host accumulator: add needs fp32 contiguous tensors of one size, at most " + std::to_string(capacity_) +
                " elements, the destination on the host");
  }
  Slot& s = *slots_[next_];
  next_ = (next_ + 1) % slots_.size();
  finish(s);  // the slot's previous add has landed: its buffer is free
  at::Tensor view = s.buffer.narrow(0, 0, src.numel());
#if defined(KILN_WITH_CUDA)
  if (src.is_cuda()) {
    view.copy_(src, /*non_blocking=*/true);  // page-locked: asynchronous on the current stream
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(src.device().index()).stream();
    if (cudaEventRecord(s.copied, stream) != cudaSuccess) {
      (void)cudaGetLastError();
      throw Error("host accumulator: cudaEventRecord failed");
    }
  } else {
    view.copy_(src);
  }
#else
  view.copy_(src);
#endif
  {
    std::lock_guard<std::mutex> lock(mu_);
    s.ticket = ++issued_;
    queue_.push_back(Task{&s, dst.data_ptr<float>(), src.numel()});
  }
  cv_.notify_all();
}

void HostAccumulator::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return landed_ >= issued_ || !error_.empty(); });
  if (!error_.empty()) throw Error("host accumulator: " + error_);
}

void HostAccumulator::work() {
#if defined(KILN_WITH_CUDA)
  if (device_.is_cuda()) cudaSetDevice(device_.index());  // the events' device, for this thread
#endif
  for (;;) {
    Task t{};
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ with nothing left
      t = queue_.front();
      queue_.pop_front();
    }
    std::string failed;
#if defined(KILN_WITH_CUDA)
    if (t.slot->copied && device_.is_cuda()) {
      const cudaError_t rc = cudaEventSynchronize(t.slot->copied);
      if (rc != cudaSuccess) failed = std::string("waiting for a device-to-host copy: ") + cudaGetErrorString(rc);
    }
#endif
    if (test_delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(test_delay_ms_));
    if (failed.empty()) {
      const float* src = t.slot->buffer.data_ptr<float>();
      float* dst = t.dst;
      for (int64_t i = 0; i < t.n; ++i) dst[i] += src[i];
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed.empty()) error_ = failed;
      ++landed_;
    }
    cv_.notify_all();
  }
}

}  // namespace kiln
