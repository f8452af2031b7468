// data/target_mask.h -- which tokens of a shard are trained on: the mask file beside it.
//
// `kiln prep --chat` (data/prep.h) writes, beside each shard X.bin, X.mask: a header of 256
// little-endian int32 as llm.c's shards have -- header[0] = 20261129 (kMaskMagic), header[1] = 1
// (version), header[2] = the number of tokens, the shard's -- then one byte per token, 1 where the
// token is trained on as a target (an assistant's turn) and 0 where it is not (the prompt, the
// template's headers, the document token). A TokenFile maps the mask beside it when there is one
// (data/token_file.h); TokenDataset turns an untrained target into kIgnoreTarget, which the loss
// leaves out of both its sum and its count (models/gpt.h, head_loss).
// Checked when opened, before any training: the magic, the version, the count against the
// shard's, the size, and every byte 0 or 1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

constexpr int32_t kMaskMagic = 20261129;
constexpr int64_t kIgnoreTarget = -100;  // a target the loss leaves out (PyTorch's ignore_index)

// X.bin -> X.mask (any other name: name + ".mask").
std::string mask_path_for(const std::string& shard_path);

class TargetMask {
 public:
  // Maps `path`, which must hold `tokens` mask bytes. DataError naming the file otherwise.
  TargetMask(const std::string& path, int64_t tokens);
  ~TargetMask();
  TargetMask(const TargetMask&) = delete;
  TargetMask& operator=(const TargetMask&) = delete;

  // Whether token i is trained on as a target. Precondition: 0 <= i < tokens.
  bool trained(int64_t i) const { return bytes_[i] != 0; }
  // Tokens [offset, offset + n) trained on.
  int64_t count(int64_t offset, int64_t n) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const unsigned char* bytes_ = nullptr;
};

// Writes a mask file (format above) atomically: to `path`.tmp, fsync, rename. DataError on I/O
// failure or a byte other than 0 or 1.
void write_target_mask(const std::string& path, const std::vector<uint8_t>& mask);

}  // namespace kiln
