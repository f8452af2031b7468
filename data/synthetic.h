// data/synthetic.h -- the built-in synthetic corpus, so the default run needs no download.
//
// A token stream with learnable structure: over an alphabet of A = min(vocab_size, 256) tokens,
// each token a has a fixed successor succ(a) (a random table). The next token is succ(previous)
// with probability 0.9 and a uniformly random alphabet token otherwise. A model that learns the
// table reaches the entropy rate H = -p ln p - (A - 1) q ln q nats per token, q = 0.1/A,
// p = 0.9 + q (~0.88 for A = 256), far below the ln(vocab) of an untrained model, so the loss
// visibly falls.
// The stream depends only on `corpus_seed`, not on the training seed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/token_source.h"

namespace kiln {

class SyntheticCorpus final : public TokenSource {
 public:
  static constexpr uint64_t kDefaultSeed = 20240520;
  SyntheticCorpus(int64_t num_tokens, int64_t vocab_size, uint64_t corpus_seed = kDefaultSeed);

  int64_t size() const override { return static_cast<int64_t>(tokens_.size()); }
  void read(int64_t offset, int64_t n, int64_t* out) const override;
  const std::string& name() const override { return name_; }

  // The entropy rate above, in nats per token: the loss floor of a perfect model.
  double entropy_per_token() const;
  int64_t alphabet() const { return alphabet_; }

 private:
  std::vector<uint16_t> tokens_;
  int64_t alphabet_;
  std::string name_ = "synthetic";
};

}  // namespace kiln
