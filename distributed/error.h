// distributed/error.h -- kiln's exception types.
//
// Library code never calls exit(): it throws one of these, and only main() turns an exception
// into one line on stderr and an exit code. The message is the whole line the user sees, so it
// names the thing that is wrong (flag, file, value) and, where known, how to fix it.
#pragma once

#include <stdexcept>
#include <string>

namespace kiln {

// Base of every error kiln raises on purpose. `exit_code` is what main() returns.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, int exit_code = 1)
      : std::runtime_error(what), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// A flag, a config file or a combination of settings that cannot be used (exit code 2).
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& what) : Error(what, 2) {}
};

// A data file that is missing, malformed or holds tokens the model cannot take (exit code 3).
class DataError : public Error {
 public:
  explicit DataError(const std::string& what) : Error(what, 3) {}
};

// Training went wrong numerically (non-finite loss or gradient norm) (exit code 4).
class NumericsError : public Error {
 public:
  explicit NumericsError(const std::string& what) : Error(what, 4) {}
};

}  // namespace kiln
