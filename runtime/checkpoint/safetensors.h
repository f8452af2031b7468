// runtime/checkpoint/safetensors.h -- the safetensors file format, and a CRC-32 of whole files.
//
// Checkpoint weights are stored as safetensors (https://huggingface.co/docs/safetensors), the
// format Hugging Face transformers loads without running code from the file:
//
//   [0, 8)          N, the header length: unsigned 64-bit little-endian
//   [8, 8 + N)      header: a UTF-8 JSON object, padded with spaces to a multiple of 8 bytes
//                     {"__metadata__": {"key": "value", ...},                       (optional)
//                      "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, ...}
//   [8 + N, end)    data buffer; data_offsets [begin, end) are relative to its first byte
//
// Tensor bytes are row-major and little-endian. The writer puts the tensors back to back from
// offset 0 with no gaps, each contiguous, larger element sizes first and then in sorted-name order
// (plain sorted-name order for a file of one dtype). Each tensor is then aligned to its element
// size, as the reference writer (Python safetensors) arranges it; for files whose tensors have
// distinct element sizes or one dtype, the bytes are the same as that writer's. The reader accepts any order but
// checks every number in the header before using it: the byte ranges must tile the data buffer
// exactly (no overlap, no gap, nothing left over), and each range's length must equal
// numel(shape) * itemsize(dtype). A file that fails a check raises DataError naming the file and
// the problem; nothing is read outside the file.
//
// Data types: F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 I16 I8 U64 U32 U16 U8 BOOL.
//
// crc32_file() is the CRC-32 of zlib / PNG / gzip (reflected polynomial 0xEDB88320, initial and
// final XOR 0xFFFFFFFF; "123456789" -> 0xCBF43926), used to detect corrupted checkpoint files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace kiln {

// "[a, b, c]": a shape in messages (any integer type: a bad header's shape may overflow int64).
template <typename Int>
std::string shape_text(const std::vector<Int>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Tensors with their names, in the order given (the writer sorts them by name).
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Writes `tensors` (any device and layout; copied to contiguous CPU memory one at a time) and
// `metadata` (stored as "__metadata__", omitted when empty) to `path`, replacing the file, and
// fsyncs it. The caller makes the directory entry durable (fsync of the directory, rename).
// Throws kiln::Error "cannot write <path>: <errno text>" on an I/O failure (a partial file may be
// left; load_safetensors refuses it), and on a name used twice, the reserved name "__metadata__",
// or a dtype safetensors has no name for.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// One tensor of a file: its name, dtype and shape (what the header says of it).
struct TensorSpec {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
};

// The order in which the writer lays out tensors of these specs: larger elements first, then by
// name (the reference writer's order). Ranks that produce tensors one at a time for a writer use it
// to agree on the order without the file.
std::vector<std::string> safetensors_order(const std::vector<TensorSpec>& specs);

// A safetensors file written one tensor at a time: the header (every name, dtype, shape and byte
// range, laid out as save_safetensors lays them out, so the bytes are the same) first, then each
// tensor's bytes where the header puts them, in any order. Memory: one tensor at a time (the
// caller's), plus nothing. A CRC-32 of the file is kept as it is written when the tensors arrive
// in file order (order() gives it); otherwise finish() reads the file back for it.
class SafetensorsWriter {
 public:
  // Creates (truncates) `path` and writes the header. Throws kiln::Error as save_safetensors does.
  SafetensorsWriter(std::string path, std::vector<TensorSpec> specs, const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The tensor names in the order their bytes lie in the file.
  const std::vector<std::string>& order() const { return order_; }
  // Writes tensor `name` (any device; its shape and dtype must be the spec's). Once per name.
  void write(const std::string& name, const at::Tensor& t);
  // After every tensor is written: fsyncs and closes the file; returns its CRC-32. Throws if a
  // tensor was never written.
  uint32_t finish();
  // Bytes of the whole file.
  uint64_t file_bytes() const { return data_start_ + data_bytes_; }

 private:
  struct Slot {
    TensorSpec spec;
    uint64_t begin = 0, bytes = 0;
    bool written = false;
  };
  std::string path_;
  int fd_ = -1;
  std::map<std::string, Slot> slots_;
  std::vector<std::string> order_;
  uint64_t data_start_ = 0, data_bytes_ = 0;
  size_t next_ = 0;         // index in order_ of the next tensor in file order
  bool in_order_ = true;    // every write so far came in file order: crc_ is the file's so far
  uint32_t crc_ = 0;
};

// A safetensors file read one tensor at a time: the header is read and checked as
// load_safetensors checks it (the byte ranges tile the data exactly), then tensors are read on
// demand. Memory: the header, plus the tensors the caller reads.
class SafetensorsReader {
 public:
  // Throws kiln::DataError "<path>: <problem>" for a missing/unreadable file or a malformed header.
  explicit SafetensorsReader(std::string path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensors' names, dtypes and shapes, in header order.
  const std::vector<TensorSpec>& specs() const { return specs_; }
  bool contains(const std::string& name) const { return ranges_.count(name) > 0; }
  const TensorSpec& spec(const std::string& name) const;
  // Reads tensor `name` into a new CPU tensor. Throws DataError for an unknown name or a read failure.
  at::Tensor read(const std::string& name) const;
  // Reads tensor `name` into `dst` (a contiguous CPU tensor of its dtype and element count): no
  // tensor of its own. Throws DataError for an unknown name, a mismatch or a read failure.
  void read_into(const std::string& name, const at::Tensor& dst) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;
  std::map<std::string, std::string> metadata_;
  std::vector<TensorSpec> specs_;
  std::map<std::string, std::pair<size_t, uint64_t>> ranges_;  // name -> (index in specs_, begin)
};

struct SafetensorsFile {
  std::map<std::string, at::Tensor> tensors;          // CPU, contiguous, each owning its memory
  std::map<std::string, std::string> metadata;        // "__metadata__" (empty when absent)
};

// Reads and checks the whole file (see the header comment for what is checked). Throws
// kiln::DataError "<path>: <problem>" for a missing/unreadable file or any malformed content.
SafetensorsFile load_safetensors(const std::string& path);

// CRC-32 (zlib's) of `n` bytes, continuing from `crc` (0 to start): crc32(crc32(0, a), b) is the
// CRC of a followed by b.
uint32_t crc32_update(uint32_t crc, const void* data, std::size_t n);

// CRC-32 of a whole file's contents. Throws kiln::DataError naming the path on a read failure.
uint32_t crc32_file(const std::string& path);

}  // namespace kiln
