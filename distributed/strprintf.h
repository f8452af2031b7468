// distributed/strprintf.h -- printf into a std::string, for the console's and kiln plan's lines
// (header-only: kiln_plan, which has no LibTorch, uses it too). Lines longer than 511 characters
// are cut.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <string>

namespace kiln {

inline std::string strprintf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline std::string strprintf(const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  return buf;
}

}  // namespace kiln
