// runtime/checkpoint/async_save.h -- checkpoints written while training goes on (--async-save).
//
// A synchronous save stops every rank until rank 0 has written the whole consolidated checkpoint
// (runtime/checkpoint/checkpoint.h): for a 70B model with its optimizer, 1.1 TB at 2 GB/s, nine
// minutes of a whole cluster idle at every save. Here the step stalls only for a copy:
//   1. snapshot  each rank copies what it owns -- its parameters' fp32 weights, AdamW's moments
//                and step counts, or ZeRO's shards (WholeModel::snapshot, StateSnapshot) -- into
//                host memory: one pool per rank, pinned on a GPU, allocated (and its pages touched)
//                at set-up and reused by every save. The progress (step, updates, data position, loss scaler) is copied with
//                it. This is the step's stall.
//   2. write     a background thread on every rank runs the same Checkpointer::save as a
//                synchronous save, on a view of the snapshot (WholeModel's snapshot constructor)
//                whose gathers go over an MPI twin of the mesh and of the world, host memory
//                only, never the training's communicators: rank 0 writes the same files, one
//                tensor at a time, and commits them as a synchronous save does (a temporary
//                directory, renamed; then `latest`). The bytes are the synchronous save's, byte
//                for byte: the same tensors, gathered in the same order, written by the same code.
// Rules:
//   - at most one save in flight: the next start() waits for the previous one's write (the wait
//     is part of its stall and logged as `waited_s`);
//   - committed only when complete: a crash or kill mid-write leaves the previous checkpoint and
//     `latest` as they were (the commit protocol's);
//   - the end of the run, and a stop request, wait for the write (Trainer: wait());
//   - a failing write (disk full, read-only) is raised by the next poll() on rank 0 as the
//     kiln::Error the write threw: one line, the job ends; no earlier checkpoint is touched.
// The background gathers' collectives have a watchdog of their own, with --save-timeout.
// Test hooks (never set in a real run): KILN_TEST_SLOW_ASYNC_S=x holds each write back x seconds;
// KILN_TEST_ASYNC_HOLD_STEPS=k holds it back until the trainer has polled k more times (one poll a
// step record: k more steps trained meanwhile), at most 60 s, or until a start() or wait() waits for
// it -- an order a loaded machine keeps.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/consolidate.h"

namespace kiln {

class Communicator;
class Mesh;

class AsyncSaver {
 public:
  // checkpointer and live: the run's (every rank; rank 0 writes); host_mesh: an MPI mesh of the
  // run's shape without a device (null where the run has no mesh); host_world: an MPI group of
  // the world for pipeline stages' tensors (null in a world of one).
  AsyncSaver(Checkpointer& checkpointer, WholeModel& live, std::unique_ptr<Mesh> host_mesh,
             std::shared_ptr<Communicator> host_world);
  ~AsyncSaver();  // waits for a save in flight (its error, if any, is dropped: the run is ending)
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  struct Started {
    double waited_s = 0;    // for the previous save's write
    double snapshot_s = 0;  // the copy into host memory
    bool write_running = false;  // this rank found the previous save's write still running (it waited)
  };
  // Waits for the save in flight, snapshots this rank's state and starts writing `progress.step`'s
  // checkpoint in the background. Every rank calls it for the same steps.
  Started start(const TrainProgress& progress, const nlohmann::json& run);

  struct Done {
    int64_t step = 0;
    std::string dir;  // rank 0: the checkpoint's directory ("" elsewhere)
    CheckpointIo io;  // rank 0's figures of the write
  };
  // The saves completed since the last call (a start() that waited for one completes it), oldest
  // first; throws what a write threw.
  std::vector<Done> poll();
  // Blocks until the save in flight completes; then as poll().
  std::vector<Done> wait();
  bool in_flight() const { return thread_.joinable(); }
  int64_t snapshot_bytes() const { return snap_.bytes(); }

 private:
  Checkpointer& checkpointer_;
  WholeModel& live_;
  std::unique_ptr<Mesh> host_mesh_;
  std::shared_ptr<Communicator> host_world_;
  StateSnapshot snap_;
  std::thread thread_;
  std::atomic<bool> finished_{false};
  std::atomic<int64_t> polls_{0};  // poll() calls so far (KILN_TEST_ASYNC_HOLD_STEPS)
  std::atomic<bool> joining_{false};  // a join waits for the write: a test hold lets it go
  std::mutex mutex_;
  std::vector<Done> done_;  // completed, not yet collected
  std::string error_;
  int error_code_ = 0;
};

}  // namespace kiln
