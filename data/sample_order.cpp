// data/sample_order.cpp -- SampleOrder: a keyed Feistel permutation of the samples per epoch.
#include "data/sample_order.h"

#include <stdexcept>
#include <string>

#include "distributed/error.h"

namespace kiln {

namespace {

constexpr int kRounds = 4;
constexpr int kMaxHalfBits = 32;  // a 64-bit domain covers every int64 sample count

// The splitmix64 finalizer: a cheap bijective mixer whose output bits all depend on every input
// bit, which is what a Feistel round function needs.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t round_key(uint64_t seed, uint64_t epoch, int round) {
  // Chained mixing with distinct odd offsets keeps (seed, epoch, round) triples from colliding
  // the way a plain sum or xor of them would.
  uint64_t k = mix64(seed + 0x9e3779b97f4a7c15ULL);
  k = mix64(k ^ (epoch + 0xd1b54a32d192ed03ULL));
  return mix64(k ^ (static_cast<uint64_t>(round) + 0x8cb92ba72f3d8dd7ULL));
}

}  // namespace

SampleOrder::SampleOrder(int64_t num_samples, uint64_t seed, bool shuffle)
    : n_(num_samples), seed_(seed), shuffle_(shuffle) {
  if (n_ <= 0)
    throw DataError("sample order: no training sample (num_samples = " + std::to_string(n_) + ")");
  const uint64_t n = static_cast<uint64_t>(n_);
  while (half_bits_ < kMaxHalfBits && (uint64_t{1} << (2 * half_bits_)) < n) ++half_bits_;
}

uint64_t SampleOrder::permute(uint64_t x, uint64_t epoch) const {
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  uint64_t left = x >> half_bits_;
  uint64_t right = x & mask;
  for (int r = 0; r < kRounds; ++r) {
    const uint64_t f = mix64(right ^ round_key(seed_, epoch, r)) & mask;
    const uint64_t next_right = left ^ f;
    left = right;
    right = next_right;
  }
  return (left << half_bits_) | right;
}

int64_t SampleOrder::operator()(int64_t p) const {
  if (p < 0) throw std::out_of_range("SampleOrder: negative stream position " + std::to_string(p));
  const uint64_t epoch = static_cast<uint64_t>(p / n_);
  const uint64_t x = static_cast<uint64_t>(p % n_);
  if (!shuffle_) return static_cast<int64_t>(x);
  // Cycle walking: the domain 2^(2h) is below 4n, so this takes fewer than 4 steps on average,
  // and it terminates because x's cycle under the permutation contains x itself (< n).
  const uint64_t n = static_cast<uint64_t>(n_);
  uint64_t y = permute(x, epoch);
  while (y >= n) y = permute(y, epoch);
  return static_cast<int64_t>(y);
}

}  // namespace kiln
