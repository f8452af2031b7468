// runtime/checkpoint/checkpoint_files.h -- the file primitives kiln's checkpoint writers and
// readers share: a text file written and fsync'ed before it counts, a whole file read, and the
// resident-memory peak a load or save reports (CheckpointIo.peak_extra_bytes).
#pragma once

#include <string>

namespace kiln {

// Throws kiln::Error "checkpoint: <what> <path>: <strerror(errno)>".
[[noreturn]] void checkpoint_io_error(const std::string& what, const std::string& path);
// fsync of a file, or of a directory (its entries: a rename into it is durable after this).
void fsync_path(const std::string& path, bool directory);
// `text` written to `path` (truncated first) and fsync'ed; throws on any failure.
void write_synced(const std::string& path, const std::string& text);
// The whole file, or "" when it cannot be opened.
std::string read_text(const std::string& path);

// Resident memory of this process now (VmRSS), in bytes.
double resident_bytes();
// The highest resident memory above a baseline (taken when made), over the samples taken.
struct PeakTracker {
  double base = resident_bytes(), peak = 0.0;
  void sample();
};

}  // namespace kiln
