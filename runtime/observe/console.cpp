// runtime/observe/console.cpp -- rank 0's console lines (see the header).
#include "runtime/observe/console.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "distributed/strprintf.h"

namespace kiln {

std::string human_count(double v) {
  char buf[32];
  if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e4) std::snprintf(buf, sizeof buf, "%.1fK", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

std::string human_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long long s = std::llround(seconds);
  char buf[48];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  return buf;
}

namespace {
// A number of the summary record, or nullopt where it holds null (nothing measured).
std::optional<double> number(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j.at(key).is_number()) return std::nullopt;
  return j.at(key).get<double>();
}
}  // namespace

std::string format_step_line(const StepLine& s) {
  std::string line = strprintf("step %6lld/%lld | loss %.4f | lr %.2e | norm %.3f | %7.1f ms | %s tok/s | %.2f TFLOP/s/device",
                                   static_cast<long long>(s.step), static_cast<long long>(s.steps), s.loss, s.lr, s.norm,
                                   s.step_ms, human_count(s.tokens_per_s).c_str(), s.tflops);
  if (s.several_devices) line += strprintf(" (job %.2f)", s.tflops_job);
  if (s.mfu) line += strprintf(" | mfu %.1f%%", 100.0 * *s.mfu);
  line += strprintf(" | mem %.2f GB", s.mem_gb);
  if (s.loss_scale) line += strprintf(" | scale %g", *s.loss_scale);
  if (s.skipped) line += " | skipped (" + s.skip_reason + ")";
  line += " | " + human_count(static_cast<double>(s.tokens_seen)) + " tok | " + human_duration(s.elapsed_s) + " elapsed";
  if (s.step < s.steps) line += ", ETA " + human_duration(s.eta_s);
  return line;
}

std::string format_eval_line(int64_t step, double val_loss, double seconds) {
  return strprintf("eval   %6lld | val loss %.4f | ppl %.2f | %.1f s", static_cast<long long>(step), val_loss, std::exp(val_loss),
                       seconds);
}

std::string format_layout(int dp, int ep, int cp, int tp, bool sp, int pp) {
  std::string s = strprintf("dp %d", dp);
  if (ep > 1) s += strprintf(" (ep %d)", ep);
  if (cp > 1) s += strprintf(" cp %d", cp);
  s += strprintf(" tp %d%s pp %d", tp, sp ? " (sp)" : "", pp);
  return s;
}

std::string format_summary(const nlohmann::json& summary, int64_t tokens_seen) {
  const auto get_int = [&](const char* key) { return summary.value(key, int64_t{0}); };
  // This invocation's steps: start_step + 1 .. end_step. "updates" is the whole run's (a resumed
  // checkpoint's count included), so this invocation's are its steps less its skipped ones.
  const int64_t first = get_int("start_step") + 1, last = get_int("end_step");
  const int64_t skipped = get_int("skipped_steps"), updates = std::max<int64_t>(0, last - first + 1 - skipped);
  std::string out = "kiln: done in " + human_duration(summary.value("wall_s", 0.0)) + ": ";
  out += last >= first ? strprintf("steps %lld-%lld", static_cast<long long>(first), static_cast<long long>(last))
                       : std::string("no steps");
  out += strprintf(" (%lld updates, %lld skipped), %s tokens seen", static_cast<long long>(updates),
                   static_cast<long long>(skipped), human_count(static_cast<double>(tokens_seen)).c_str());
  if (const auto loss = number(summary, "final_loss")) {
    out += strprintf("\n      loss %.4f", *loss);
    const long long ran = static_cast<long long>(last - first + 1), tail_n = ran < 10 ? ran : 10;
    const auto tail = number(summary, "mean_loss_last10");  // over the last min(10, steps run)
    if (tail && tail_n > 1) out += strprintf(" (mean of the last %lld: %.4f)", tail_n, *tail);
  }
  if (const auto val = number(summary, "val_loss")) out += strprintf("; val loss %.4f (ppl %.2f)", *val, std::exp(*val));
  if (const auto tps = number(summary, "mean_tokens_per_s")) {
    out += strprintf("\n      %s tok/s, %.2f TFLOP/s/device", human_count(*tps).c_str(), number(summary, "mean_tflops").value_or(0.0));
    if (const auto mfu = number(summary, "mean_mfu")) out += strprintf(", mfu %.1f%%", 100.0 * *mfu);
  }
  out += strprintf("; peak memory %.2f GB", summary.value("peak_mem_gb", 0.0));
  if (const auto w = number(summary, "mean_watts")) out += strprintf("; %.0f W", *w);
  const int64_t rollbacks = get_int("rollbacks"), skipped_samples = get_int("skipped_samples");
  if (rollbacks > 0 || skipped_samples > 0) {
    out += strprintf("\n      %lld spike rollback(s); %lld sample position(s) of the stream skipped, never trained on",
                     static_cast<long long>(rollbacks), static_cast<long long>(skipped_samples));
  }
  if (summary.contains("checkpoint") && summary.at("checkpoint").is_string())
    out += "\n      last checkpoint " + summary.at("checkpoint").get<std::string>();
  return out;
}

}  // namespace kiln
