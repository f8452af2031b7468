// distributed/all_to_all_blocks.h -- an all_to_all's row blocks in elements, checked once for every
// backend (distributed/comm.h: Communicator::all_to_all).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace kiln {

// One rank's all_to_all in elements of the flattened tensors: block j of in (to rank j) is
// send_count[j] elements from send_offset[j]; block j of out (from rank j) is recv_count[j]
// elements from recv_offset[j]. resolve() checks a call's arguments against the rules of
// Communicator::all_to_all and throws Error("<what>: <the first rule broken>"); every backend
// uses it, so they refuse alike.
struct AllToAllBlocks {
  std::vector<int64_t> send_count, send_offset, recv_count, recv_offset;

  static AllToAllBlocks resolve(const at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits,
                                const std::vector<int64_t>& in_splits, int rank, int size, const std::string& what);
};

}  // namespace kiln
