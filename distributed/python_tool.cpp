// distributed/python_tool.cpp -- tools/*.py run from kiln (see the header).
//
// fork + execv with the script's stdout and stderr on two pipes, drained together with poll()
// (a script that fills one pipe while kiln waits on the other would otherwise deadlock). No
// shell: arguments reach the script as they are, whatever they hold. Built without the
// precompiled LibTorch header (nothing here needs LibTorch); KILN_DEFAULT_PYTHON and
// KILN_TOOLS_DIR come from CMake.
#include "distributed/python_tool.h"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "distributed/error.h"

#ifndef KILN_DEFAULT_PYTHON
#define KILN_DEFAULT_PYTHON ""
#endif
#ifndef KILN_TOOLS_DIR
#define KILN_TOOLS_DIR ""
#endif

namespace kiln {

namespace {

// [python, script, args...], checked to exist.
std::vector<std::string> command(const std::string& script, const std::vector<std::string>& args, const std::string& needs) {
  const char* env_python = std::getenv("KILN_PYTHON");
  const std::string python = env_python && *env_python ? env_python : KILN_DEFAULT_PYTHON;
  if (python.empty() || access(python.c_str(), X_OK) != 0) {
    throw ConfigError(needs + ": '" + python + "' is not there (bash launch/setup.sh makes .venv; or set KILN_PYTHON)");
  }
  const std::string path = std::string(KILN_TOOLS_DIR) + "/" + script;
  if (access(path.c_str(), R_OK) != 0) throw ConfigError(needs + ": " + path + " is missing (the source tree moved?)");
  std::vector<std::string> all{python, path};
  all.insert(all.end(), args.begin(), args.end());
  return all;
}

std::vector<char*> c_args(std::vector<std::string>& all) {
  std::vector<char*> out;
  for (auto& a : all) out.push_back(a.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

ToolRun run_python_tool(const std::string& script, const std::vector<std::string>& args, const std::string& needs,
                        const std::function<void(const std::string&)>& on_stderr_line) {
  std::vector<std::string> all = command(script, args, needs);
  std::vector<char*> argv = c_args(all);
  int out_pipe[2], err_pipe[2];
  if (pipe(out_pipe) != 0) throw Error("cannot run " + script + ": pipe: " + std::strerror(errno));
  if (pipe(err_pipe) != 0) {
    close(out_pipe[0]);
    close(out_pipe[1]);
    throw Error("cannot run " + script + ": pipe: " + std::strerror(errno));
  }
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw Error("cannot run " + script + ": fork: " + std::strerror(errno));
  if (pid == 0) {  // the child: only async-signal-safe calls until execv
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    close(out_pipe[0]);
    close(out_pipe[1]);
    close(err_pipe[0]);
    close(err_pipe[1]);
    execv(argv[0], argv.data());
    const char msg[] = "kiln: error: cannot execute the Python interpreter\n";
    (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  ToolRun run;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&run.out, &run.err};
  int open_fds = 2;
  char buf[1 << 16];
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      const ssize_t got = read(fds[i].fd, buf, sizeof(buf));
      if (got > 0) {
        const size_t before = sinks[i]->size();
        sinks[i]->append(buf, static_cast<size_t>(got));
        if (i == 1 && on_stderr_line) {  // the whole lines completed by this read
          // The line this read continues starts after the last newline before it (or at 0).
          const size_t last = before == 0 ? std::string::npos : run.err.rfind('\n', before - 1);
          size_t start = last == std::string::npos ? 0 : last + 1;
          for (size_t nl; (nl = run.err.find('\n', start)) != std::string::npos; start = nl + 1)
            if (nl >= before) on_stderr_line(run.err.substr(start, nl - start));
        }
      } else if (got == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;  // poll ignores negative descriptors
        --open_fds;
      }
    }
  }
  for (const auto& f : fds)
    if (f.fd >= 0) close(f.fd);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return run;
}

void exec_python_tool(const std::string& script, const std::vector<std::string>& args, const std::string& needs) {
  std::vector<std::string> all = command(script, args, needs);
  std::vector<char*> argv = c_args(all);
  std::fflush(nullptr);
  execv(argv[0], argv.data());
  throw ConfigError(needs + ": cannot run " + all[0] + ": " + std::strerror(errno));
}

std::string tool_failure(const ToolRun& run, const std::string& script) {
  const std::string prefix = "kiln: error: ";
  std::string last;
  size_t start = 0;
  while (start < run.err.size()) {
    size_t end = run.err.find('\n', start);
    if (end == std::string::npos) end = run.err.size();
    std::string line = run.err.substr(start, end - start);
    if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
    if (!line.empty()) last = line;
    start = end + 1;
  }
  if (!last.empty()) return script + " failed: " + last;
  return script + " failed with exit status " + std::to_string(run.exit_code);
}

}  // namespace kiln
