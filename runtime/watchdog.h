// runtime/watchdog.h -- ends the job when a collective stalls, instead of hanging forever.
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
  // on_timeout receives the message; it must not return (the default aborts the MPI job).
  explicit Watchdog(double timeout_s, std::function<void(const std::string&)> on_timeout = nullptr);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void set_timeout(double seconds);
  double timeout() const;
  // Registers an operation in flight; returns the token that complete() takes.
  uint64_t start(const std::string& what);
  void complete(uint64_t token);
  size_t outstanding() const;

 private:
  void loop();
  using Clock = std::chrono::steady_clock;
  struct Entry {
    std::string what;
    Clock::time_point start;
  };
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Entry> inflight_;
  uint64_t next_ = 0;
  double timeout_s_;
  bool stop_ = false;
  std::function<void(const std::string&)> on_timeout_;
  std::thread thread_;
};

}  // namespace kiln
