// distributed/watchdog.cpp -- the stall detector's thread.
#include "distributed/watchdog.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "distributed/env.h"

namespace kiln {

namespace {
[[noreturn]] void abort_with(const std::string& message) {
  std::fprintf(stderr, "kiln: error: %s\n", message.c_str());
  std::fflush(stderr);
  abort_job(5);  // bounded: the process ends even when MPI_Abort cannot reach the launcher
}
}  // namespace

Watchdog::Watchdog(double timeout_s, std::function<void(const std::string&)> on_timeout)
    : timeout_s_(timeout_s), on_timeout_(std::move(on_timeout)) {
  if (!on_timeout_) on_timeout_ = abort_with;
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

uint64_t Watchdog::start(const std::string& what) { return start(what, nullptr); }

uint64_t Watchdog::start(const std::string& what, std::function<bool()> done) {
  std::lock_guard<std::mutex> lock(mu_);
  inflight_[++next_] = Entry{what, Clock::now(), std::move(done), window_s_, window_why_};
  return next_;
}

Watchdog::Window::Window(Watchdog* w, double seconds, std::string why) : w_(w) {
  if (!w_) return;
  std::lock_guard<std::mutex> lock(w_->mu_);
  w_->window_s_ = seconds;
  w_->window_why_ = std::move(why);
}

Watchdog::Window::~Window() {
  if (!w_) return;
  std::lock_guard<std::mutex> lock(w_->mu_);
  w_->window_s_ = -1.0;
  w_->window_why_.clear();
}

void Watchdog::complete(uint64_t token) {
  std::lock_guard<std::mutex> lock(mu_);
  inflight_.erase(token);
}

size_t Watchdog::outstanding() const {
  std::lock_guard<std::mutex> lock(mu_);
  return inflight_.size();
}

uint64_t Watchdog::add_health_check(std::function<std::string()> check, std::function<void()> on_failure) {
  std::lock_guard<std::mutex> lock(mu_);
  checks_[++next_] = HealthCheck{std::move(check), std::move(on_failure)};
  return next_;
}

void Watchdog::remove_health_check(uint64_t id) {
  std::lock_guard<std::mutex> probes(probe_mu_);  // waits for a round in progress
  std::lock_guard<std::mutex> lock(mu_);
  checks_.erase(id);
}

std::string Watchdog::poll() {
  std::lock_guard<std::mutex> probes(probe_mu_);
  // Copies taken under the lock, run without it: start() and complete() never wait on a probe.
  // Declared after the guard, so they are destroyed while probe_mu_ is still held.
  struct Pending {
    uint64_t token;
    std::string what;
    std::function<bool()> done;
  };
  std::vector<Pending> pending;
  std::vector<HealthCheck> checks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [token, e] : inflight_)
      if (e.done) pending.push_back({token, e.what, e.done});
    for (const auto& [id, c] : checks_) checks.push_back(c);
  }
  std::vector<uint64_t> finished;
  std::string fatal;
  for (const auto& p : pending) {
    try {
      if (p.done()) finished.push_back(p.token);
    } catch (const std::exception& e) {
      fatal = p.what + " failed: " + e.what() + "; aborting the job";
      break;
    } catch (...) {
      fatal = p.what + " failed (unknown exception in its completion probe); aborting the job";
      break;
    }
  }
  for (size_t i = 0; fatal.empty() && i < checks.size(); ++i) {
    std::string line;
    try {
      line = checks[i].check();
    } catch (const std::exception& e) {
      line = std::string("health check failed: ") + e.what();
    } catch (...) {
      line = "health check failed (unknown exception)";
    }
    if (line.empty()) continue;
    if (checks[i].on_failure) {
      try {
        checks[i].on_failure();
      } catch (...) {
        // The job is being aborted either way; the line below says why.
      }
    }
    fatal = line + "; aborting the job";
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (uint64_t token : finished) inflight_.erase(token);
  return fatal;
}

void Watchdog::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stop_; });
      if (stop_) return;
    }
    std::string message = poll();  // completions first, so a finished entry is not reported
    if (message.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      const auto now = Clock::now();
      for (const auto& [token, e] : inflight_) {
        const double age = std::chrono::duration<double>(now - e.start).count();
        const double limit = e.timeout_s >= 0.0 ? e.timeout_s : timeout_s_;
        if (age > limit) {
          std::ostringstream m;
          m << e.what << " did not complete within " << limit << " s ("
            << (e.timeout_s >= 0.0 ? e.why : std::string("--comm-timeout")) << "): a peer rank has stalled or died; aborting the job";
          message = m.str();
          break;
        }
      }
    }
    if (!message.empty()) {
      on_timeout_(message);
      return;  // a test's handler may return; the production handler does not
    }
  }
}

}  // namespace kiln
