// runtime/trainer/save_dir_lock.cpp -- flock on DIR/.kiln.lock, the holder's details in it, a probe file.
#include "runtime/trainer/save_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "distributed/error.h"

namespace kiln {

namespace {

namespace fs = std::filesystem;

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

std::string now_text() {
  const std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S %Z", std::localtime(&t));
  return buf;
}

// This process's command line, as /proc gives it (arguments joined by spaces).
std::string command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (char& c : all)
    if (c == '\0') c = ' ';
  while (!all.empty() && all.back() == ' ') all.pop_back();
  return all.size() > 200 ? all.substr(0, 200) + "..." : all;
}

// The holder's details as written in the lock file: "pid P on host H since T: COMMAND".
std::string read_holder(int fd) {
  char buf[512] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string s = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

SaveDirLock::SaveDirLock(std::string dir) : dir_(std::move(dir)) {
  const std::string where = "--save-dir " + dir_;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_)) throw ConfigError(where + ": cannot create the directory (" + ec.message() + ")");
  // Writable: a probe file created and removed (a read-only mount or a missing permission would
  // otherwise be found at the first save, after the steps before it).
  const std::string probe = dir_ + "/.kiln-probe-" + std::to_string(::getpid());
  const int pfd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (pfd < 0) throw ConfigError(where + " is not writable: " + std::strerror(errno));
  const bool wrote = ::write(pfd, "probe\n", 6) == 6;
  const int werr = errno;
  ::close(pfd);
  ::unlink(probe.c_str());
  if (!wrote) throw ConfigError(where + " is not writable: " + std::strerror(werr));

  const std::string path = dir_ + "/.kiln.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw ConfigError(where + ": cannot open its lock file " + path + ": " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = read_holder(fd_);
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK) {
      throw ConfigError(where + " is in use by another job (" + (holder.empty() ? "holder unknown" : holder) +
                        "): one job per save directory; wait for it to end, or choose another --save-dir");
    }
    throw ConfigError(where + ": cannot lock " + path + ": " + std::strerror(err));
  }
  const std::string previous = read_holder(fd_);
  if (!previous.empty()) {
    notice_ = "the lock of " + dir_ + " was left by a job that did not end cleanly (" + previous + "); taken over";
  }
  std::ostringstream me;
  me << "pid " << ::getpid() << " on host " << host_name() << " since " << now_text() << ": " << command_line() << "\n";
  const std::string text = me.str();
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw ConfigError(where + ": cannot write its lock file " + path + ": " + std::strerror(err));
  }
  ::fsync(fd_);
}

SaveDirLock::~SaveDirLock() {
  if (fd_ < 0) return;
  // A clean end: the record says nobody holds it (a crash leaves the holder's details behind).
  if (::ftruncate(fd_, 0) == 0) ::fsync(fd_);
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
}

}  // namespace kiln
