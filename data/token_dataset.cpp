// data/token_dataset.cpp -- TokenDataset: token sources cut into seq_len + 1 token samples.
#include "data/token_dataset.h"

#include <algorithm>
#include <stdexcept>

#include "data/paths.h"
#include "data/target_mask.h"
#include "distributed/error.h"

namespace kiln {

namespace {

// Source names for a message, shortened when a glob matched many files.
std::string describe(const std::vector<std::shared_ptr<const TokenSource>>& sources) {
  constexpr size_t kShown = 3;
  std::string s;
  for (size_t k = 0; k < sources.size() && k < kShown; ++k)
    s += (k ? ", " : "") + sources[k]->name();
  if (sources.size() > kShown) s += " and " + std::to_string(sources.size() - kShown) + " more";
  return s.empty() ? std::string("(no data source)") : s;
}

}  // namespace

TokenDataset::TokenDataset(std::vector<std::shared_ptr<const TokenSource>> sources,
                           int64_t seq_len, int64_t vocab_size)
    : sources_(std::move(sources)), seq_len_(seq_len), vocab_size_(vocab_size) {
  if (seq_len_ <= 0) throw ConfigError("seq-len must be positive, got " + std::to_string(seq_len_));
  if (vocab_size_ <= 0)
    throw ConfigError("vocab-size must be positive, got " + std::to_string(vocab_size_));
  for (const auto& src : sources_)
    if (!src) throw std::invalid_argument("TokenDataset: null token source");
  first_sample_.reserve(sources_.size() + 1);
  for (const auto& src : sources_) {
    masked_ = masked_ || src->masked();
    first_sample_.push_back(total_samples_);
    const int64_t n = src->size();
    total_samples_ += n > 0 ? (n - 1) / seq_len_ : 0;
  }
  first_sample_.push_back(total_samples_);
  if (total_samples_ == 0)
    throw DataError(describe(sources_) + ": fewer than seq_len+1 = " +
                    std::to_string(seq_len_ + 1) + " tokens, no training sample");
}

TokenDataset TokenDataset::from_paths(const std::vector<std::string>& patterns,
                                      TokenFormat format, int64_t seq_len, int64_t vocab_size,
                                      const std::string& flag) {
  std::vector<std::shared_ptr<const TokenSource>> sources;
  for (const auto& path : expand_paths(patterns, flag)) sources.push_back(std::make_shared<const TokenFile>(path, format));
  if (sources.empty()) throw DataError("--data: no data file given");
  return TokenDataset(std::move(sources), seq_len, vocab_size);
}

std::vector<TokenDataset::SourceFingerprint> TokenDataset::fingerprints() const {
  constexpr int64_t kWindow = 4096;
  std::vector<SourceFingerprint> out;
  std::vector<int64_t> tokens(kWindow);
  for (const auto& src : sources_) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a, 64-bit
    auto mix = [&h](uint64_t v) {
      for (int b = 0; b < 8; ++b) h = (h ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
    };
    const int64_t n = src->size();
    mix(static_cast<uint64_t>(n));
    for (const int64_t start : {int64_t{0}, std::max<int64_t>(0, n / 2 - kWindow / 2), std::max<int64_t>(0, n - kWindow)}) {
      const int64_t len = std::min(kWindow, n - start);
      src->read(start, len, tokens.data());
      for (int64_t i = 0; i < len; ++i) mix(static_cast<uint64_t>(tokens[static_cast<size_t>(i)]));
    }
    out.push_back({src->name(), n, h});
  }
  return out;
}

int64_t TokenDataset::num_tokens() const {
  int64_t total = 0;
  for (const auto& src : sources_) total += src->size();
  return total;
}

void TokenDataset::sample(int64_t i, int64_t* x, int64_t* y) const {
  if (i < 0 || i >= total_samples_)
    throw std::out_of_range("TokenDataset::sample: index " + std::to_string(i) +
                            " outside [0, " + std::to_string(total_samples_) + ")");
  // The last source whose first sample is <= i; empty sources share their successor's start,
  // and upper_bound steps past them.
  const auto it = std::upper_bound(first_sample_.begin(), first_sample_.end(), i);
  const size_t k = static_cast<size_t>(it - first_sample_.begin()) - 1;
  const TokenSource& src = *sources_[k];
  const int64_t T = seq_len_;
  const int64_t offset = (i - first_sample_[k]) * T;

  // Read the T + 1 tokens straight into x and y without a scratch buffer: x holds tokens
  // [0, T), y is x shifted by one plus token T.
  src.read(offset, T, x);
  std::copy(x + 1, x + T, y);
  src.read(offset + T, 1, y + T - 1);

  auto check = [&](int64_t v, int64_t pos) {
    if (v < 0 || v >= vocab_size_)
      throw DataError(src.name() + ": token " + std::to_string(v) + " at position " +
                      std::to_string(pos) + " is outside the vocabulary (vocab-size " +
                      std::to_string(vocab_size_) + ")");
  };
  for (int64_t t = 0; t < T; ++t) check(x[t], offset + t);
  check(y[T - 1], offset + T);
  if (src.masked())
    for (int64_t t = 0; t < T; ++t)
      if (!src.trained_at(offset + t + 1)) y[t] = kIgnoreTarget;
}

int64_t TokenDataset::trained_targets(int64_t i) const {
  if (i < 0 || i >= total_samples_) throw std::out_of_range("TokenDataset::trained_targets: index " + std::to_string(i));
  const auto it = std::upper_bound(first_sample_.begin(), first_sample_.end(), i);
  const size_t k = static_cast<size_t>(it - first_sample_.begin()) - 1;
  return sources_[k]->trained((i - first_sample_[k]) * seq_len_ + 1, seq_len_);
}

}  // namespace kiln
