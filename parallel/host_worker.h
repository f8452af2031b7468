// parallel/host_worker.h -- one thread that runs the host's share of an offloaded step, in order.
//
// ZeRO offload (parallel/zero.h) gives the host two kinds of work that the thread driving the GPU
// must not wait for: adding each unit's reduced gradient shard into its host shard during backward
// (parallel/host_accumulator.h), and each unit's AdamW update after it (ZeroEngine::step). Both
// go to one HostWorker, which runs its tasks one after another in the order they were posted, so a
// unit's update runs after every add into its gradients, and the next step's first add into a
// unit after that unit's update, with no other bookkeeping. A task may itself spread its work
// over the host's cores (at::parallel_for: the worker's OpenMP team has the intra-op pool's size).
//
//   post(task)     queues it and returns its ticket (1, 2, ...); never blocks
//   wait(ticket)   returns once that task and every one before it have run
//   drain()        wait(the last ticket): nothing left queued or running
// A task that throws stops the worker's tasks: every later wait() and drain() rethrows its message
// (the queued tasks after it do not run).
//
// The tasks run on the worker thread, on a GPU run (where the host's cores are free while the GPU
// computes: that is the overlap) and on a CPU run alike, so that CPU tests run the GPU's order. On
// the CPU the compute shares the cores with the worker, and the two come out even: gpt2-124m
// ZeRO-3 on 2 cores, medians of three runs each, in line 1,263 / 1,123 ms a step (--offload
// optimizer / all), threaded 1,198 / 1,182 (docs/benchmarks.md).
// Tests: KILN_TEST_HOST_WORKER=inline runs every task at post() on the posting thread (the serial
// order the offloaded step had before the worker; tests compare the two bit for bit), and
// KILN_TEST_HOST_STEP_DELAY_MS=N makes the thread sleep N ms before each task, so a reader that
// forgot to wait reads early every time.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include <c10/core/Device.h>

namespace kiln {

class HostWorker {
 public:
  // device: a CUDA device becomes the thread's current device (for the events tasks wait on); the
  // thread's OpenMP team takes at::get_num_threads() of the constructing thread. threaded: 1 or 0
  // decides instead of KILN_TEST_HOST_WORKER (-1: it decides; unset, the thread).
  explicit HostWorker(c10::Device device, int threaded = -1);
  ~HostWorker();  // drains (errors swallowed), then joins
  HostWorker(const HostWorker&) = delete;
  HostWorker& operator=(const HostWorker&) = delete;

  int64_t post(std::function<void()> task);
  void wait(int64_t ticket);
  void drain();

 private:
  void work();

  c10::Device device_;
  int threads_ = 1;
  bool inline_ = false;
  int delay_ms_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  int64_t issued_ = 0, done_ = 0;
  std::string error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace kiln
