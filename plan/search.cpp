// plan/search.cpp -- enumerate, evaluate, drop what does not fit, rank, explain.
#include "plan/search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "distributed/error.h"

namespace kiln::plan {

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0) out.push_back(i);
  return out;
}

int simplicity(const Layout& l) {  // lower is simpler
  return l.zero * 10000 + static_cast<int>(l.offload) * 1000 + static_cast<int>(l.recompute) * 100 + (l.cp > 1 ? 10 : 0) +
         (l.ep > 1 ? 20 : 0) + (l.sp ? 1 : 0) + (l.zero_accum == ZeroAccum::Local ? 100000 : 0);
}

std::string ms(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, seconds >= 1e-3 ? "%.1f ms" : "%.3f ms", seconds * 1e3);
  return buf;
}

std::string gb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GB", bytes / 1e9);
  return buf;
}

double recompute_s(const Plan& p) {
  const double hw = p.flops_per_token + p.recompute_flops_per_token;
  return p.compute_s * p.recompute_flops_per_token / hw;
}

}  // namespace

std::string describe(const Layout& l) {
  char buf[224];
  const std::string cp = l.cp > 1 ? " cp " + std::to_string(l.cp) : "";
  const std::string ep = l.ep > 1 ? " (ep " + std::to_string(l.ep) + ")" : "";  // carved out of dp
  const std::string v = l.pp_virtual > 1 ? " x " + std::to_string(l.pp_virtual) + " chunks" : l.zero_bubble ? " (ZB-H1)" : "";
  std::snprintf(buf, sizeof buf, "dp %lld%s%s tp %lld%s pp %lld%s, ZeRO-%d%s, offload %s, AC %s, mb %lld x %lld",
                static_cast<long long>(l.dp), ep.c_str(), cp.c_str(), static_cast<long long>(l.tp), l.sp ? " (sp)" : "",
                static_cast<long long>(l.pp), v.c_str(), l.zero,
                (l.zero >= 2 && l.grad_accum > 1) ? (l.zero_accum == ZeroAccum::Local ? " (accum local)" : " (accum reduce)") : "",
                to_string(l.offload).c_str(), to_string(l.recompute).c_str(), static_cast<long long>(l.micro_batch),
                static_cast<long long>(l.grad_accum));
  return l.pp_split.empty() ? std::string(buf) : std::string(buf) + ", pp split " + l.pp_split;
}

namespace {
// Less than 10% of the device memory left: allocator fragmentation and what the model leaves
// out (workspaces, the CUDA context) can take that much.
bool tight(const Plan& p) { return p.peak_device_bytes() > 0.9 * p.cluster.device_memory; }

// The first criterion after time on which a and b differ, as a short reason; "" if none.
std::string tie_break(const Plan& a, const Plan& b, int* order) {
  if (a.layout.micro_batch != b.layout.micro_batch) {
    *order = a.layout.micro_batch > b.layout.micro_batch ? -1 : 1;
    return "larger micro-batch (GEMM efficiency, which the model does not see)";
  }
  if (tight(a) != tight(b)) {
    *order = tight(a) ? 1 : -1;
    return "leaves at least 10% of device memory free";
  }
  if (simplicity(a.layout) != simplicity(b.layout)) {
    *order = simplicity(a.layout) < simplicity(b.layout) ? -1 : 1;
    return "simpler setting (fewer collectives and copies, whose latency the model does not see)";
  }
  const double ma = a.peak_device_bytes(), mb = b.peak_device_bytes();
  if (std::fabs(ma - mb) > 1e-9 * std::max(ma, mb)) {
    *order = ma < mb ? -1 : 1;
    return "needs less device memory";
  }
  *order = 0;
  return "";
}

// Step times compared to the microsecond: an integer key keeps the order a strict weak one.
int64_t time_key(const Plan& p) { return std::llround(p.step_s * 1e6); }
bool same_time(const Plan& a, const Plan& b) { return time_key(a) == time_key(b); }
}  // namespace

bool ranks_before(const Plan& a, const Plan& b) {
  if (!same_time(a, b)) return time_key(a) < time_key(b);
  int order = 0;
  tie_break(a, b, &order);
  return order < 0;
}

std::string explain(const Plan& a, const Plan* next) {
  std::string out = "step " + ms(a.step_s) + " = compute " + ms(a.compute_s);
  if (a.recompute_flops_per_token > 0) out += " (recompute " + ms(recompute_s(a)) + ")";
  out += " + exposed comm " + ms(a.exposed_comm_s) + " + bubble " + ms(a.bubble_s) + "; " +
         gb(a.cluster.device_memory - a.peak_device_bytes()) + " of device memory to spare";
  if (!next) return out;
  const double dt = next->step_s - a.step_s;
  if (same_time(a, *next)) {
    int order = 0;
    const std::string why = tie_break(a, *next, &order);
    return out + "; ties with the next (" + describe(next->layout) + ") on time" + (why.empty() ? "" : ", " + why);
  }
  std::vector<std::string> why;
  auto component = [&](const char* name, double mine, double theirs) {
    const double diff = theirs - mine;
    if (diff > 0.01 * dt) why.push_back(name + std::string(" -") + ms(diff));
    else if (diff < -0.01 * dt) why.push_back(name + std::string(" +") + ms(-diff));
  };
  component("exposed comm", a.exposed_comm_s, next->exposed_comm_s);
  component("bubble", a.bubble_s, next->bubble_s);
  component("recompute", recompute_s(a), recompute_s(*next));
  std::string line = out + "; " + ms(dt) + " faster than the next (" + describe(next->layout) + "):";
  for (size_t i = 0; i < why.size(); ++i) line += (i ? ", " : " ") + why[i];
  return line;
}

SearchResult search(const GPTConfig& model, const ClusterSpec& cluster, const SearchSpace& space) {
  model.validate();
  cluster.validate();
  if (space.global_batch < 1) throw ConfigError("--global-batch must be at least 1 sequence (got " + std::to_string(space.global_batch) + ")");
  SearchResult res;
  std::vector<Plan> fitting;
  const int64_t devices = cluster.devices();
  bool any_dp = false;
  // The mesh shapes: dp x cp x tp x pp = devices; cp where 2 cp divides the sequence; sp on and
  // off wherever tp > 1; for an MoE model ep over the divisors of dp that divide the experts; with
  // pp > 1 the interleaved schedule's 2 and 4 chunks a stage and ZB-H1 besides 1F1B. Layouts kiln refuses
  // (tp not dividing the heads, 2 cp tp not dividing the sequence under sp, a micro-batch count the
  // interleaved schedule cannot use...) are counted by the validation below.
  struct Shape {
    int64_t dp, cp, tp, pp;
    bool sp;
    int64_t ep;
    int64_t chunks;
    bool zero_bubble;
  };
  std::vector<Shape> shapes;
  for (int64_t tp : divisors(devices))
    for (int64_t pp : divisors(devices / tp))
      for (int64_t cp : divisors(devices / (tp * pp))) {
        if (cp > 1 && model.seq_len % (2 * cp) != 0) continue;
        const int64_t dp = devices / (tp * pp * cp);
        for (int64_t ep : divisors(dp)) {
          if (ep > 1 && !(model.is_moe() && model.n_experts % ep == 0)) continue;
          for (bool sp : {false, true})
            for (int64_t chunks : {1, 2, 4})
              for (bool zb : {false, true})
                if ((!sp || tp > 1) && (chunks == 1 || pp > 1) && (!zb || (pp > 1 && chunks == 1)))
                  shapes.push_back({dp, cp, tp, pp, sp, ep, chunks, zb});
        }
      }
  for (const Shape& shape : shapes) {
    if (space.global_batch % shape.dp != 0) continue;
    any_dp = true;
    const int64_t per_rank = space.global_batch / shape.dp;
    for (int64_t mb : divisors(per_rank)) {
      if (space.max_micro_batch > 0 && mb > space.max_micro_batch) continue;
      for (int zero : space.zero_stages) {
        for (Offload off : space.offload) {
          for (Recompute rc : space.recompute) {
            for (ZeroAccum acc : {ZeroAccum::Reduce, ZeroAccum::Local}) {
              Layout l = space.base;
              l.dp = shape.dp, l.cp = shape.cp, l.tp = shape.tp, l.pp = shape.pp, l.sp = shape.sp, l.ep = shape.ep;
              l.pp_virtual = shape.chunks;
              l.zero_bubble = shape.zero_bubble;
              l.zero = zero, l.offload = off, l.recompute = rc;
              l.micro_batch = mb;
              l.grad_accum = per_rank / mb;
              l.zero_accum = acc;
              if (acc == ZeroAccum::Local && !(zero >= 2 && l.grad_accum > 1)) continue;  // the same layout
              if ((off == Offload::Optimizer && zero == 0) || (off == Offload::All && zero != 3)) continue;  // no such setting
              ++res.candidates;
              try {
                l.validate(model, cluster);
              } catch (const ConfigError&) {
                ++res.invalid;
                continue;
              }
              Plan p = make_plan(model, cluster, l);
              if (!p.fits_device) {
                ++res.over_device;
                continue;
              }
              if (!p.fits_host) {
                ++res.over_host;
                continue;
              }
              fitting.push_back(std::move(p));
            }
          }
        }
      }
    }
  }
  if (!any_dp) {
    throw ConfigError("--global-batch " + std::to_string(space.global_batch) + " is not divisible by any dp size of the " +
                      std::to_string(devices) + " devices");
  }
  res.fitting = static_cast<int64_t>(fitting.size());
  if (fitting.empty()) {
    throw ConfigError("no layout fits: " + std::to_string(res.candidates) + " tried, " + std::to_string(res.invalid) +
                      " not valid, " + std::to_string(res.over_device) + " over device memory, " +
                      std::to_string(res.over_host) + " over host memory (more devices, a smaller micro-batch, or offload)");
  }
  const size_t keep = std::min<size_t>(fitting.size(), static_cast<size_t>(std::max<int64_t>(1, space.top)));
  std::partial_sort(fitting.begin(), fitting.begin() + static_cast<std::ptrdiff_t>(keep), fitting.end(), ranks_before);
  // The reason of the last one kept compares it with the best one left out, if any.
  for (size_t i = 0; i < keep; ++i) {
    const Plan* next = nullptr;
    if (i + 1 < keep) next = &fitting[i + 1];
    else if (keep < fitting.size()) {
      next = &*std::min_element(fitting.begin() + static_cast<std::ptrdiff_t>(keep), fitting.end(), ranks_before);
    }
    res.best.push_back({fitting[i], explain(fitting[i], next)});
  }
  return res;
}

}  // namespace kiln::plan
