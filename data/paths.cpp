// data/paths.cpp -- comma lists and glob(3), sorted.
#include "data/paths.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <map>

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

// A pattern for the files in `dir` that `flag` takes: kiln prep's --input reads text, so the
// commonest extension there ('corpus/*.txt'); --data and --val-data read shards, kiln prep's
// train_* or val_* where the directory holds them.
std::string pattern_for(const std::string& dir, const std::string& flag) {
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
  if (flag == "--input") {
    std::string ext = ".txt";
    int most = 0;
    for (const auto& [e, n] : extensions) {
      if (!e.empty() && n > most) most = n, ext = e;
    }
    return dir + "/*" + ext;
  }
  if (flag == "--val-data") return dir + (val || !extensions.count(".bin") ? "/val_*.bin" : "/*.bin");
  return dir + (train || !extensions.count(".bin") ? "/train_*.bin" : "/*.bin");
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
          throw DataError(flag + " " + path + " is a directory; pass the files in it, e.g. " + flag + " '" +
                          pattern_for(dir, flag) + "' (quoted, so the shell leaves the pattern to kiln)");
        }
        out.push_back(path);
      }
    }
  }
  return out;
}

}  // namespace kiln
