// distributed/suggest.cpp -- edit distance over a short list, aliases, and one line for many unknown names.
#include "distributed/suggest.h"

#include <algorithm>

namespace kiln {

namespace {
size_t distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}
}  // namespace

std::string did_you_mean(const std::string& given, const std::vector<std::string>& choices) {
  std::string best;
  size_t best_d = 3;
  for (const auto& c : choices) {
    const size_t d = c.rfind(given, 0) == 0 && !given.empty() ? 1 : distance(given, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best.empty() ? std::string() : " (did you mean '" + best + "'?)";
}

std::string did_you_mean(const std::string& given, const std::vector<std::string>& choices,
                         const std::map<std::string, std::string>& aliases) {
  if (auto it = aliases.find(given); it != aliases.end()) return " (did you mean '" + it->second + "'?)";
  return did_you_mean(given, choices);
}

std::string unknown_names(const std::string& one, const std::string& many,
                          const std::vector<std::pair<std::string, std::string>>& unknown) {
  if (unknown.size() == 1) return one + " '" + unknown[0].first + "'" + unknown[0].second;
  std::string s = std::to_string(unknown.size()) + " " + many + ":";
  for (size_t i = 0; i < unknown.size(); ++i) s += (i ? ", '" : " '") + unknown[i].first + "'" + unknown[i].second;
  return s;
}

}  // namespace kiln
