// parallel/host_accumulator.cpp -- page-locked slots and CUDA events; the adds run as HostWorker tasks.
#include "parallel/host_accumulator.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#if defined(KILN_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "distributed/error.h"
#include "distributed/host_memory.h"
#include "parallel/host_worker.h"
#include "parallel/stream_event.h"

// at::parallel_for only splits the range in a file compiled with OpenMP (optim/cpu_adamw.cpp says why).
#if AT_PARALLEL_OPENMP && !defined(_OPENMP)
#error "parallel/host_accumulator.cpp must be compiled with OpenMP (-fopenmp) to use LibTorch's thread pool"
#endif

namespace kiln {

namespace {

// dst[i] += src[i] over the intra-op pool, in 64-byte lines so no two threads write one.
void host_add(float* dst, const float* src, int64_t n) {
  constexpr int64_t kLine = 16, kGrain = 32768;
  at::parallel_for(0, (n + kLine - 1) / kLine, kGrain / kLine, [&](int64_t begin, int64_t end) {
    const int64_t b = std::min(end * kLine, n);
    for (int64_t i = begin * kLine; i < b; ++i) dst[i] += src[i];
  });
}

}  // namespace

struct HostAccumulator::CopyStream {
#if defined(KILN_WITH_CUDA)
  c10::cuda::CUDAStream stream;
#endif
};

struct HostAccumulator::Slot {
  at::Tensor buffer;   // capacity fp32 elements on the host
  int64_t ticket = 0;  // the worker's ticket of the add using it (0: none yet)
};

HostAccumulator::HostAccumulator(HostWorker& worker, c10::Device device, int64_t capacity, int slots)
    : worker_(worker), capacity_(capacity) {
  // Tests only: more slots, so more adds are still in flight when a reader comes (with a delay,
  // a reader that does not drain() then finds several shards short for sure).
  if (const char* n = std::getenv("KILN_TEST_HOST_ADD_SLOTS")) slots = std::atoi(n);
  if (slots < 1) throw Error("host accumulator: needs at least one slot");
  // Tests only: each add lands this late, so a reader that forgot to drain() reads early for sure.
  if (const char* d = std::getenv("KILN_TEST_HOST_ADD_DELAY_MS")) test_delay_ms_ = std::max(0, std::atoi(d));
  for (int i = 0; i < slots; ++i) {
    auto s = std::make_unique<Slot>();
    s->buffer = host_buffer(capacity, /*pinned=*/pin_for(device));
    slots_.push_back(std::move(s));
  }
}

HostAccumulator::~HostAccumulator() {
  try {
    drain();
  } catch (...) {
  }
}

void HostAccumulator::add(const at::Tensor& src, const at::Tensor& dst, bool assign) {
  if (src.numel() != dst.numel() || src.numel() > capacity_ || src.scalar_type() != at::kFloat ||
      dst.scalar_type() != at::kFloat || !dst.is_cpu() || !src.is_contiguous() || !dst.is_contiguous()) {
    throw Error("host accumulator: add needs fp32 contiguous tensors of one size, at most " + std::to_string(capacity_) +
                " elements, the destination on the host");
  }
  const int delay = test_delay_ms_;
  float* out = dst.data_ptr<float>();
  const int64_t n = src.numel();
  // The copy, issued here: into g itself (assign), or into the oldest slot once its add has run.
  at::Tensor target = dst;
  Slot* slot = nullptr;
  if (!assign) {
    slot = slots_[next_].get();
    next_ = (next_ + 1) % slots_.size();
    worker_.wait(slot->ticket);  // the slot's previous add has run: its buffer is free
    target = slot->buffer.narrow(0, 0, n);
  }
#if defined(KILN_WITH_CUDA)
  std::shared_ptr<StreamEvent> copied;
  if (src.is_cuda()) {
    // On the copy stream, after what the compute stream has queued so far (src's producer), so
    // the copy runs beside the backward's next kernels instead of between them. The allocator is
    // told src is in use there: the compute stream may drop it at once without its memory being
    // handed out before the copy has read it.
    const c10::DeviceIndex index = src.device().index();
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(index);
    if (!copy_stream_) copy_stream_.reset(new CopyStream{c10::cuda::getStreamFromPool(false, index)});
    const c10::cuda::CUDAStream& copy = copy_stream_->stream;
    StreamEvent(compute.stream()).wait_on(copy.stream());
    c10::cuda::CUDACachingAllocator::recordStream(src.storage().data_ptr(), copy);
    {
      c10::cuda::CUDAStreamGuard on_copy(copy);
      target.copy_(src, /*non_blocking=*/true);  // page-locked: asynchronous on the copy stream
    }
    copied = std::make_shared<StreamEvent>(copy.stream());
  } else {
    target.copy_(src);
  }
#else
  target.copy_(src);  // on the CPU in line, as a stream would order it
#endif
  const float* in = target.data_ptr<float>();
  const int64_t ticket = worker_.post([=] {
#if defined(KILN_WITH_CUDA)
    if (copied) copied->wait_host();
#endif
    if (delay > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay));
    if (!assign) host_add(out, in, n);
  });
  if (slot) slot->ticket = ticket;
  last_ = ticket;
}

void HostAccumulator::drain() { worker_.wait(last_); }

}  // namespace kiln
