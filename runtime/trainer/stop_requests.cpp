// runtime/trainer/stop_requests.cpp -- the signal handlers: record the first request, nothing else.
#include "runtime/trainer/stop_requests.h"

#include <unistd.h>

#include <csignal>
#include <map>

#include "distributed/error.h"

namespace kiln {

namespace {

volatile std::sig_atomic_t g_requested = 0;  // the first stop signal received, or 0
volatile std::sig_atomic_t g_announce = 0;   // rank 0: say what happens, at once
struct sigaction g_previous[NSIG];            // what each installed handler replaced

// Only async-signal-safe calls below: write(2), signal, raise.
void say(const char* text) {
  size_t n = 0;
  while (text[n] != '\0') ++n;
  const ssize_t ignored = ::write(STDERR_FILENO, text, n);
  (void)ignored;
}

void on_second_interrupt(int) {
  if (g_announce) say("\nkiln: second Ctrl-C: aborted; the step under way and any save in flight are lost (the last complete checkpoint stands)\n");
  std::signal(SIGINT, SIG_DFL);
  std::raise(SIGINT);
}

void on_signal(int sig) {
  const bool first = g_requested == 0;
  if (first) g_requested = sig;
  if (first && g_announce) {
    if (sig == SIGINT) say("\nkiln: SIGINT: stopping after this step and saving where --save-dir is set (Ctrl-C again to abort)\n");
    else if (sig == SIGTERM) say("kiln: SIGTERM: stopping after this step and saving where --save-dir is set\n");
    else say("kiln: stop signal: stopping after this step and saving where --save-dir is set\n");
  }
  // A second Ctrl-C ends the process at once (130), after a word on what it loses.
  if (sig == SIGINT) std::signal(SIGINT, on_second_interrupt);
}

const std::map<std::string, int>& signals() {
  static const std::map<std::string, int> m = {
      {"INT", SIGINT}, {"TERM", SIGTERM}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"HUP", SIGHUP}};
  return m;
}

}  // namespace

StopRequests::StopRequests(const std::vector<std::string>& names, bool announce) {
  g_announce = announce ? 1 : 0;
  for (const auto& n : names) {
    auto it = signals().find(n.rfind("SIG", 0) == 0 ? n.substr(3) : n);
    if (it == signals().end()) {
      throw ConfigError("--stop-signals: unknown signal '" + n + "' (INT, TERM, USR1, USR2, HUP)");
    }
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // system calls the signal interrupts go on
    sigaction(it->second, &sa, &g_previous[it->second]);
    installed_.push_back(it->second);
  }
}

StopRequests::~StopRequests() {
  for (int sig : installed_) sigaction(sig, &g_previous[sig], nullptr);
}

int StopRequests::requested() const { return g_requested; }

std::string StopRequests::name(int signal) {
  for (const auto& [n, s] : signals())
    if (s == signal) return "SIG" + n;
  return "signal " + std::to_string(signal);
}

}  // namespace kiln
