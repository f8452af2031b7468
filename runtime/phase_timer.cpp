// runtime/phase_timer.cpp -- CUDA events or the host clock.
#include "runtime/phase_timer.h"

#include <utility>

#if defined(KILN_WITH_CUDA)
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

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
  void keep_last() {  // the latest event becomes the first of the next interval
    std::swap(events[0], events[used - 1]);
    used = 1;
  }
#endif
};

PhaseTimer::PhaseTimer(c10::Device device) : device_(device) {
#if defined(KILN_WITH_CUDA)
  if (device_.is_cuda()) cuda_ = std::make_unique<CudaEvents>();
#endif
}
PhaseTimer::~PhaseTimer() = default;

void PhaseTimer::start() {
  phases_.clear();
  host_.clear();
#if defined(KILN_WITH_CUDA)
  if (cuda_) {
    cuda_->used = 0;
    cuda_->record();
  }
#endif
  start_time_ = std::chrono::steady_clock::now();
  host_.push_back(start_time_);
}

void PhaseTimer::mark(Phase p) {
  phases_.push_back(p);
#if defined(KILN_WITH_CUDA)
  if (cuda_) cuda_->record();
#endif
  host_.push_back(std::chrono::steady_clock::now());
}

std::array<double, kNumPhases> PhaseTimer::cut() {
  std::array<double, kNumPhases> ms{};
  for (size_t i = 0; i < phases_.size(); ++i) {
    double dt = 0.0;
#if defined(KILN_WITH_CUDA)
    if (cuda_) dt = cuda_->elapsed_ms(i);
#endif
    if (!cuda_) dt = std::chrono::duration<double, std::milli>(host_[i + 1] - host_[i]).count();
    ms[static_cast<size_t>(phases_[i])] += dt;
  }
  phases_.clear();
#if defined(KILN_WITH_CUDA)
  if (cuda_) cuda_->keep_last();
#endif
  host_ = {host_.back()};
  return ms;
}

}  // namespace kiln
