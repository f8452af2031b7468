// runtime/checkpoint/safetensors.cpp -- safetensors writer and checking reader; CRC-32 (slicing-by-8).
#include "runtime/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "distributed/error.h"

// Tensor bytes and the header length are little-endian in the file and copied as they are.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "kiln's safetensors code assumes a little-endian host");

namespace kiln {

namespace {

struct DtypeName {
  const char* name;
  at::ScalarType type;
};

// safetensors' names for the torch dtypes it can hold.
constexpr DtypeName kDtypes[] = {
    {"F64", at::kDouble},          {"F32", at::kFloat},         {"F16", at::kHalf},
    {"BF16", at::kBFloat16},       {"F8_E4M3", at::kFloat8_e4m3fn}, {"F8_E5M2", at::kFloat8_e5m2},
    {"I64", at::kLong},            {"I32", at::kInt},           {"I16", at::kShort},
    {"I8", at::kChar},             {"U64", at::kUInt64},        {"U32", at::kUInt32},
    {"U16", at::kUInt16},          {"U8", at::kByte},           {"BOOL", at::kBool},
};

// Largest header accepted, as in the reference implementation (safetensors' MAX_HEADER_SIZE).
constexpr uint64_t kMaxHeader = 100ull << 20;

const char* dtype_name(at::ScalarType t) {
  for (const auto& d : kDtypes) {
    if (d.type == t) return d.name;
  }
  return nullptr;
}

bool dtype_from_name(const std::string& name, at::ScalarType* t) {
  for (const auto& d : kDtypes) {
    if (name == d.name) {
      *t = d.type;
      return true;
    }
  }
  return false;
}

std::string supported_dtypes() {
  std::string s;
  for (const auto& d : kDtypes) s += (s.empty() ? "" : " ") + std::string(d.name);
  return s;
}

std::string errno_text(int err) { return std::strerror(err); }

std::string range_text(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

// Closes the descriptor on every path out of a function.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads exactly n bytes at `offset`. Returns 0, an errno value, or -1 at an early end of file.
int pread_all(int fd, void* buf, size_t n, uint64_t offset) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, std::min<size_t>(n, size_t{1} << 30), static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (r == 0) return -1;
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return 0;
}

// One tensor entry of a header, after its fields are checked.
struct Entry {
  std::string name;
  at::ScalarType type;
  std::vector<uint64_t> shape;
  uint64_t begin, end;
};

// A non-negative integer of a header field (JSON integer, not float, not negative).
bool as_u64(const nlohmann::json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

Entry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& v) {
  auto fail = [&](const std::string& what) -> DataError {
    return DataError(path + ": tensor '" + name + "' " + what);
  };
  if (!v.is_object()) throw fail("is not a JSON object");
  Entry e;
  e.name = name;
  auto dt = v.find("dtype");
  if (dt == v.end()) throw fail("has no \"dtype\"");
  if (!dt->is_string()) throw fail("has a \"dtype\" that is not a string");
  if (!dtype_from_name(dt->get<std::string>(), &e.type)) {
    throw fail("has unsupported dtype '" + dt->get<std::string>() + "' (supported: " + supported_dtypes() + ")");
  }
  auto sh = v.find("shape");
  if (sh == v.end()) throw fail("has no \"shape\"");
  if (!sh->is_array()) throw fail("has a \"shape\" that is not an array");
  for (const auto& d : *sh) {
    uint64_t n;
    if (!as_u64(d, &n) || n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw fail("has a \"shape\" entry that is not a non-negative integer: " + d.dump());
    }
    e.shape.push_back(n);
  }
  auto off = v.find("data_offsets");
  if (off == v.end()) throw fail("has no \"data_offsets\"");
  if (!off->is_array() || off->size() != 2 || !as_u64((*off)[0], &e.begin) || !as_u64((*off)[1], &e.end)) {
    throw fail("has \"data_offsets\" " + off->dump() + ", not [begin, end] with non-negative integers");
  }
  if (e.end < e.begin) throw fail("has data_offsets " + range_text(e.begin, e.end) + " that end before they begin");
  // numel * itemsize with overflow checks: a hostile shape must not wrap around to a small size.
  unsigned __int128 bytes = at::elementSize(e.type);
  for (uint64_t d : e.shape) {
    bytes *= d;
    if (bytes > std::numeric_limits<uint64_t>::max()) throw fail("has a shape " + shape_text(e.shape) + " too large to address");
  }
  if (static_cast<uint64_t>(bytes) != e.end - e.begin) {
    std::ostringstream m;
    m << "has data_offsets " << range_text(e.begin, e.end) << " holding " << (e.end - e.begin)
      << " bytes, but shape " << shape_text(e.shape) << " of " << dt->get<std::string>() << " needs "
      << static_cast<uint64_t>(bytes);
    throw fail(m.str());
  }
  return e;
}

// ---- CRC-32, slicing-by-8 (eight tables, eight bytes per step) -------------------------------
using CrcTables = std::array<std::array<uint32_t, 256>, 8>;

constexpr CrcTables make_crc_tables() {
  CrcTables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
    t[0][i] = c;
  }
  for (size_t k = 1; k < 8; ++k) {
    for (size_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
  }
  return t;
}

constexpr CrcTables kCrc = make_crc_tables();

}  // namespace

namespace {

// Writes all of buf at `offset`, retrying partial writes and EINTR. Returns 0 or an errno value.
int pwrite_all(int fd, const void* buf, size_t n, uint64_t offset) {
  auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, std::min<size_t>(n, size_t{1} << 30), static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return 0;
}

// The header, parsed and checked against the file's size: metadata, entries, where data starts.
struct Header {
  std::map<std::string, std::string> metadata;
  std::vector<Entry> entries;  // in header order
  uint64_t data_start = 0;
};

Header read_header(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) throw DataError(path + ": cannot stat: " + errno_text(errno));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  auto read_at = [&](void* buf, size_t n, uint64_t at, const char* what) {
    int err = pread_all(fd, buf, n, at);
    if (err == -1) throw DataError(path + ": file ended while reading " + what + " (was it truncated while being read?)");
    if (err != 0) throw DataError(path + ": cannot read " + what + ": " + errno_text(err));
  };
  if (size < 8) {
    throw DataError(path + ": file is " + std::to_string(size) +
                    " bytes, too short for a safetensors file (8-byte header length first)");
  }
  unsigned char len[8];
  read_at(len, 8, 0, "the header length");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(len[i]) << (8 * i);
  if (n > size - 8) {
    throw DataError(path + ": header length " + std::to_string(n) + " is beyond the end of the file (" +
                    std::to_string(size) + " bytes; is it truncated, or not a safetensors file?)");
  }
  if (n > kMaxHeader) {
    throw DataError(path + ": header length " + std::to_string(n) + " exceeds the limit of " +
                    std::to_string(kMaxHeader) + " bytes");
  }
  std::string text(n, '\0');
  read_at(text.data(), n, 8, "the header");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& ex) {
    throw DataError(path + ": header is not JSON (" + ex.what() + ")");
  }
  if (!header.is_object()) throw DataError(path + ": header is JSON but not an object");

  Header out;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) throw DataError(path + ": \"__metadata__\" is not a JSON object");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) throw DataError(path + ": \"__metadata__\" value of '" + k + "' is not a string");
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    out.entries.push_back(parse_entry(path, key, value));
  }

  // The byte ranges must tile the data buffer: sorted by offset, each begins where the last ended.
  out.data_start = 8 + n;
  const uint64_t data_size = size - out.data_start;
  for (const auto& e : out.entries) {
    if (e.end > data_size) {
      throw DataError(path + ": tensor '" + e.name + "' has data_offsets " + range_text(e.begin, e.end) +
                      " outside the data buffer (" + std::to_string(data_size) + " bytes)");
    }
  }
  std::vector<const Entry*> by_offset;
  for (const auto& e : out.entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t expected = 0;
  const Entry* prev = nullptr;
  for (const Entry* e : by_offset) {
    if (e->begin < expected) {
      throw DataError(path + ": tensors '" + prev->name + "' " + range_text(prev->begin, prev->end) + " and '" +
                      e->name + "' " + range_text(e->begin, e->end) + " overlap");
    }
    if (e->begin > expected) {
      throw DataError(path + ": gap of " + std::to_string(e->begin - expected) + " bytes before tensor '" +
                      e->name + "' " + range_text(e->begin, e->end) + " (data_offsets must be contiguous)");
    }
    expected = e->end;
    prev = e;
  }
  if (expected != data_size) {
    throw DataError(path + ": " + std::to_string(data_size - expected) +
                    " bytes at the end of the data buffer belong to no tensor (tensors end at " +
                    std::to_string(expected) + " of " + std::to_string(data_size) + ")");
  }
  return out;
}

}  // namespace

std::vector<std::string> safetensors_order(const std::vector<TensorSpec>& specs) {
  std::vector<size_t> order(specs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return specs[a].name < specs[b].name; });
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return at::elementSize(specs[a].dtype) > at::elementSize(specs[b].dtype);
  });
  std::vector<std::string> names;
  for (size_t i : order) names.push_back(specs[i].name);
  return names;
}

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<TensorSpec> specs,
                                     const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)) {
  // Refuse what the format cannot say.
  std::vector<size_t> order(specs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return specs[a].name < specs[b].name; });
  for (size_t i = 0; i < order.size(); ++i) {
    const TensorSpec& t = specs[order[i]];
    if (t.name == "__metadata__") throw Error("cannot write " + path_ + ": '__metadata__' is reserved, not a tensor name");
    if (i > 0 && specs[order[i - 1]].name == t.name) {
      throw Error("cannot write " + path_ + ": tensor name '" + t.name + "' is given twice");
    }
    if (!dtype_name(t.dtype)) {
      throw Error("cannot write " + path_ + ": tensor '" + t.name + "' has dtype " + std::string(c10::toString(t.dtype)) +
                  ", which safetensors cannot store");
    }
  }

  // Data order, as the reference writer's: larger elements first, then by name. Every tensor then
  // starts at a multiple of its element size (the data buffer starts 8-aligned), so a reader may
  // map it in place. For a file of one dtype this is plain sorted-name order.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return at::elementSize(specs[a].dtype) > at::elementSize(specs[b].dtype);
  });

  // Header: metadata first, then each tensor's dtype, shape and byte range, as the reference
  // writer orders the fields.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  uint64_t offset = 0;
  for (size_t i : order) {
    const TensorSpec& t = specs[i];
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    const uint64_t bytes = numel * at::elementSize(t.dtype);
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = dtype_name(t.dtype);
    e["shape"] = nlohmann::ordered_json::array();
    for (int64_t d : t.shape) e["shape"].push_back(d);
    e["data_offsets"] = {offset, offset + bytes};
    header[t.name] = std::move(e);
    slots_[t.name] = Slot{t, offset, bytes, false};
    order_.push_back(t.name);
    offset += bytes;
  }
  data_bytes_ = offset;
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& ex) {  // a name or value that is not UTF-8
    throw Error("cannot write " + path_ + ": header is not valid UTF-8 (" + ex.what() + ")");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char len[8];
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  data_start_ = 8 + n;

  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error("cannot write " + path_ + ": " + errno_text(errno));
  // A failed write leaves a partial file, which the reader refuses (its data ends early); the
  // checkpoint writer works in a temporary directory and only renames a complete one into place.
  auto check = [&](int err) {
    if (err != 0) throw Error("cannot write " + path_ + ": " + errno_text(err));
  };
  check(pwrite_all(fd_, len, sizeof len, 0));
  check(pwrite_all(fd_, text.data(), text.size(), 8));
  crc_ = crc32_update(crc32_update(0, len, sizeof len), text.data(), text.size());
  if (data_bytes_ > 0) check(::ftruncate(fd_, static_cast<off_t>(data_start_ + data_bytes_)) == 0 ? 0 : errno);
  // Tensors of no bytes are written by being there.
  for (auto& [name, slot] : slots_) slot.written = slot.bytes == 0;
  while (next_ < order_.size() && slots_.at(order_[next_]).written) ++next_;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsWriter::write(const std::string& name, const at::Tensor& t) {
  auto it = slots_.find(name);
  if (it == slots_.end()) throw Error("cannot write " + path_ + ": tensor '" + name + "' is not in its header");
  Slot& slot = it->second;
  if (slot.written && slot.bytes > 0) throw Error("cannot write " + path_ + ": tensor '" + name + "' is written twice");
  if (!t.defined()) throw Error("cannot write " + path_ + ": tensor '" + name + "' is undefined");
  if (t.scalar_type() != slot.spec.dtype || t.sizes() != at::IntArrayRef(slot.spec.shape)) {
    throw Error("cannot write " + path_ + ": tensor '" + name + "' is " + std::string(c10::toString(t.scalar_type())) + " " +
                shape_text(std::vector<uint64_t>(t.sizes().begin(), t.sizes().end())) + ", its header says " +
                std::string(c10::toString(slot.spec.dtype)) + " " +
                shape_text(std::vector<uint64_t>(slot.spec.shape.begin(), slot.spec.shape.end())));
  }
  if (slot.bytes == 0) return;
  // One tensor at a time on the host: a model on the GPU is never copied whole.
  const at::Tensor cpu = t.detach().to(at::kCPU).contiguous();
  const int err = pwrite_all(fd_, cpu.data_ptr(), slot.bytes, data_start_ + slot.begin);
  if (err != 0) throw Error("cannot write " + path_ + ": " + errno_text(err));
  slot.written = true;
  if (in_order_ && next_ < order_.size() && order_[next_] == name) {
    crc_ = crc32_update(crc_, cpu.data_ptr(), slot.bytes);
    ++next_;
    while (next_ < order_.size() && slots_.at(order_[next_]).written && slots_.at(order_[next_]).bytes == 0) ++next_;
  } else {
    in_order_ = false;
  }
}

uint32_t SafetensorsWriter::finish() {
  for (const auto& name : order_)
    if (!slots_.at(name).written) throw Error("cannot write " + path_ + ": tensor '" + name + "' was never written");
  auto check = [&](int err) {
    if (err != 0) throw Error("cannot write " + path_ + ": " + errno_text(err));
  };
  check(::fsync(fd_) == 0 ? 0 : errno);
  const int fd = fd_;
  fd_ = -1;  // close() is not retried: the descriptor is gone whatever it returns
  check(::close(fd) == 0 ? 0 : errno);
  return in_order_ ? crc_ : crc32_file(path_);
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) throw Error("cannot write " + path + ": tensor '" + name + "' is undefined");
    specs.push_back({name, t.scalar_type(), t.sizes().vec()});
  }
  SafetensorsWriter w(path, std::move(specs), metadata);
  std::map<std::string, const at::Tensor*> by_name;
  for (const auto& [name, t] : tensors) by_name[name] = &t;
  for (const auto& name : w.order()) w.write(name, *by_name.at(name));
  w.finish();
}

SafetensorsReader::SafetensorsReader(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw DataError(path_ + ": cannot open: " + errno_text(errno));
  try {
    Header h = read_header(fd_, path_);
    metadata_ = std::move(h.metadata);
    data_start_ = h.data_start;
    for (const auto& e : h.entries) {
      ranges_[e.name] = {specs_.size(), e.begin};
      specs_.push_back({e.name, e.type, std::vector<int64_t>(e.shape.begin(), e.shape.end())});
    }
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

const TensorSpec& SafetensorsReader::spec(const std::string& name) const {
  auto it = ranges_.find(name);
  if (it == ranges_.end()) throw DataError(path_ + ": no tensor '" + name + "'");
  return specs_[it->second.first];
}

at::Tensor SafetensorsReader::read(const std::string& name) const {
  const TensorSpec& s = spec(name);
  at::Tensor t = at::empty(s.shape, at::TensorOptions().dtype(s.dtype));
  read_into(name, t);
  return t;
}

void SafetensorsReader::read_into(const std::string& name, const at::Tensor& dst) const {
  auto it = ranges_.find(name);
  if (it == ranges_.end()) throw DataError(path_ + ": no tensor '" + name + "'");
  const TensorSpec& s = specs_[it->second.first];
  int64_t numel = 1;
  for (int64_t d : s.shape) numel *= d;
  if (!dst.is_cpu() || !dst.is_contiguous() || dst.scalar_type() != s.dtype || dst.numel() != numel) {
    throw DataError(path_ + ": tensor '" + name + "' cannot be read into the given tensor (dtype or size differs)");
  }
  if (dst.nbytes() == 0) return;
  // Data: read straight into the tensor's own memory (no staging copy, no alignment needs).
  const int err = pread_all(fd_, dst.data_ptr(), dst.nbytes(), data_start_ + it->second.second);
  if (err == -1) throw DataError(path_ + ": file ended while reading tensor '" + name + "' (was it truncated while being read?)");
  if (err != 0) throw DataError(path_ + ": cannot read tensor '" + name + "': " + errno_text(err));
}

SafetensorsFile load_safetensors(const std::string& path) {
  SafetensorsReader r(path);
  SafetensorsFile out;
  out.metadata = r.metadata();
  for (const auto& s : r.specs()) out.tensors[s.name] = r.read(s.name);
  return out;
}

uint32_t crc32_update(uint32_t crc, const void* data, std::size_t n) {
  auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  while (n >= 8) {
    uint32_t a, b;
    std::memcpy(&a, p, 4);
    std::memcpy(&b, p + 4, 4);
    a ^= crc;
    crc = kCrc[7][a & 0xFF] ^ kCrc[6][(a >> 8) & 0xFF] ^ kCrc[5][(a >> 16) & 0xFF] ^ kCrc[4][a >> 24] ^
          kCrc[3][b & 0xFF] ^ kCrc[2][(b >> 8) & 0xFF] ^ kCrc[1][(b >> 16) & 0xFF] ^ kCrc[0][b >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) crc = (crc >> 8) ^ kCrc[0][(crc ^ *p++) & 0xFF];
  return ~crc;
}

uint32_t crc32_file(const std::string& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) throw DataError(path + ": cannot open: " + errno_text(errno));
  std::vector<unsigned char> buf(size_t{1} << 20);
  uint32_t crc = 0;
  for (;;) {
    ssize_t r = ::read(f.fd, buf.data(), buf.size());
    if (r < 0) {
      if (errno == EINTR) continue;
      throw DataError(path + ": cannot read: " + errno_text(errno));
    }
    if (r == 0) break;
    crc = crc32_update(crc, buf.data(), static_cast<size_t>(r));
  }
  return crc;
}

}  // namespace kiln
