// data/token_source.h -- a read-only sequence of token ids, wherever the tokens live.
//
// Implemented by TokenFile (a memory-mapped shard or raw token file) and SyntheticCorpus (the
// built-in corpus). TokenDataset cuts sources into training samples.
#pragma once

#include <cstdint>
#include <string>

namespace kiln {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Number of tokens.
  virtual int64_t size() const = 0;
  // Copies tokens [offset, offset + n) into out. Precondition: 0 <= offset, offset + n <= size().
  virtual void read(int64_t offset, int64_t n, int64_t* out) const = 0;
  // A name for messages: the file path, or "synthetic".
  virtual const std::string& name() const = 0;
};

}  // namespace kiln
