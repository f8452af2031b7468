// distributed/wait_clock.h -- how long a rank's own work stood still in its collectives' wait().
//
// A collective inside the forward or backward pass (tensor parallelism's all-reduce, sequence
// parallelism's gathers, context parallelism's exchange, the experts' all-to-all, ZeRO-3's
// parameter gathers, a pipeline's transfers) makes every rank wait there for the slowest one. A
// slow rank's extra time then shows in every rank's forward and backward alike, and which rank is
// slow cannot be read off them (runtime/observe/stragglers.h). What differs is where the time
// went: the fast ranks stood still in wait(), the slow one hardly. So each wait() of a group that
// counts into a clock adds the time its caller stood still:
//   MPI backend    the host's time blocked in MPI_Waitall (the host is the compute there; on a GPU
//                  the staged copies have drained the stream before it)
//   NCCL backend   the caller's stream's time held by cudaStreamWaitEvent: two timing events
//                  recorded on that stream around the wait, read once the work is done (the host
//                  never blocks for it)
// into the open segment. The phase timer (runtime/observe/phase_timer.h) closes a segment at each
// of its marks, so a segment holds the waits of one interval of its chain, and the waits are told
// apart by phase as the time is: a forward's and backward's waits are the ones the stragglers'
// figure takes off their time, a gradient reduction's stay in the comm phase. Thread-safe (a group
// may wait on a helper thread). Groups get their clock with Communicator::count_waits_in; split()
// hands it on. The cost on a GPU: two event records per wait() of those groups.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

namespace kiln {

class WaitClock {
 public:
  // Closes the open segment (the waits since the previous call) and returns its id; a new one opens.
  int64_t segment();
  // A wait that held the caller `ms` milliseconds (measured on the host).
  void add_ms(double ms);
  // A wait measured on the device: `elapsed` gives its milliseconds once the work is done.
  void add_later(std::function<double()> elapsed);
  // A closed segment's waits in milliseconds, and the segment forgotten. Its device work must be
  // done (the phase timer takes it after waiting for its mark). 0 for an unknown id.
  double take(int64_t segment);

 private:
  struct Segment {
    double ms = 0;
    std::vector<std::function<double()>> later;
  };
  mutable std::mutex mu_;
  std::map<int64_t, Segment> closed_;
  Segment open_;
  int64_t next_ = 0;
};

}  // namespace kiln
