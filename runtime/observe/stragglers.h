// runtime/observe/stragglers.h -- which rank is slow: each step's slowest rank, and the ranks that
// are slow over the run.
//
// A slow GPU or node slows the whole job (every collective waits for it) while its own figures
// look normal: the others' time goes into waiting, its own into compute. So each rank's own
// compute time a step -- its phase timer's forward + backward (runtime/observe/phase_timer.h) less
// the time it stood still in collectives' waits inside them (distributed/wait_clock.h: tp's,
// sp's, cp's, ep's, ZeRO-3's gathers, a pipeline's transfers, where every rank waits for the
// slowest) -- is all-gathered over the world with the step's stop request (the one host collective
// a step, runtime/trainer/trainer_loop.cpp: 16 bytes a rank over the host group, not the mesh, so
// the step's comm_bytes stay what `kiln plan --compare` checks) and the step record carries the
// largest and its rank (`slowest_compute_ms`, `slowest_rank`).
//
// Over the run each rank keeps its own compute times (the timed steps: the first pays for
// allocation); at the end the ranks' medians are all-gathered once and a rank is a straggler when
//     median(rank) > factor x median over the ranks of its pipeline stage of their medians
// (--straggler-factor, 1.2 by default). Ranks of one stage do the same work (dp, cp, tp and ep
// replicas of its blocks); different stages need not (the last one also runs the output layer),
// so a stage is compared with itself only, and a stage of one rank is never flagged. The median,
// not the mean: a few slow steps (a save, an evaluation, the OS) are not a slow device.
#pragma once

#include <memory>
#include <vector>

namespace kiln {

class Communicator;

struct SlowestRank {
  double compute_ms = 0;  // the step's largest compute time over the ranks
  int rank = 0;           // whose (the lowest such rank)
};

struct Straggler {
  int rank = 0, stage = 0;
  double median_ms = 0;        // its median compute time a step
  double stage_median_ms = 0;  // the median over its stage's ranks of theirs
};

// Every rank's medians compared as above: the stragglers, by rank. median_ms[r], stage[r]: rank
// r's. A stage of one rank, or one without timed steps (median 0), is never flagged.
std::vector<Straggler> find_stragglers(const std::vector<double>& median_ms, const std::vector<int>& stage, double factor);

class StragglerWatch {
 public:
  // world: an MPI communicator of the world that is none of the mesh's (null: a world of one).
  StragglerWatch(std::shared_ptr<Communicator> world, int pp_stage, double factor);

  // One step: every rank's compute time (all[r], gathered by the caller) and this rank's, which
  // `timed` keeps for the median. Local.
  SlowestRank step(const std::vector<double>& all, double mine, bool timed);

  // The stragglers over the run, the same list on every rank. Collective over the world.
  std::vector<Straggler> finish();

 private:
  std::shared_ptr<Communicator> world_;
  int stage_ = 0;
  double factor_ = 1.2;
  std::vector<double> mine_;  // this rank's timed compute times
};

}  // namespace kiln
