// runtime/observe/phase_timer.cpp -- CUDA events or the host clock.
#include "runtime/observe/phase_timer.h"

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <utility>

#if defined(KILN_WITH_CUDA)
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include "distributed/wait_clock.h"

namespace kiln {

struct PhaseTimer::CudaEvents {
#if defined(KILN_WITH_CUDA)
  std::vector<cudaEvent_t> events;  // created once, reused across steps
  size_t used = 0;
  ~CudaEvents() {
    for (auto e : events) cudaEventDestroy(e);
  }
  void record() {
    if (used == events.size()) {
      cudaEvent_t e{};
      cudaEventCreate(&e);
      events.push_back(e);
    }
    cudaEventRecord(events[used++], c10::cuda::getCurrentCUDAStream().stream());
  }
  double elapsed_ms(size_t i) const {
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, events[i], events[i + 1]);
    return ms;
  }
  void drop_front(size_t k) {  // events [k, used) become [0, used - k); the first k are reused later
    std::rotate(events.begin(), events.begin() + static_cast<std::ptrdiff_t>(k), events.begin() + static_cast<std::ptrdiff_t>(used));
    used -= k;
  }
#endif
};

PhaseTimer::PhaseTimer(c10::Device device, std::shared_ptr<WaitClock> clock) : device_(device), clock_(std::move(clock)) {
#if defined(KILN_WITH_CUDA)
  if (device_.is_cuda()) cuda_ = std::make_unique<CudaEvents>();
#endif
}
PhaseTimer::~PhaseTimer() = default;

void PhaseTimer::start() {
  if (!host_.empty()) base_ = latest() + 1;  // tokens of the old chain never match the new one
  if (clock_) {  // the old chain's waits, and those since its last mark, belong to no interval
    for (int64_t s : segments_) clock_->take(s);
    clock_->take(clock_->segment());
  }
  segments_.clear();
  phases_.clear();
  host_.clear();
#if defined(KILN_WITH_CUDA)
  if (cuda_) {
    cuda_->used = 0;
    cuda_->record();
  }
#endif
  host_.push_back(std::chrono::steady_clock::now());
}

size_t PhaseTimer::mark(Phase p) {
  if (paused_) return latest();
  phases_.push_back(p);
  segments_.push_back(clock_ ? clock_->segment() : -1);
#if defined(KILN_WITH_CUDA)
  if (cuda_) cuda_->record();
#endif
  host_.push_back(std::chrono::steady_clock::now());
  return latest();
}

void PhaseTimer::wait(size_t token) {
  if (token < base_ || token > latest()) throw std::logic_error("PhaseTimer::wait: not a mark of this chain");
#if defined(KILN_WITH_CUDA)
  if (cuda_) cudaEventSynchronize(cuda_->events[token - base_]);
#endif
}

std::array<double, kNumPhases> PhaseTimer::cut(size_t token, std::array<double, kNumPhases>* waited) {
  if (token < base_ || token > latest()) throw std::logic_error("PhaseTimer::cut: not a mark of this chain");
  const size_t k = token - base_;
  std::array<double, kNumPhases> ms{};
  for (size_t i = 0; i < k; ++i) {
    double dt = 0.0;
#if defined(KILN_WITH_CUDA)
    if (cuda_) dt = cuda_->elapsed_ms(i);
#endif
    if (!cuda_) dt = std::chrono::duration<double, std::milli>(host_[i + 1] - host_[i]).count();
    ms[static_cast<size_t>(phases_[i])] += dt;
  }
  if (waited) waited->fill(0.0);
  for (size_t i = 0; i < k; ++i) {
    const double w = clock_ ? clock_->take(segments_[i]) : 0.0;
    if (waited) (*waited)[static_cast<size_t>(phases_[i])] += w;
  }
  segments_.erase(segments_.begin(), segments_.begin() + static_cast<std::ptrdiff_t>(k));
  phases_.erase(phases_.begin(), phases_.begin() + static_cast<std::ptrdiff_t>(k));
  host_.erase(host_.begin(), host_.begin() + static_cast<std::ptrdiff_t>(k));
#if defined(KILN_WITH_CUDA)
  if (cuda_) cuda_->drop_front(k);
#endif
  base_ = token;
  return ms;
}

}  // namespace kiln
