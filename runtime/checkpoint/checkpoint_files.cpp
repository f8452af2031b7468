// runtime/checkpoint/checkpoint_files.cpp -- the shared file primitives (checkpoint_files.h).
#include "runtime/checkpoint/checkpoint_files.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <unistd.h>

#include "distributed/error.h"

namespace kiln {

void checkpoint_io_error(const std::string& what, const std::string& path) {
  throw Error("checkpoint: " + what + " " + path + ": " + std::strerror(errno));
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) checkpoint_io_error("cannot open", path);
  if (::fsync(fd) != 0) {
    ::close(fd);
    checkpoint_io_error("cannot fsync", path);
  }
  ::close(fd);
}

void write_synced(const std::string& path, const std::string& text) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) checkpoint_io_error("cannot create", path);
    out << text;
    out.flush();
    if (!out) checkpoint_io_error("cannot write", path);
  }
  fsync_path(path, false);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

double resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atof(line.c_str() + 6) * 1024.0;
  }
  return 0.0;
}

void PeakTracker::sample() { peak = std::max(peak, resident_bytes() - base); }

}  // namespace kiln
