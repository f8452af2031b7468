// data/paths.cpp -- comma lists and glob(3), sorted.
#include "data/paths.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <utility>

#include "distributed/error.h"

namespace kiln {

namespace {

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> pieces;
  size_t start = 0;
  while (true) {
    const size_t comma = s.find(',', start);
    pieces.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return pieces;
    start = comma + 1;
  }
}

std::vector<std::string> expand_glob(const std::string& pattern, const std::string& flag) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> paths;
  if (rc == 0) paths.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  ::globfree(&g);
  if (rc == GLOB_NOMATCH) throw DataError(flag + ": no file matches '" + pattern + "'");
  if (rc != 0) throw DataError(flag + ": cannot expand '" + pattern + "' (read error or out of memory)");
  std::sort(paths.begin(), paths.end());
  return paths;
}

// What a folder of kiln prep's inputs holds: the count of its files by extension ("" for none),
// hidden files (.DS_Store) aside.
std::map<std::string, int> extensions_in(const std::string& dir, bool* has_subdirectories) {
  std::map<std::string, int> counts;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    if (entry.is_directory(ec)) {
      if (has_subdirectories) *has_subdirectories = true;
    } else if (entry.is_regular_file(ec)) {
      ++counts[entry.path().extension().string()];
    }
  }
  return counts;
}

// The commonest extension of `counts` (.jsonl, then .txt, before others on a tie: what kiln prep
// reads), and the counts in words: "3 .jsonl, 1 .md, 2 without an extension".
std::string commonest(const std::map<std::string, int>& counts, std::string* words) {
  std::string best;
  int most = 0;
  auto rank = [](const std::string& e) { return e == ".jsonl" ? 2 : e == ".txt" ? 1 : 0; };
  for (const auto& [e, n] : counts) {
    if (n > most || (n == most && rank(e) > rank(best))) most = n, best = e;
  }
  std::vector<std::pair<int, std::string>> order;
  for (const auto& [e, n] : counts) order.emplace_back(-n, e);
  std::sort(order.begin(), order.end());
  for (const auto& [n, e] : order)
    *words += (words->empty() ? "" : ", ") + std::to_string(-n) + (e.empty() ? " without an extension" : " " + e);
  return best;
}

// What to pass instead of the directory `dir` to `flag`, after "DIR is a directory; ". kiln prep's
// --input reads text: the pattern of the folder's commonest extension, with what it holds (or
// one folder down, where it holds folders alone; an empty folder is said to be empty). --data and
// --val-data read shards: kiln prep's train_* or val_* where the directory holds them.
std::string advice_for(const std::string& dir, const std::string& flag) {
  auto pass = [&](const std::string& pattern, const std::string& holds) {
    return "pass the files in it, e.g. " + flag + " '" + pattern + "' (quoted, so the shell leaves the pattern to kiln" +
           (holds.empty() ? "" : "; it holds " + holds) + ")";
  };
  if (flag == "--input") {
    bool subdirectories = false;
    std::string words;
    const std::map<std::string, int> here = extensions_in(dir, &subdirectories);
    if (!here.empty()) {
      const std::string ext = commonest(here, &words);
      return pass(dir + "/*" + ext, words + " file(s)");
    }
    std::map<std::string, int> below;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      if (entry.is_directory(ec) && entry.path().filename().string()[0] != '.')
        for (const auto& [e, n] : extensions_in(entry.path().string(), nullptr)) below[e] += n;
    }
    if (!below.empty()) {
      const std::string ext = commonest(below, &words);
      return pass(dir + "/*/*" + ext, "no files but folders, which hold " + words + " file(s)");
    }
    return std::string("it is empty") + (subdirectories ? " but for empty folders" : "") + ": there is nothing in it to prepare";
  }
  std::map<std::string, int> extensions;
  bool train = false, val = false;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file(ec)) continue;
    const std::string name = entry.path().filename().string();
    ++extensions[entry.path().extension().string()];
    train |= name.rfind("train_", 0) == 0 && entry.path().extension() == ".bin";
    val |= name.rfind("val_", 0) == 0 && entry.path().extension() == ".bin";
  }
  if (flag == "--val-data") return pass(dir + (val || !extensions.count(".bin") ? "/val_*.bin" : "/*.bin"), "");
  return pass(dir + (train || !extensions.count(".bin") ? "/train_*.bin" : "/*.bin"), "");
}

}  // namespace

std::vector<std::string> expand_paths(const std::vector<std::string>& patterns, const std::string& flag) {
  std::vector<std::string> out;
  for (const auto& pattern : patterns) {
    for (const auto& piece : split_commas(pattern)) {
      if (piece.empty()) continue;
      for (const auto& path : expand_glob(piece, flag)) {
        std::error_code ec;
        if (std::filesystem::is_directory(path, ec)) {
          std::string dir = path;
          while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
          throw DataError(flag + " " + path + " is a directory; " + advice_for(dir, flag));
        }
        out.push_back(path);
      }
    }
  }
  return out;
}

}  // namespace kiln
