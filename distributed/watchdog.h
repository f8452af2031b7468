// distributed/watchdog.h -- ends the job when a collective stalls, instead of hanging forever.
//
// Every Work a communicator issues is registered here with its description (rank, operation,
// sequence number, group, bytes) and its start time, and removed when it completes. A thread
// checks every 100 ms; an operation outstanding longer than the timeout prints one line,
//   kiln: error: rank 1: all_reduce #57 on group 'dp' (mpi, 3501056 bytes) did not complete
//   within 5 s (--comm-timeout): a peer rank has stalled or died; aborting the job
// and aborts the whole job (MPI_Abort), so no rank is left waiting on a peer that will never
// come. Two timeouts, as torchtitan has: a long one for start-up and the first step (loading,
// allocation, kernel selection), then the short one, switched by the trainer after the first
// step.
//
// GPU collectives (distributed/comm_nccl.h) finish on the device, and nobody has to wait for them on
// the host, so their entries carry a completion probe (a cudaEventQuery) that the thread polls
// every tick; the entry is complete once the probe returns true. A communicator can also add a
// health check (ncclCommGetAsyncError) that the thread runs every tick: when it reports a
// failure, the thread runs the check's failure hook (ncclCommAbort), prints one line and aborts
// the job the same way. The age of a GPU entry counts from when it was enqueued, so it includes
// the time the collective waited behind the compute queued before it on its stream.
//
// Probes and checks run on the watchdog thread without its main lock held (start() and
// complete() never wait for them); they must be quick and must not block: cudaEventQuery and
// ncclCommGetAsyncError qualify. A probe or check that throws ends the job with its message.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace kiln {

class Watchdog {
 public:
  // on_timeout receives the message (a timeout, a failed probe or a failed health check); it
  // must not return (the default aborts the MPI job). A test's handler may return: the thread
  // then stops watching.
  explicit Watchdog(double timeout_s, std::function<void(const std::string&)> on_timeout = nullptr);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void set_timeout(double seconds);
  double timeout() const;

  // While one lives, operations started get `seconds` as their timeout instead of the watchdog's,
  // and a timeout message names `why` (the flag that sets it, and what the peer is doing):
  // checkpoints, where rank 0 writes or reads alone while the others wait in a collective, take
  // --save-timeout, not --comm-timeout. Windows do not nest (a second one replaces the first
  // until it ends).
  class Window {
   public:
    Window(Watchdog* w, double seconds, std::string why);  // w null: nothing
    ~Window();
    Window(const Window&) = delete;
    Window& operator=(const Window&) = delete;

   private:
    Watchdog* w_;
  };
  // Registers an operation in flight; returns the token that complete() takes.
  uint64_t start(const std::string& what);
  // The same, for an operation the thread completes itself once `done()` returns true (polled
  // every tick, without the watchdog's lock held). complete() may still be called early.
  uint64_t start(const std::string& what, std::function<bool()> done);
  void complete(uint64_t token);  // idempotent; unknown tokens are ignored
  size_t outstanding() const;

  // Adds a check run every tick: it returns "" while healthy, else one line describing the
  // failure. On a failure the thread calls `on_failure` (may be empty), then on_timeout with
  // "<line>; aborting the job". Returns the id remove_health_check() takes.
  uint64_t add_health_check(std::function<std::string()> check, std::function<void()> on_failure = nullptr);
  // Removes a check. On return the thread is not running it and never will again, so whatever
  // the check uses may be destroyed. Must not be called from a probe, check or hook.
  void remove_health_check(uint64_t id);

 private:
  void loop();
  // One round of probes and health checks; returns the fatal message, or "" when all is well.
  std::string poll();
  using Clock = std::chrono::steady_clock;
  struct Entry {
    std::string what;
    Clock::time_point start;
    std::function<bool()> done;  // empty: completed by complete() only
    double timeout_s = -1.0;     // a window's (>= 0), else the watchdog's
    std::string why;             // what the message names with it
  };
  struct HealthCheck {
    std::function<std::string()> check;
    std::function<void()> on_failure;
  };
  // Lock order: probe_mu_ before mu_. mu_ guards the state below; probe_mu_ is held by the
  // thread while it runs probes, checks and failure hooks, so remove_health_check() can wait
  // for a round in progress.
  mutable std::mutex mu_;
  std::mutex probe_mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Entry> inflight_;
  std::map<uint64_t, HealthCheck> checks_;
  uint64_t next_ = 0;
  double timeout_s_;
  double window_s_ = -1.0;  // an open Window's timeout, or -1
  std::string window_why_;
  bool stop_ = false;
  std::function<void(const std::string&)> on_timeout_;
  std::thread thread_;
};

}  // namespace kiln
