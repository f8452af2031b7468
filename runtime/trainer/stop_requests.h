// runtime/trainer/stop_requests.h -- ending a job cleanly: on a scheduler's signal, or before a wall-time
// limit.
//
// Schedulers warn before they kill: Slurm sends SIGTERM at the end of a job's time (and, with
// --signal=USR1@120, SIGUSR1 two minutes before), a user presses Ctrl-C. With the handlers of
// StopRequests installed, the first such signal only records itself; the trainer then finishes
// the step under way, the ranks agree (the request rides on the step's one all-gather over the host
// group, runtime/trainer/trainer_loop.cpp: a signal that reached one rank stops every rank after the
// same step), the job saves a checkpoint
// when --save-dir is set, logs its summary with the reason, prints "interrupted at step N, saved
// DIR/step_N" and exits with kExitStopped (kExitStoppedUnsaved, and a line saying so, when nothing
// was saved). A second SIGINT ends the process at once (its default
// action is restored after the first). The recorded signal is the one process-wide fact here: a
// signal is delivered to the process, not to an object. With `announce` (rank 0), the handler
// says so at once, with write(2) (async-signal-safe): "kiln: SIGINT: stopping after this step and
// saving (Ctrl-C again to abort)" -- the step and the save took 14 s on gpt2-124m on a CPU, in
// silence -- and a second Ctrl-C says what it loses before the default action ends the process.
//
// --max-wall-time T stops the same way, before the step that would end past T seconds after the
// run began: a step is not started when the elapsed time plus the longest step so far (plus the
// last save's duration, when the stop will save) would pass T.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

// The exit code of a job stopped on request and saved (EX_TEMPFAIL: "try again later" -- resume it).
constexpr int kExitStopped = 75;
// The exit code of a job stopped on request with nothing saved (no --save-dir): not 75, which a
// requeue script takes for "saved, resume it" -- a rerun would start again from step 0, forever.
constexpr int kExitStoppedUnsaved = 7;

class StopRequests {
 public:
  // Installs the handlers for `names` (INT, TERM, USR1, USR2, HUP; an empty list installs none).
  // Throws ConfigError for an unknown name.
  // `announce`: print a line at once when a stop is requested (rank 0; see above).
  explicit StopRequests(const std::vector<std::string>& names, bool announce = false);
  ~StopRequests();  // the previous handlers back
  StopRequests(const StopRequests&) = delete;
  StopRequests& operator=(const StopRequests&) = delete;

  // The signal that asked this process to stop, or 0.
  int requested() const;

  // "SIGTERM", ... for a signal number.
  static std::string name(int signal);

 private:
  std::vector<int> installed_;
};

}  // namespace kiln
