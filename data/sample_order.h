// data/sample_order.h -- the global order in which training samples are visited.
//
// Position p of the training stream (p = 0, 1, 2, ...) maps to sample perm_e(p mod n), where
// e = p / n is the epoch and perm_e a pseudorandom permutation of [0, n) keyed by (seed, e):
// a 4-round Feistel network on the smallest even-bit domain 2^k >= n, with cycle walking to
// stay inside [0, n) (Black & Rogaway, 2002). O(1) memory for any n; the order depends only on
// the seed and n -- never on the parallel layout -- which is what makes every layout comparable
// to the single-process run and lets a checkpoint resume on another layout.
#pragma once

#include <cstdint>

namespace kiln {

class SampleOrder {
 public:
  // shuffle = false gives the identity order (used for evaluation).
  SampleOrder(int64_t num_samples, uint64_t seed, bool shuffle);

  // Sample index at stream position p >= 0.
  int64_t operator()(int64_t p) const;
  int64_t num_samples() const { return n_; }

 private:
  uint64_t permute(uint64_t x, uint64_t epoch) const;
  int64_t n_;
  uint64_t seed_;
  bool shuffle_;
  int half_bits_ = 1;  // the Feistel domain is 2^(2 * half_bits_)
};

}  // namespace kiln
