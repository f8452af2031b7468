// data/prefetch.h -- the next step's micro-batches, made on a thread of their own while this step
// trains, in page-locked memory on a GPU run.
//
// DataLoader::get() reads tokens from the memory-mapped shards into new int64 tensors: host work
// between two steps, on the critical path when done in line. And pageable tensors make a
// `non_blocking` copy to the GPU synchronous. Here the step's grad_accum micro-batches are made
// one step ahead by a worker thread, in page-locked memory when `pinned` (the copies to the
// device then overlap compute), and taken whole: take(step) returns step's batches (made at once
// if they were not the ones prefetched, as after a resume) and starts on step + 1's. The batches
// are exactly DataLoader::get()'s: prefetching changes where they are made, never what they are.
// Memory: two steps' micro-batches (2 x grad_accum x 2 x micro_batch x T x 8 bytes).
#pragma once

#include <cstdint>
#include <future>
#include <vector>

#include "data/loader.h"

namespace kiln {

class BatchPrefetcher {
 public:
  // loader must outlive the prefetcher; last_step: no step at or past it is prefetched.
  BatchPrefetcher(const DataLoader& loader, int64_t grad_accum, bool pinned, int64_t last_step);
  ~BatchPrefetcher();  // waits for a prefetch in flight
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // The micro-batches of `step`, in order. Rethrows a failure of the worker (a data error).
  std::vector<Batch> take(int64_t step);

 private:
  std::vector<Batch> make(int64_t step) const;
  const DataLoader& loader_;
  int64_t grad_accum_;
  bool pinned_;
  int64_t last_step_;
  int64_t next_ = -1;  // the step being prefetched, or -1
  std::future<std::vector<Batch>> ahead_;
};

}  // namespace kiln
