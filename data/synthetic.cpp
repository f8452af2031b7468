// data/synthetic.cpp -- SyntheticCorpus: a successor-table token stream with a known loss floor.
#include "data/synthetic.h"

#include <algorithm>
#include <cmath>

#include "distributed/error.h"

namespace kiln {

namespace {

// splitmix64: tiny, and its output is fixed by the algorithm, so the corpus is the same with
// every compiler and standard library (std:: distributions are not specified bit-exactly).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Modulo bias is below 2^-55 for the n <= 256 used here.
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
  // Uniform in [0, 1) from the top 53 bits.
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

constexpr double kFollowProb = 0.9;

}  // namespace

SyntheticCorpus::SyntheticCorpus(int64_t num_tokens, int64_t vocab_size, uint64_t corpus_seed)
    : alphabet_(std::min<int64_t>(vocab_size, 256)) {
  if (num_tokens <= 1)
    throw ConfigError("synthetic corpus needs at least 2 tokens, got " +
                      std::to_string(num_tokens));
  if (vocab_size <= 0)
    throw ConfigError("synthetic corpus needs a positive vocab-size, got " +
                      std::to_string(vocab_size));

  SplitMix64 rng(corpus_seed);
  std::vector<uint16_t> succ(static_cast<size_t>(alphabet_));
  for (auto& s : succ) s = static_cast<uint16_t>(rng.below(alphabet_));

  tokens_.resize(static_cast<size_t>(num_tokens));
  tokens_[0] = static_cast<uint16_t>(rng.below(alphabet_));
  for (size_t i = 1; i < tokens_.size(); ++i) {
    // Draw both numbers every step so the stream's randomness does not depend on the branch.
    const double u = rng.unit();
    const auto other = static_cast<uint16_t>(rng.below(alphabet_));
    tokens_[i] = u < kFollowProb ? succ[tokens_[i - 1]] : other;
  }
}

void SyntheticCorpus::read(int64_t offset, int64_t n, int64_t* out) const {
  std::copy(tokens_.begin() + offset, tokens_.begin() + offset + n, out);
}

double SyntheticCorpus::entropy_per_token() const {
  // Next-token distribution: the successor with p = 0.9 + 0.1/A, each of the other A - 1
  // tokens with q = 0.1/A.  H = -p ln p - (A - 1) q ln q.
  const double a = static_cast<double>(alphabet_);
  const double q = (1.0 - kFollowProb) / a;
  const double p = kFollowProb + q;
  return -p * std::log(p) - (a - 1.0) * q * std::log(q);
}

}  // namespace kiln
