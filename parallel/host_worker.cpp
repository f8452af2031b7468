// parallel/host_worker.cpp -- a queue, a condition variable and one thread.
#include "parallel/host_worker.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <string>

#include <ATen/Parallel.h>
#if defined(_OPENMP)
#include <omp.h>
#endif
#if defined(KILN_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

#include "distributed/error.h"

namespace kiln {

HostWorker::HostWorker(c10::Device device, int threaded) : device_(device), threads_(std::max(1, at::get_num_threads())) {
  if (const char* v = std::getenv("KILN_TEST_HOST_WORKER")) {
    const std::string mode = v;
    if (mode != "thread" && mode != "inline") throw Error("KILN_TEST_HOST_WORKER must be thread or inline, not '" + mode + "'");
    inline_ = mode == "inline";
  }
  if (threaded >= 0) inline_ = threaded == 0;
  if (const char* d = std::getenv("KILN_TEST_HOST_STEP_DELAY_MS")) delay_ms_ = std::max(0, std::atoi(d));
  if (!inline_) thread_ = std::thread([this] { work(); });
}

HostWorker::~HostWorker() {
  try {
    drain();
  } catch (...) {
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int64_t HostWorker::post(std::function<void()> task) {
  if (inline_) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_.empty()) throw Error("host worker: " + error_);
    }
    task();  // a throw reaches the caller directly
    std::lock_guard<std::mutex> lock(mu_);
    done_ = ++issued_;
    return issued_;
  }
  int64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    ticket = ++issued_;
  }
  cv_.notify_all();
  return ticket;
}

void HostWorker::wait(int64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ >= ticket || !error_.empty(); });
  if (!error_.empty()) throw Error("host worker: " + error_);
}

void HostWorker::drain() {
  int64_t last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = issued_;
  }
  wait(last);
}

void HostWorker::work() {
#if defined(KILN_WITH_CUDA)
  if (device_.is_cuda()) cudaSetDevice(device_.index());  // the events' device, for this thread
#endif
#if defined(_OPENMP)
  omp_set_num_threads(threads_);  // a new thread's OpenMP team would otherwise take every core
#endif
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ with nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    if (delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
    std::string failed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      failed = error_;
    }
    if (failed.empty()) {  // after a failure the rest are dropped: their inputs may be wrong
      try {
        task();
      } catch (const std::exception& e) {
        failed = e.what();
      } catch (...) {
        failed = "unknown error";
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed.empty() && error_.empty()) error_ = failed;
      ++done_;
    }
    cv_.notify_all();
  }
}

}  // namespace kiln
