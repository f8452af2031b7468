// data/loader.cpp -- DataLoader: this rank's micro-batches, cut from the layout-independent stream.
#include "data/loader.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>

#include <ATen/ops/empty.h>

#include "distributed/error.h"

namespace kiln {

namespace {

// Runs before order_ is built, so a null dataset fails with a message instead of a crash.
int64_t samples_of(const std::shared_ptr<const TokenDataset>& data) {
  if (!data) throw std::invalid_argument("DataLoader: null dataset");
  return data->num_samples();
}

}  // namespace

DataLoader::DataLoader(std::shared_ptr<const TokenDataset> data, uint64_t seed, bool shuffle,
                       BatchLayout layout)
    : data_(std::move(data)), order_(samples_of(data_), seed, shuffle), layout_(layout) {
  if (layout_.micro_batch <= 0)
    throw ConfigError("micro-batch must be positive, got " + std::to_string(layout_.micro_batch));
  if (layout_.grad_accum <= 0)
    throw ConfigError("grad-accum must be positive, got " + std::to_string(layout_.grad_accum));
  if (layout_.dp_size <= 0)
    throw ConfigError("data-parallel size must be positive, got " +
                      std::to_string(layout_.dp_size));
  if (layout_.dp_rank < 0 || layout_.dp_rank >= layout_.dp_size)
    throw ConfigError("data-parallel rank " + std::to_string(layout_.dp_rank) + " outside [0, " +
                      std::to_string(layout_.dp_size) + ")");
  if (const char* spec = std::getenv("KILN_TEST_GARBAGE_SAMPLES")) {
    long long a = -1, b = -1;
    if (std::sscanf(spec, "%lld:%lld", &a, &b) != 2 || a < 0 || b <= a)
      throw ConfigError(std::string("KILN_TEST_GARBAGE_SAMPLES=") + spec + ": want A:B stream positions, A < B");
    garbage_start_ = a, garbage_end_ = b;
  }
}

void DataLoader::skip(std::vector<std::pair<int64_t, int64_t>> windows) {
  std::sort(windows.begin(), windows.end());
  for (size_t i = 0; i < windows.size(); ++i) {
    if (windows[i].first < 0 || windows[i].second <= windows[i].first || (i > 0 && windows[i].first < windows[i - 1].second))
      throw DataError("skipped data windows must be non-empty, disjoint [start, end) stream positions");
  }
  skipped_ = std::move(windows);
}

int64_t DataLoader::past_skipped(int64_t consumed) const {
  int64_t p = consumed;
  for (const auto& [a, b] : skipped_)
    if (p >= a) p += b - a;
  return p;
}

std::vector<std::pair<int64_t, int64_t>> DataLoader::stream_ranges(int64_t begin, int64_t end) const {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t c = begin; c < end;) {
    const int64_t p = past_skipped(c);
    int64_t next = std::numeric_limits<int64_t>::max();  // the next window's start after p
    for (const auto& [a, b] : skipped_)
      if (a > p) next = std::min(next, a);
    const int64_t n = std::min(end - c, next - p);
    out.emplace_back(p, p + n);
    c += n;
  }
  return out;
}

std::vector<std::pair<int64_t, int64_t>> DataLoader::with_skipped(std::vector<std::pair<int64_t, int64_t>> more) const {
  more.insert(more.end(), skipped_.begin(), skipped_.end());
  std::sort(more.begin(), more.end());
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& w : more) {
    if (!out.empty() && w.first <= out.back().second) out.back().second = std::max(out.back().second, w.second);
    else out.push_back(w);
  }
  return out;
}

int64_t DataLoader::position(int64_t step, int64_t micro, int64_t i) const {
  if (step < 0 || micro < 0 || micro >= layout_.grad_accum || i < 0 || i >= layout_.micro_batch)
    throw std::out_of_range("DataLoader::position: step " + std::to_string(step) + ", micro " +
                            std::to_string(micro) + ", sequence " + std::to_string(i) +
                            " outside the batch layout");
  if (step < resume_step_)
    throw std::out_of_range("DataLoader::position: step " + std::to_string(step) +
                            " is before the resume point " + std::to_string(resume_step_));
  const int64_t per_rank = layout_.micro_batch * layout_.grad_accum;
  return past_skipped(resume_samples_ + (step - resume_step_) * layout_.global_batch() + layout_.dp_rank * per_rank +
                      micro * layout_.micro_batch + i);
}

Batch DataLoader::get(int64_t step, int64_t micro) const {
  const int64_t mb = layout_.micro_batch;
  const int64_t T = data_->seq_len();
  Batch batch{at::empty({mb, T}, at::kLong), at::empty({mb, T}, at::kLong)};
  int64_t* x = batch.inputs.data_ptr<int64_t>();
  int64_t* y = batch.targets.data_ptr<int64_t>();
  for (int64_t i = 0; i < mb; ++i) {
    const int64_t p = position(step, micro, i);
    data_->sample(order_(p), x + i * T, y + i * T);
    if (p >= garbage_start_ && p < garbage_end_) {  // test-only: random tokens
      uint64_t z = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(p + 1);
      for (int64_t j = 0; j <= T; ++j) {
        z ^= z >> 31, z *= 0xBF58476D1CE4E5B9ull, z ^= z >> 29;
        const int64_t t = static_cast<int64_t>(z % static_cast<uint64_t>(data_->vocab_size()));
        if (j < T) x[i * T + j] = t;
        if (j > 0) y[i * T + j - 1] = t;
      }
    }
  }
  return batch;
}

int64_t DataLoader::step_targets(int64_t step) const {
  if (step < resume_step_) throw std::out_of_range("DataLoader::step_targets: step " + std::to_string(step) + " before the resume point");
  const int64_t G = layout_.global_batch(), first = resume_samples_ + (step - resume_step_) * G;
  int64_t n = 0;
  for (int64_t k = 0; k < G; ++k) {
    const int64_t p = past_skipped(first + k);
    n += p >= garbage_start_ && p < garbage_end_ ? data_->seq_len() : data_->trained_targets(order_(p));
  }
  return n;
}

}  // namespace kiln
