// data/token_source.h -- a read-only sequence of token ids, wherever the tokens live.
//
// Implemented by TokenFile (a memory-mapped shard or raw token file, and the target mask beside
// it) and SyntheticCorpus (the built-in corpus). TokenDataset cuts sources into training samples.
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
  // Whether some of its tokens are not trained on as targets (a target mask beside a shard:
  // data/target_mask.h), and the tokens in [offset, offset + n) that are. Without a mask: every one.
  virtual bool masked() const { return false; }
  virtual int64_t trained(int64_t /*offset*/, int64_t n) const { return n; }
  // Whether token i is trained on as a target.
  virtual bool trained_at(int64_t /*i*/) const { return true; }
};

}  // namespace kiln
