// data/token_dataset.h -- token sources cut into training samples of seq_len + 1 tokens.
//
// Source k of n_k tokens holds floor((n_k - 1) / T) samples; sample j of that source is tokens
// [j*T, j*T + T + 1): inputs are the first T, targets the last T (shifted by one). Samples never
// cross a source boundary. Samples are numbered source by source in the order given (files from
// a glob are sorted by path), so the numbering depends on the data alone. Target j of a sample is
// token j + 1: a source's target mask (kiln prep --chat) says which are trained on.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/token_file.h"
#include "data/token_source.h"

namespace kiln {

class TokenDataset {
 public:
  // Throws DataError if the sources together hold no sample of seq_len + 1 tokens.
  TokenDataset(std::vector<std::shared_ptr<const TokenSource>> sources, int64_t seq_len,
               int64_t vocab_size);

  // Expands each pattern as a glob (sorted; a pattern may also be a comma-separated list) and
  // maps every file. Throws DataError naming `flag` (the option the patterns came from) and the
  // pattern that matches no file.
  static TokenDataset from_paths(const std::vector<std::string>& patterns, TokenFormat format,
                                 int64_t seq_len, int64_t vocab_size, const std::string& flag = "--data");

  int64_t num_samples() const { return total_samples_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t vocab_size() const { return vocab_size_; }
  int64_t num_tokens() const;
  const std::vector<std::shared_ptr<const TokenSource>>& sources() const { return sources_; }

  // What the sample order depends on, source by source: its token count and a fingerprint of
  // its tokens (FNV-1a over the count and the first, middle and last 4096 tokens: cheap on any
  // size, and it tells apart files that are not the same data). The names are not part of it, so
  // the same file named another way (./shards/x.bin, an absolute path) has the same fingerprint.
  struct SourceFingerprint {
    std::string name;
    int64_t tokens = 0;
    uint64_t hash = 0;
  };
  std::vector<SourceFingerprint> fingerprints() const;
  // Writes sample i's inputs to x[0..T) and targets to y[0..T). Throws DataError naming the
  // source and the token's position if a token is outside [0, vocab_size). A target its source's
  // mask does not train on (data/target_mask.h) is kIgnoreTarget.
  void sample(int64_t i, int64_t* x, int64_t* y) const;
  // Whether any source has a target mask, and sample i's targets trained on (T without one).
  bool masked() const { return masked_; }
  int64_t trained_targets(int64_t i) const;

 private:
  std::vector<std::shared_ptr<const TokenSource>> sources_;
  std::vector<int64_t> first_sample_;  // first global sample index of each source, plus the total
  int64_t seq_len_;
  int64_t vocab_size_;
  int64_t total_samples_ = 0;
  bool masked_ = false;
};

}  // namespace kiln
