// runtime/watchdog.cpp -- the stall detector's thread.
#include "runtime/watchdog.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include <mpi.h>

namespace kiln {

namespace {
[[noreturn]] void abort_job(const std::string& message) {
  std::fprintf(stderr, "kiln: error: %s\n", message.c_str());
  std::fflush(stderr);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 5);
  std::_Exit(5);
}
}  // namespace

Watchdog::Watchdog(double timeout_s, std::function<void(const std::string&)> on_timeout)
    : timeout_s_(timeout_s), on_timeout_(std::move(on_timeout)) {
  if (!on_timeout_) on_timeout_ = abort_job;
  thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Watchdog::set_timeout(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  timeout_s_ = seconds;
}

double Watchdog::timeout() const {
  std::lock_guard<std::mutex> lock(mu_);
  return timeout_s_;
}

uint64_t Watchdog::start(const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  inflight_[++next_] = Entry{what, Clock::now()};
  return next_;
}

void Watchdog::complete(uint64_t token) {
  std::lock_guard<std::mutex> lock(mu_);
  inflight_.erase(token);
}

size_t Watchdog::outstanding() const {
  std::lock_guard<std::mutex> lock(mu_);
  return inflight_.size();
}

void Watchdog::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(100));
    if (stop_) break;
    const auto now = Clock::now();
    for (const auto& [token, e] : inflight_) {
      const double age = std::chrono::duration<double>(now - e.start).count();
      if (age > timeout_s_) {
        std::ostringstream m;
        m << e.what << " did not complete within " << timeout_s_
          << " s (--comm-timeout): a peer rank has stalled or died; aborting the job";
        const std::string message = m.str();
        lock.unlock();
        on_timeout_(message);
        return;  // a test's handler may return; the production handler does not
      }
    }
  }
}

}  // namespace kiln
