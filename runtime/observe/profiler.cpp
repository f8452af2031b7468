// runtime/observe/profiler.cpp -- LibTorch's Kineto profiler: enable, disable, the trace, the summary.
#include "runtime/observe/profiler.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <utility>

#include <torch/csrc/autograd/profiler_kineto.h>

#include "distributed/error.h"

namespace kiln {

namespace {

namespace tp = torch::profiler::impl;
namespace ap = torch::autograd::profiler;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// libkineto::ActivityType's CPU_OP: the host operators (ATen ops, autograd nodes).
constexpr uint8_t kCpuOp = 0;

}  // namespace

nlohmann::json ProfileSummary::to_json() const {
  nlohmann::json top_json = nlohmann::json::array();
  for (const auto& e : top) top_json.push_back({{"name", e.name.substr(0, 240)}, {"ms", e.ms}, {"calls", e.calls}});
  return {{"device", device}, {"wall_ms", wall_ms}, {"total_ms", total_ms},
          {"busy_ms", busy_ms}, {"busy", device && wall_ms > 0 ? nlohmann::json(busy_ms / wall_ms) : nlohmann::json(nullptr)},
          {"events", events}, {"top", top_json}};
}

std::string ProfileSummary::table() const {
  std::string out;
  char buf[512];
  if (device) {
    std::snprintf(buf, sizeof buf,
                  "profile: %.1f ms of window, device busy %.1f ms (%.1f%%), %.1f ms of summed device time in %lld events\n",
                  wall_ms, busy_ms, wall_ms > 0 ? 100.0 * busy_ms / wall_ms : 0.0, total_ms, static_cast<long long>(events));
  } else {
    std::snprintf(buf, sizeof buf, "profile: %.1f ms of window, host operators (inclusive times), %lld events\n", wall_ms,
                  static_cast<long long>(events));
  }
  out += buf;
  std::snprintf(buf, sizeof buf, "%10s %6s %8s  %s\n", "ms", "share", "calls", device ? "kernel / copy" : "operator");
  out += buf;
  for (const auto& e : top) {
    std::string name = e.name.size() > 110 ? e.name.substr(0, 107) + "..." : e.name;
    std::snprintf(buf, sizeof buf, "%10.2f %5.1f%% %8lld  %s\n", e.ms, total_ms > 0 ? 100.0 * e.ms / total_ms : 0.0,
                  static_cast<long long>(e.calls), name.c_str());
    out += buf;
  }
  return out;
}

StepProfiler::StepProfiler(std::string path, int rank, bool cuda, int top_n)
    : path_(rank == 0 ? std::move(path) : path + ".rank" + std::to_string(rank)), cuda_(cuda), top_n_(top_n) {
  // Fail before training, not after the window: the trace file must be writable.
  std::FILE* f = std::fopen(path_.c_str(), "w");
  if (!f) throw ConfigError("--profile " + path_ + ": cannot open for writing");
  std::fclose(f);
}

StepProfiler::~StepProfiler() {
  if (active_) {
    try {
      ap::disableProfiler();
    } catch (...) {
    }
  }
}

void StepProfiler::start() {
  const tp::ProfilerConfig config(tp::ProfilerState::KINETO);
  std::set<tp::ActivityType> activities{tp::ActivityType::CPU};
  if (cuda_) activities.insert(tp::ActivityType::CUDA);
  ap::prepareProfiler(config, activities);
  ap::enableProfiler(config, activities);
  active_ = true;
  start_ns_ = now_ns();
}

ProfileSummary StepProfiler::stop() {
  ProfileSummary s;
  if (!active_) return s;
  s.wall_ms = static_cast<double>(now_ns() - start_ns_) / 1e6;
  std::unique_ptr<ap::ProfilerResult> result = ap::disableProfiler();
  active_ = false;
  result->save(path_);

  std::map<std::string, ProfileEntry> by_name;
  std::vector<std::pair<uint64_t, uint64_t>> intervals;
  for (const auto& e : result->events()) {
    const bool on_device = e.deviceType() == c10::DeviceType::CUDA;
    if (on_device) s.device = true;
  }
  for (const auto& e : result->events()) {
    const bool on_device = e.deviceType() == c10::DeviceType::CUDA;
    if (s.device ? !on_device : e.activityType() != kCpuOp) continue;
    ProfileEntry& entry = by_name[e.name()];
    entry.name = e.name();
    entry.ms += static_cast<double>(e.durationNs()) / 1e6;
    entry.calls += 1;
    ++s.events;
    if (on_device) intervals.emplace_back(e.startNs(), e.endNs());
  }
  if (s.device) {
    std::sort(intervals.begin(), intervals.end());
    uint64_t lo = 0, hi = 0, busy = 0;
    bool open = false;
    for (const auto& [a, b] : intervals) {
      if (open && a <= hi) {
        hi = std::max(hi, b);
        continue;
      }
      if (open) busy += hi - lo;
      lo = a;
      hi = b;
      open = true;
    }
    if (open) busy += hi - lo;
    s.busy_ms = static_cast<double>(busy) / 1e6;
  }
  std::vector<ProfileEntry> all;
  for (auto& [name, entry] : by_name) {
    s.total_ms += entry.ms;
    all.push_back(std::move(entry));
  }
  std::sort(all.begin(), all.end(), [](const ProfileEntry& a, const ProfileEntry& b) { return a.ms > b.ms; });
  if (static_cast<int>(all.size()) > top_n_) all.resize(top_n_);
  s.top = std::move(all);
  return s;
}

}  // namespace kiln
