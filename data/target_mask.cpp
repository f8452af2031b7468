// data/target_mask.cpp -- TargetMask (mapped X.mask files), write_target_mask.
#include "data/target_mask.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "distributed/error.h"

namespace kiln {

namespace {

constexpr int64_t kHeaderBytes = 256 * 4;

int32_t header_int(const unsigned char* base, int index) {
  const unsigned char* p = base + 4 * index;
  return static_cast<int32_t>(p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24));
}

}  // namespace

std::string mask_path_for(const std::string& shard_path) {
  const std::string ext = ".bin";
  if (shard_path.size() > ext.size() && shard_path.compare(shard_path.size() - ext.size(), ext.size(), ext) == 0)
    return shard_path.substr(0, shard_path.size() - ext.size()) + ".mask";
  return shard_path + ".mask";
}

TargetMask::TargetMask(const std::string& path, int64_t tokens) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  const int64_t file_bytes = stat_ok ? static_cast<int64_t>(st.st_size) : -1;
  if (file_bytes != kHeaderBytes + tokens) {
    ::close(fd);
    throw DataError(path + ": a target mask of " + std::to_string(file_bytes) + " bytes beside a shard of " + std::to_string(tokens) +
                    " tokens (it needs " + std::to_string(kHeaderBytes + tokens) + ": a 1024-byte header and a byte per token)");
  }
  map_ = ::mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw DataError(path + ": cannot map: " + std::strerror(errno));
  }
  map_bytes_ = static_cast<size_t>(file_bytes);
  const auto* base = static_cast<const unsigned char*>(map_);
  auto fail = [&](const std::string& why) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    throw DataError(path + ": " + why);
  };
  if (header_int(base, 0) != kMaskMagic)
    fail("bad magic " + std::to_string(header_int(base, 0)) + " (a target mask, as kiln prep --chat writes, has " +
         std::to_string(kMaskMagic) + ")");
  if (header_int(base, 1) != 1) fail("unknown target mask version " + std::to_string(header_int(base, 1)) + " (expected 1)");
  if (header_int(base, 2) != tokens)
    fail("the header counts " + std::to_string(header_int(base, 2)) + " tokens, the shard beside it " + std::to_string(tokens));
  bytes_ = base + kHeaderBytes;
  for (int64_t i = 0; i < tokens; ++i)
    if (bytes_[i] > 1) fail("byte " + std::to_string(static_cast<int>(bytes_[i])) + " at token " + std::to_string(i) + " (a mask byte is 0 or 1)");
}

TargetMask::~TargetMask() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

int64_t TargetMask::count(int64_t offset, int64_t n) const {
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) c += bytes_[offset + i];
  return c;
}

void write_target_mask(const std::string& path, const std::vector<uint8_t>& mask) {
  if (mask.size() > static_cast<size_t>(INT32_MAX)) throw DataError(path + ": more tokens than a mask header counts");
  for (size_t i = 0; i < mask.size(); ++i)
    if (mask[i] > 1) throw DataError(path + ": mask byte " + std::to_string(mask[i]) + " at token " + std::to_string(i) + " (0 or 1)");
  unsigned char header[kHeaderBytes] = {};
  const uint32_t fields[3] = {static_cast<uint32_t>(kMaskMagic), 1u, static_cast<uint32_t>(mask.size())};
  for (int k = 0; k < 3; ++k)
    for (int b = 0; b < 4; ++b) header[4 * k + b] = static_cast<unsigned char>(fields[k] >> (8 * b));
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) throw DataError(tmp + ": cannot create: " + std::strerror(errno));
  std::string why;
  if (std::fwrite(header, 1, sizeof(header), f) != sizeof(header) || std::fwrite(mask.data(), 1, mask.size(), f) != mask.size() ||
      std::fflush(f) != 0 || ::fsync(fileno(f)) != 0)
    why = std::strerror(errno);
  if (std::fclose(f) != 0 && why.empty()) why = std::strerror(errno);
  if (!why.empty() || std::rename(tmp.c_str(), path.c_str()) != 0) {
    if (why.empty()) why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw DataError(path + ": cannot write the target mask: " + why);
  }
}

}  // namespace kiln
