// data/paths.cpp -- comma lists and glob(3), sorted.
#include "data/paths.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>

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
          throw DataError(flag + " " + path + " is a directory; pass the files in it, e.g. " + flag + " '" + dir +
                          "/train_*.bin' (quoted, so the shell leaves the pattern to kiln)");
        }
        out.push_back(path);
      }
    }
  }
  return out;
}

}  // namespace kiln
