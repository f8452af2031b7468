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
// Where the tasks run: on the worker thread when the device is a GPU (the host's cores are free
// while the GPU computes: that is the overlap); in line, at post(), on a CPU run, whose compute is
// itself on those cores -- a second team of threads beside the compute's only oversubscribes them
// (measured, docs/benchmarks.md: gpt2-124m ZeRO-3 --offload optimizer on 2 cores, 1,464 ms a step
// in line, 1,737 ms threaded).
// Tests: KILN_TEST_HOST_WORKER=thread or inline overrides that (CPU tests run the thread and
// compare it with in line, bit for bit), and KILN_TEST_HOST_STEP_DELAY_MS=N makes the thread
// sleep N ms before each task, so a reader that forgot to wait reads early every time.
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
  // device: a CUDA device starts the thread and makes it the thread's current device (for the
  // events tasks wait on); the thread's OpenMP team takes at::get_num_threads() of the
  // constructing thread. Any other device: tasks run in line (above). threaded: 1 or 0 decides
  // instead of the device and KILN_TEST_HOST_WORKER (-1: they decide).
  explicit HostWorker(c10::Device device, int threaded = -1);
  ~HostWorker();  // drains (errors swallowed), then joins
  HostWorker(const HostWorker&) = delete;
  HostWorker& operator=(const HostWorker&) = delete;

  int64_t post(std::function<void()> task);
  void wait(int64_t ticket);
  void drain();
  bool inline_mode() const { return inline_; }

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
