// distributed/rank0_verdict.cpp -- rank 0's verdict as one string: a kind letter, then the message.
#include "distributed/rank0_verdict.h"

#include <algorithm>
#include <cstring>

#include <ATen/ATen.h>

#include "distributed/comm.h"
#include "distributed/error.h"

namespace kiln {

// Host tensors on purpose: `host` is the host group (MPI, no device), never a run's device group.
std::string broadcast_string(Communicator& host, const std::string& s) {
  auto len = at::tensor({static_cast<int64_t>(s.size())}, at::kLong);
  host.broadcast(len, 0)->wait();
  const int64_t n = len.item<int64_t>();
  auto bytes = at::empty({n}, at::kByte);
  if (host.rank() == 0 && n > 0) std::memcpy(bytes.data_ptr<uint8_t>(), s.data(), static_cast<size_t>(n));
  if (n > 0) host.broadcast(bytes, 0)->wait();
  return std::string(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), static_cast<size_t>(n));
}

std::vector<std::string> all_gather_strings(Communicator& host, const std::string& mine) {
  const int n = host.size();
  at::Tensor len = at::tensor({static_cast<int64_t>(mine.size())}, at::kLong), lens = at::empty({n}, at::kLong);
  host.all_gather(lens, len)->wait();
  const int64_t longest = std::max<int64_t>(1, lens.max().item<int64_t>());
  at::Tensor row = at::zeros({longest}, at::kByte), all = at::empty({n * longest}, at::kByte);
  if (!mine.empty()) std::memcpy(row.data_ptr<uint8_t>(), mine.data(), mine.size());
  host.all_gather(all, row)->wait();
  std::vector<std::string> out;
  const char* bytes = reinterpret_cast<const char*>(all.data_ptr<uint8_t>());
  for (int r = 0; r < n; ++r) out.emplace_back(bytes + r * longest, static_cast<size_t>(lens[r].item<int64_t>()));
  return out;
}

void decide_on_rank0(Communicator* host, const std::function<void()>& check) {
  // Kinds: O fine, C ConfigError, D DataError, E another kiln::Error (with its exit code).
  std::string verdict = "O";
  if (host == nullptr || host->rank() == 0) {
    try {
      check();
    } catch (const ConfigError& e) {
      verdict = std::string("C") + e.what();
    } catch (const DataError& e) {
      verdict = std::string("D") + e.what();
    } catch (const Error& e) {
      verdict = "E" + std::to_string(e.exit_code()) + ":" + e.what();
    }
  }
  if (host != nullptr && host->size() > 1) verdict = broadcast_string(*host, verdict);
  const std::string rest = verdict.substr(1);
  switch (verdict[0]) {
    case 'C': throw ConfigError(rest);
    case 'D': throw DataError(rest);
    case 'E': {
      const size_t colon = rest.find(':');
      throw Error(rest.substr(colon + 1), std::stoi(rest.substr(0, colon)));
    }
    default: return;
  }
}

std::vector<double> all_gather_doubles(Communicator* host, const std::vector<double>& mine) {
  if (!host || host->size() <= 1) return mine;
  const int64_t n = static_cast<int64_t>(mine.size());
  at::Tensor row = at::tensor(mine, at::kDouble), all = at::empty({host->size() * n}, at::kDouble);
  host->all_gather(all, row)->wait();
  return std::vector<double>(all.data_ptr<double>(), all.data_ptr<double>() + all.numel());
}

}  // namespace kiln
