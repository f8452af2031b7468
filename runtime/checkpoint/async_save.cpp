// runtime/checkpoint/async_save.cpp -- the snapshot, the background thread, its outcome.
#include "runtime/checkpoint/async_save.h"

#include <chrono>
#include <cstdlib>

#include "distributed/comm.h"
#include "distributed/error.h"
#include "distributed/mesh.h"

namespace kiln {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

AsyncSaver::AsyncSaver(Checkpointer& checkpointer, WholeModel& live, std::unique_ptr<Mesh> host_mesh,
                       std::shared_ptr<Communicator> host_world)
    : checkpointer_(checkpointer), live_(live), host_mesh_(std::move(host_mesh)), host_world_(std::move(host_world)) {
  // The pool allocated and its pages touched now, at set-up: the first save's stall is then a copy
  // like every other's (measured: 3.4 s instead of 0.1 s for gpt2-124m's first save otherwise).
  live_.snapshot(snap_);
}

AsyncSaver::~AsyncSaver() {
  if (thread_.joinable()) thread_.join();
}

AsyncSaver::Started AsyncSaver::start(const TrainProgress& progress, const nlohmann::json& run) {
  Started s;
  const auto t0 = Clock::now();
  if (thread_.joinable()) {  // at most one save in flight
    s.write_running = !finished_;
    joining_ = true;
    thread_.join();
    s.waited_s = since(t0);
  }
  if (!error_.empty()) throw Error(error_, error_code_);  // the previous write failed: never start another
  const auto t1 = Clock::now();
  live_.snapshot(snap_);
  s.snapshot_s = since(t1);
  finished_ = false;
  joining_ = false;
  const int64_t polls_at_start = polls_.load();
  thread_ = std::thread([this, progress, run, polls_at_start] {
    try {
      // Test-only (tests/cli/async_save.sh): KILN_TEST_SLOW_ASYNC_S=x holds the write back x seconds,
      // so that training changes the live state meanwhile and saves queue up; KILN_TEST_ASYNC_HOLD_STEPS=k
      // until k more steps were recorded (polls), whatever the machine's load (at most 60 s).
      if (const char* slow = std::getenv("KILN_TEST_SLOW_ASYNC_S")) std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(slow)));
      if (const char* hold = std::getenv("KILN_TEST_ASYNC_HOLD_STEPS")) {
        const auto until = Clock::now() + std::chrono::seconds(60);
        while (polls_.load() < polls_at_start + std::atoll(hold) && !joining_ && Clock::now() < until) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
      }
      WholeModel view(live_, snap_, host_mesh_.get(), host_world_.get());
      Done d;
      d.step = progress.step;
      d.dir = checkpointer_.save(view, progress, run, &d.io);
      std::lock_guard<std::mutex> lock(mutex_);
      done_.push_back(std::move(d));
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::string("asynchronous save of step ") + std::to_string(progress.step) + ": " + e.what();
      error_code_ = e.exit_code();
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::string("asynchronous save of step ") + std::to_string(progress.step) + ": " + e.what();
      error_code_ = 70;
    }
    finished_ = true;
  });
  return s;
}

std::vector<AsyncSaver::Done> AsyncSaver::poll() {
  ++polls_;
  if (thread_.joinable() && finished_) thread_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  if (!error_.empty()) throw Error(error_, error_code_);
  std::vector<Done> out = std::move(done_);
  done_.clear();
  return out;
}

std::vector<AsyncSaver::Done> AsyncSaver::wait() {
  joining_ = true;
  if (thread_.joinable()) thread_.join();
  return poll();
}

}  // namespace kiln
