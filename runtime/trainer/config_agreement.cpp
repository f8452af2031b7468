// runtime/trainer/config_agreement.cpp -- a hash of the settings all-gathered; on a mismatch, the
// settings themselves, to name what differs.
#include "runtime/trainer/config_agreement.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "distributed/comm.h"
#include "distributed/rank0_verdict.h"

namespace kiln {
namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string flag_of(const std::string& key) {
  std::string f = "--" + key;
  for (char& c : f)
    if (c == '_') c = '-';
  return f;
}

}  // namespace

nlohmann::json compared_settings(const nlohmann::json& config, const std::string& device_kind) {
  nlohmann::json out = config;
  for (const char* key : {"log_json", "tensorboard"}) out.erase(key);
  out["device"] = device_kind;
  return out;
}

std::string config_disagreement(const nlohmann::json& config, const c10::Device& device, Communicator& host) {
  if (host.size() <= 1) return "";
  const std::string mine = compared_settings(config, c10::DeviceTypeName(device.type(), /*lower_case=*/true)).dump();
  const uint64_t h = fnv1a(mine);
  int64_t as_signed = 0;
  std::memcpy(&as_signed, &h, sizeof h);
  // Host tensors on purpose: `host` is the host group (MPI, no device), never a run's NCCL group.
  at::Tensor hash = at::tensor({as_signed}, at::kLong), hashes = at::empty({host.size()}, at::kLong);
  host.all_gather(hashes, hash)->wait();
  if ((hashes == hashes[0]).all().item<bool>()) return "";

  // Rare: name what differs. Every rank has every rank's settings and reaches the same line.
  const std::vector<std::string> dumps = all_gather_strings(host, mine);
  const nlohmann::json first = nlohmann::json::parse(dumps[0]);
  int differing = 0, first_rank = -1;
  for (size_t r = 1; r < dumps.size(); ++r)
    if (dumps[r] != dumps[0]) ++differing, first_rank = first_rank < 0 ? static_cast<int>(r) : first_rank;
  const nlohmann::json other = nlohmann::json::parse(dumps[static_cast<size_t>(first_rank)]);
  std::string key = "(the settings' set)", a = "-", b = "-";
  nlohmann::json keys = first;
  keys.update(other);  // both ranks' keys, in order
  for (const auto& [k, v] : keys.items()) {
    const nlohmann::json x = first.value(k, nlohmann::json()), y = other.value(k, nlohmann::json());
    if (x == y) continue;
    key = flag_of(k), a = x.dump(), b = y.dump();
    break;
  }
  return "the ranks were started with different settings: " + key + " is " + a + " on rank 0 but " + b + " on rank " +
         std::to_string(first_rank) + " (" + std::to_string(differing) + " of " + std::to_string(host.size()) +
         " ranks differ from rank 0): start every rank with the same flags";
}

}  // namespace kiln
