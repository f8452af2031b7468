// data/token_file.cpp -- TokenFile (mapped llm.c shards, raw uint16 files), write_token_shard.
#include "data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "distributed/error.h"

namespace kiln {

namespace {

constexpr int64_t kHeaderBytes = kShardHeaderInts * 4;

// Explicit byte assembly: correct on any host byte order and for any alignment.
int64_t load_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int b = bytes - 1; b >= 0; --b) v = (v << 8) | p[b];
  return static_cast<int64_t>(v);
}

int32_t header_int(const unsigned char* base, int index) {
  return static_cast<int32_t>(static_cast<uint32_t>(load_le(base + 4 * index, 4)));
}

void store_le32(unsigned char* p, uint32_t v) {
  for (int b = 0; b < 4; ++b) p[b] = static_cast<unsigned char>(v >> (8 * b));
}

std::string errno_text() { return std::strerror(errno); }

// Text given where tokens are read (a corpus passed to --data before kiln prep made shards of it):
// its name says so, or its first 4 KiB do -- no NUL byte, and nearly every byte printable,
// whitespace or part of a UTF-8 character. Token files fail that at once: a uint16 token below 256
// has a zero high byte, and a shard's header is mostly zeros.
bool looks_like_text(const std::string& path, const unsigned char* base, int64_t bytes) {
  const std::string ext = std::filesystem::path(path).extension().string();
  for (const char* e : {".txt", ".text", ".md", ".jsonl", ".json", ".csv", ".tsv"})
    if (ext == e) return true;
  const int64_t n = std::min<int64_t>(bytes, 4096);
  if (n == 0) return false;
  int64_t printable = 0;
  for (int64_t i = 0; i < n; ++i) {
    const unsigned char c = base[i];
    if (c == 0) return false;
    printable += c >= 0x20 || c == '\n' || c == '\r' || c == '\t';
  }
  return printable >= n * 95 / 100;
}

// What to do with a text file given as --data: kiln prep's command for it.
std::string prep_hint(const std::string& path) {
  const std::filesystem::path p(path);
  const std::string out = (p.parent_path() / (p.stem().string() + "_shards")).string();
  return "holds text, not tokens (an llm.c shard starts with the magic " + std::to_string(kShardMagic) +
         "): make token shards of it first, kiln prep --input " + path + " --out " + out + ", then train with --data '" + out +
         "/train_*.bin' (docs/data.md)";
}

}  // namespace

TokenFormat parse_token_format(const std::string& s) {
  if (s == "auto") return TokenFormat::Auto;
  if (s == "shard") return TokenFormat::Shard;
  if (s == "raw") return TokenFormat::Raw;
  throw ConfigError("--data-format: unknown format '" + s + "' (choices: auto, shard, raw)");
}

TokenFile::TokenFile(const std::string& path, TokenFormat format) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError(path + ": cannot open: " + errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    throw DataError(path + ": cannot stat: " + why);
  }
  const int64_t file_bytes = static_cast<int64_t>(st.st_size);
  // mmap rejects a zero length, and an empty file is malformed in every format anyway.
  if (file_bytes > 0) {
    map_ = ::mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_SHARED, fd, 0);
    if (map_ == MAP_FAILED) {
      map_ = nullptr;
      const std::string why = errno_text();
      ::close(fd);
      throw DataError(path + ": cannot map: " + why);
    }
    map_bytes_ = static_cast<size_t>(file_bytes);
    // Samples are visited in shuffled order, so read-ahead would mostly fetch unused pages.
    ::madvise(map_, map_bytes_, MADV_RANDOM);
  }
  ::close(fd);  // the mapping keeps the file alive

  // A throwing constructor skips the destructor, so unmap before every error below.
  auto fail = [&](const std::string& why) {
    if (map_ != nullptr) ::munmap(map_, map_bytes_);
    map_ = nullptr;
    throw DataError(path + ": " + why);
  };
  const auto* base = static_cast<const unsigned char*>(map_);

  if (format == TokenFormat::Raw) {
    if (file_bytes == 0) fail("empty raw token file");
    if (file_bytes % 2 != 0)
      fail("size " + std::to_string(file_bytes) +
           " bytes is odd; a raw token file holds uint16 tokens");
    // An llm.c shard read as raw would train on its header's 1024 bytes as 512 tokens: a file
    // whose header is a whole, consistent shard header (magic, version, count = its size) is one.
    if (file_bytes >= kHeaderBytes && header_int(base, 0) == kShardMagic) {
      const int32_t version = header_int(base, 1);
      const int64_t count = header_int(base, 2);
      if ((version == 1 || version == 2) && count >= 0 && file_bytes == kHeaderBytes + count * (version == 1 ? 2 : 4))
        fail("is an llm.c shard (magic " + std::to_string(kShardMagic) + ", version " + std::to_string(version) + ", " +
             std::to_string(count) + " tokens), not a raw token file: leave out --data-format raw");
    }
    tokens_ = base;
    bytes_per_token_ = 2;
    n_tokens_ = file_bytes / 2;
    open_mask();
    return;
  }

  const bool is_auto = format == TokenFormat::Auto;
  // Not a shard, and text: kiln prep is what it needs (a "bad magic" said nothing of it).
  if ((file_bytes < 4 || header_int(base, 0) != kShardMagic) && looks_like_text(path, base, file_bytes)) fail(prep_hint(path));
  // Check the magic first when it is readable: for a small raw file read in auto mode the
  // "pass --data-format raw" hint is more useful than "too small".
  if (file_bytes >= 4) {
    const int32_t magic = header_int(base, 0);
    if (magic != kShardMagic)
      fail("bad magic " + std::to_string(magic) + " (expected " + std::to_string(kShardMagic) +
           " for an llm.c shard" +
           (is_auto ? std::string("; for a raw uint16 token file pass --data-format raw)")
                    : std::string(")")));
  }
  if (file_bytes < kHeaderBytes)
    fail("size " + std::to_string(file_bytes) + " bytes is smaller than the " +
         std::to_string(kHeaderBytes) + "-byte llm.c shard header");
  const int32_t version = header_int(base, 1);
  if (version != 1 && version != 2)
    fail("unknown shard version " + std::to_string(version) +
         " (expected 1 for uint16 tokens or 2 for uint32 tokens)");
  const int64_t count = header_int(base, 2);
  if (count < 0) fail("negative token count " + std::to_string(count) + " in the shard header");
  bytes_per_token_ = version == 1 ? 2 : 4;
  const int64_t expected = kHeaderBytes + count * bytes_per_token_;
  if (file_bytes != expected)
    fail("size " + std::to_string(file_bytes) + " bytes disagrees with the header: " +
         std::to_string(count) + " tokens of " + std::to_string(bytes_per_token_) +
         " bytes need " + std::to_string(expected) + " bytes (truncated or corrupt shard?)");
  tokens_ = base + kHeaderBytes;
  n_tokens_ = count;
  open_mask();
}

void TokenFile::open_mask() {
  const std::string mask = mask_path_for(path_);
  std::error_code ec;
  if (mask == path_ || !std::filesystem::exists(mask, ec)) return;
  try {
    mask_ = std::make_unique<TargetMask>(mask, n_tokens_);
  } catch (...) {
    if (map_ != nullptr) ::munmap(map_, map_bytes_);  // the destructor does not run
    map_ = nullptr;
    throw;
  }
}

TokenFile::~TokenFile() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

void TokenFile::read(int64_t offset, int64_t n, int64_t* out) const {
  const unsigned char* p = tokens_ + offset * bytes_per_token_;
  for (int64_t i = 0; i < n; ++i, p += bytes_per_token_) out[i] = load_le(p, bytes_per_token_);
}

void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens) {
  bool wide = false;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0)
      throw DataError(path + ": cannot write negative token " + std::to_string(tokens[i]) +
                      " at position " + std::to_string(i));
    if (tokens[i] > 0xFFFF) wide = true;
  }
  if (tokens.size() > static_cast<size_t>(INT32_MAX))
    throw DataError(path + ": " + std::to_string(tokens.size()) +
                    " tokens exceed the int32 count of an llm.c shard header");
  const int bytes_per_token = wide ? 4 : 2;

  std::vector<unsigned char> header(kHeaderBytes, 0);
  store_le32(header.data(), static_cast<uint32_t>(kShardMagic));
  store_le32(header.data() + 4, wide ? 2u : 1u);
  store_le32(header.data() + 8, static_cast<uint32_t>(tokens.size()));
  std::vector<unsigned char> body(tokens.size() * bytes_per_token);
  for (size_t i = 0; i < tokens.size(); ++i)
    for (int b = 0; b < bytes_per_token; ++b)
      body[i * bytes_per_token + b] = static_cast<unsigned char>(tokens[i] >> (8 * b));

  // Write-then-rename: a reader (or a crash) never sees a half-written shard under `path`.
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) throw DataError(tmp + ": cannot create: " + errno_text());
  std::string why;  // errno of the first failing call, read before anything can overwrite it
  if (std::fwrite(header.data(), 1, header.size(), f) != header.size() ||
      std::fwrite(body.data(), 1, body.size(), f) != body.size() || std::fflush(f) != 0 ||
      ::fsync(fileno(f)) != 0)
    why = errno_text();
  if (std::fclose(f) != 0 && why.empty()) why = errno_text();
  if (!why.empty()) {
    std::remove(tmp.c_str());
    throw DataError(path + ": cannot write shard: " + why);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string rename_why = errno_text();
    std::remove(tmp.c_str());
    throw DataError(path + ": cannot rename " + tmp + " into place: " + rename_why);
  }
}

}  // namespace kiln
