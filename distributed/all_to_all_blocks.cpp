// distributed/all_to_all_blocks.cpp -- the checks of an all_to_all's arguments and its blocks.
#include "distributed/all_to_all_blocks.h"

#include "distributed/error.h"

namespace kiln {

namespace {

[[noreturn]] void refuse(const std::string& what, const std::string& m) { throw Error(what + ": " + m); }

// Elements in a row: the product of every size after dim 0 (1 for a 1-D tensor).
int64_t row_elements(const at::Tensor& t) {
  int64_t w = 1;
  for (int64_t d = 1; d < t.dim(); ++d) w *= t.size(d);
  return w;
}

// The splits of `which` (empty: equal), checked against its `rows`.
std::vector<int64_t> row_splits(const std::vector<int64_t>& splits, int64_t rows, int size, const std::string& which,
                                const std::string& what) {
  auto fail = [&what](const std::string& m) { refuse(what, m); };
  const std::string name = which + "_splits";
  if (splits.empty()) {
    if (rows % size != 0) {
      fail("equal splits (empty " + name + ") need " + which + "'s dim 0 (" + std::to_string(rows) +
           ") divisible by the group size (" + std::to_string(size) + ")");
    }
    return std::vector<int64_t>(static_cast<size_t>(size), rows / size);
  }
  if (splits.size() != static_cast<size_t>(size)) {
    fail(name + " has " + std::to_string(splits.size()) + " entries, need one per rank (" + std::to_string(size) + ")");
  }
  int64_t sum = 0;
  for (int j = 0; j < size; ++j) {
    if (splits[j] < 0) fail(name + "[" + std::to_string(j) + "] is " + std::to_string(splits[j]) + " (rows must be >= 0)");
    sum += splits[j];
  }
  if (sum != rows) fail(name + " sums to " + std::to_string(sum) + " rows, but " + which + " has " + std::to_string(rows) + " (dim 0)");
  return splits;
}

}  // namespace

AllToAllBlocks AllToAllBlocks::resolve(const at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits,
                                       const std::vector<int64_t>& in_splits, int rank, int size, const std::string& what) {
  auto fail = [&what](const std::string& m) { refuse(what, m); };
  if (!in.defined() || !out.defined()) fail("undefined tensor");
  if (in.dim() == 0 || out.dim() == 0) fail("in and out are split along dim 0 into row blocks; a 0-dim tensor has none");
  if (in.scalar_type() != out.scalar_type()) fail("input and output dtypes differ");
  if (in.device() != out.device()) fail("in is on " + in.device().str() + ", out on " + out.device().str());
  if (!in.is_contiguous() || !out.is_contiguous()) fail("tensor must be contiguous");
  const int64_t width = row_elements(in);
  if (row_elements(out) != width) {
    fail("a row of in has " + std::to_string(width) + " elements, a row of out " + std::to_string(row_elements(out)) +
         " (they must match)");
  }
  const auto* a = static_cast<const char*>(in.data_ptr());
  const auto* b = static_cast<const char*>(out.data_ptr());
  const auto in_bytes = static_cast<int64_t>(in.nbytes()), out_bytes = static_cast<int64_t>(out.nbytes());
  if (in_bytes > 0 && out_bytes > 0 && a < b + out_bytes && b < a + in_bytes) fail("in and out overlap (all_to_all is not in place)");
  const std::vector<int64_t> sends = row_splits(in_splits, in.size(0), size, "in", what);
  const std::vector<int64_t> recvs = row_splits(out_splits, out.size(0), size, "out", what);
  if (sends[rank] != recvs[rank]) {
    fail("in_splits[" + std::to_string(rank) + "] sends " + std::to_string(sends[rank]) + " rows to this rank itself, but out_splits[" +
         std::to_string(rank) + "] expects " + std::to_string(recvs[rank]));
  }
  AllToAllBlocks blocks;
  for (int64_t j = 0, sent = 0, got = 0; j < size; sent += sends[j], got += recvs[j], ++j) {
    blocks.send_count.push_back(sends[j] * width);
    blocks.send_offset.push_back(sent * width);
    blocks.recv_count.push_back(recvs[j] * width);
    blocks.recv_offset.push_back(got * width);
  }
  return blocks;
}

}  // namespace kiln
