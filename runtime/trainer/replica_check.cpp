// runtime/trainer/replica_check.cpp -- bit sums on the device, lists all-gathered, majorities.
#include "runtime/trainer/replica_check.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>

#include <ATen/ATen.h>

#include "distributed/comm.h"
#include "distributed/error.h"
#include "distributed/rank0_verdict.h"

namespace kiln {

at::Tensor bit_sum(const at::Tensor& t) {
  const at::Tensor flat = t.detach().contiguous().view({-1});
  at::ScalarType as = at::kInt;
  if (flat.element_size() == 2) as = at::kShort;
  else if (flat.element_size() == 8) as = at::kLong;
  else if (flat.element_size() == 1) as = at::kChar;
  const at::Tensor bits = flat.view(as);
  // A sum into int64 of an int16/int32 tensor makes an int64 copy of what it sums (4.2 GB for a
  // 128256 x 4096 embedding): summed a chunk at a time, the copy is kBitSumChunk x 8 bytes.
  const int64_t n = bits.numel();
  if (n <= kBitSumChunk) return at::sum(bits, at::kLong);
  at::Tensor total = at::zeros({}, bits.options().dtype(at::kLong));
  for (int64_t i = 0; i < n; i += kBitSumChunk) total.add_(at::sum(bits.narrow(0, i, std::min(kBitSumChunk, n - i)), at::kLong));
  return total;
}

std::vector<std::string> replica_disagreements(const std::vector<std::string>& rows) {
  // (key, name) -> rank -> hash, in rank order
  std::map<std::pair<std::string, std::string>, std::vector<std::pair<int, std::string>>> seen;
  std::vector<std::pair<std::string, std::string>> order;  // first appearance, for a stable report
  for (size_t r = 0; r < rows.size(); ++r) {
    std::istringstream in(rows[r]);
    std::string line;
    while (std::getline(in, line)) {
      const size_t a = line.find('|'), b = line.rfind('|');
      if (a == std::string::npos || a == b) continue;
      const auto id = std::make_pair(line.substr(0, a), line.substr(a + 1, b - a - 1));
      if (!seen.count(id)) order.push_back(id);
      seen[id].emplace_back(static_cast<int>(r), line.substr(b + 1));
    }
  }
  std::vector<std::string> out;
  for (const auto& id : order) {
    const auto& holders = seen[id];
    std::map<std::string, int> votes;
    for (const auto& [rank, h] : holders) ++votes[h];
    if (votes.size() < 2) continue;
    std::string majority;
    int most = 0;
    for (const auto& [h, n] : votes)
      if (n > most) most = n, majority = h;
    std::string differ, all;
    for (const auto& [rank, h] : holders) {
      all += (all.empty() ? "" : ", ") + std::to_string(rank);
      if (h != majority || most * 2 <= static_cast<int>(holders.size())) differ += (differ.empty() ? "" : ", ") + std::to_string(rank);
    }
    out.push_back(id.second + " differs on rank(s) " + differ + " among its replicas (ranks " + all + ")");
  }
  return out;
}

ReplicaCheck::ReplicaCheck(std::vector<ReplicaTensor> tensors, int rank) : tensors_(std::move(tensors)), rank_(rank) {
  if (const char* spec = std::getenv("KILN_TEST_FLIP_BIT")) {
    long long r = -1, step = -1;
    char which[8] = "first";
    const int n = std::sscanf(spec, "%lld:%lld:%7s", &r, &step, which);
    flip_last_ = std::string(which) == "last";
    if (n < 2 || step < 1 || (!flip_last_ && std::string(which) != "first")) {
      throw ConfigError(std::string("KILN_TEST_FLIP_BIT=") + spec + ": want RANK:STEP[:first|last], STEP >= 1");
    }
    if (r == rank_) flip_step_ = step;
  }
}

void ReplicaCheck::maybe_inject(int64_t step) {
  if (step != flip_step_ || tensors_.empty()) return;
  at::NoGradGuard no_grad;
  const at::Tensor& t = flip_last_ ? tensors_.back().tensor : tensors_.front().tensor;
  at::Tensor bits = t.detach().view({-1}).view(t.element_size() == 2 ? at::kShort : at::kInt);
  bits.narrow(0, 0, 1).bitwise_xor_(1 << 10);  // one bit of the first element's mantissa
}

void ReplicaCheck::check(Communicator* host, int64_t step) {
  if (!host || host->size() <= 1) return;
  std::vector<at::Tensor> sums;
  for (const auto& t : tensors_) sums.push_back(bit_sum(t.tensor).reshape({1}));
  const at::Tensor h = sums.empty() ? at::empty({0}, at::kLong) : at::cat(sums).to(at::kCPU);  // the check's one sync
  std::string mine;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    mine += tensors_[i].replicas + "|" + tensors_[i].name + "|" + std::to_string(h[static_cast<int64_t>(i)].item<int64_t>()) + "\n";
  }
  const std::vector<std::string> bad = replica_disagreements(all_gather_strings(*host, mine));
  if (bad.empty()) return;
  throw NumericsError("step " + std::to_string(step) + ": the replicas' weights disagree (--check-replicas): " + bad.front() +
                      (bad.size() > 1 ? " (and " + std::to_string(bad.size() - 1) + " more tensor(s))" : std::string()) +
                      "; silent data corruption on those ranks' devices? stopping before a save writes them");
}

}  // namespace kiln
