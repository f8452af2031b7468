// runtime/trainer/save_dir_lock.cpp -- flock on DIR/.kiln.lock, the holder's details in it, a probe file.
#include "runtime/trainer/save_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <exception>
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

// dir's entries, the lock file and probe files aside: what a job changed in it, if anything.
std::set<std::string> entries_of(const std::string& dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name != ".kiln.lock" && name.rfind(".kiln-probe-", 0) != 0) out.insert(name);
  }
  return out;
}

}  // namespace

SaveDirLock::SaveDirLock(std::string dir) : dir_(std::move(dir)) {
  try {
    acquire();
  } catch (...) {
    leave_as_found(/*failed=*/true);  // refused: nothing of this job stays behind
    throw;
  }
}

void SaveDirLock::acquire() {
  const std::string where = "--save-dir " + dir_;
  // The topmost directory that does not exist yet: what this job creates, and takes away again
  // if it ends having saved nothing.
  for (fs::path p = fs::absolute(dir_).lexically_normal(); !p.empty() && !fs::exists(p); p = p.parent_path()) {
    created_ = p.string();
    if (p == p.parent_path()) break;
  }
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
  for (int attempt = 0;; ++attempt) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    created_file_ = fd_ >= 0;
    if (fd_ < 0 && errno == EEXIST) fd_ = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
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
    // Held -- on the file the path still names? A job that left the directory as it found it may
    // have removed it between this open and this lock; then open the path again.
    struct stat held {}, named {};
    if (::fstat(fd_, &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_ino == named.st_ino && held.st_dev == named.st_dev) break;
    ::close(fd_);
    fd_ = -1;
    if (attempt == 10) throw ConfigError(where + ": its lock file " + path + " keeps being replaced by another job");
  }
  previous_ = read_holder(fd_);
  entries_ = entries_of(dir_);
  if (!previous_.empty()) {
    notice_ = "the lock of " + dir_ + " was left by a job that did not end cleanly (" + previous_ + "); taken over";
  }
  std::ostringstream me;
  me << "pid " << ::getpid() << " on host " << host_name() << " since " << now_text() << ": " << command_line() << "\n";
  const std::string text = me.str();
  wrote_ = true;
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    throw ConfigError(where + ": cannot write its lock file " + path + ": " + std::strerror(errno));
  }
  ::fsync(fd_);
}

void SaveDirLock::leave_as_found(bool failed) {
  if (fd_ >= 0) {
    // Still held while the file goes: a job waiting to open it finds it gone (acquire's check).
    if (created_file_) {
      ::unlink((dir_ + "/.kiln.lock").c_str());
    } else if (wrote_ && ::ftruncate(fd_, 0) == 0) {
      // A failed job puts back the record it found (a crashed holder's details stay for the next
      // job to report); a clean end leaves it empty, as always.
      if (failed && !previous_.empty()) {
        const std::string text = previous_ + "\n";
        const ssize_t ignored = ::pwrite(fd_, text.data(), text.size(), 0);
        (void)ignored;
      }
      ::fsync(fd_);
    }
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
    fd_ = -1;
  }
  if (created_.empty()) return;
  // The directories this job created, innermost first, each only while empty (fs::remove
  // refuses a directory that is not).
  std::error_code ec;
  const fs::path top(created_);
  for (fs::path p = fs::absolute(dir_).lexically_normal(); !p.empty(); p = p.parent_path()) {
    if (fs::exists(p) && (!fs::remove(p, ec) || ec)) break;
    if (p == top || p == p.parent_path()) break;
  }
}

SaveDirLock::~SaveDirLock() {
  if (fd_ < 0) return;
  // A job that changed nothing here (refused, failed before its first save, or had nothing to
  // train) takes away what it added. Destroyed while an exception is in flight: the job failed.
  if (entries_of(dir_) == entries_) {
    leave_as_found(/*failed=*/std::uncaught_exceptions() > 0);
    return;
  }
  // A clean end: the record says nobody holds it (a crash leaves the holder's details behind).
  if (::ftruncate(fd_, 0) == 0) ::fsync(fd_);
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
}

}  // namespace kiln
