// data/token_file.h -- a memory-mapped token file: an llm.c shard or a raw uint16 token file.
//
// llm.c shard (karpathy/llm.c dev/data/data_common.py): a header of 256 little-endian int32,
//   header[0] = 20240520 (magic), header[1] = version (1: uint16 tokens, 2: uint32 tokens),
//   header[2] = number of tokens; the tokens follow the 1024-byte header. The file size must be
//   exactly 1024 + count * bytes_per_token.
// Raw file (nanoGPT's train.bin): little-endian uint16 tokens and nothing else.
//
// The file is mapped, never read whole; pages come in as samples touch them. A target mask beside
// it (X.mask: data/target_mask.h) is mapped with it and checked against its token count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/target_mask.h"
#include "data/token_source.h"

namespace kiln {

constexpr int32_t kShardMagic = 20240520;
constexpr int64_t kShardHeaderInts = 256;

// How a file's bytes are read. Auto: an llm.c shard if its first int32 is the magic, otherwise
// an error that says to pass --data-format raw for raw uint16 files -- or, for a file of text
// (by its name or its first bytes), to make shards of it with kiln prep, with the command.
enum class TokenFormat { Auto, Shard, Raw };

// Parses "auto" | "shard" | "raw"; throws ConfigError otherwise.
TokenFormat parse_token_format(const std::string& s);

class TokenFile final : public TokenSource {
 public:
  // Maps `path`. Throws DataError (naming the path) if it is missing, unreadable, or malformed:
  // wrong magic, unknown version, a size that disagrees with the header, an odd size for raw.
  TokenFile(const std::string& path, TokenFormat format);
  ~TokenFile() override;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int64_t size() const override { return n_tokens_; }
  void read(int64_t offset, int64_t n, int64_t* out) const override;
  const std::string& name() const override { return path_; }
  int bytes_per_token() const { return bytes_per_token_; }
  // The target mask beside the file (data/target_mask.h: X.bin -> X.mask), mapped when it exists.
  bool masked() const override { return mask_ != nullptr; }
  int64_t trained(int64_t offset, int64_t n) const override { return mask_ ? mask_->count(offset, n) : n; }
  bool trained_at(int64_t i) const override { return !mask_ || mask_->trained(i); }

 private:
  void open_mask();  // mask_ from the file beside, if any (unmaps and rethrows on a bad one)
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const unsigned char* tokens_ = nullptr;  // first token
  int bytes_per_token_ = 2;
  int64_t n_tokens_ = 0;
  std::unique_ptr<TargetMask> mask_;
};

// Writes an llm.c shard (version 1 if every token < 65536, else version 2) atomically: to
// `path`.tmp, fsync, rename. Throws DataError on I/O failure.
void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens);

}  // namespace kiln
