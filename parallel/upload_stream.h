// parallel/upload_stream.h -- a stream of its own for ZeRO-3 offload all's parameter uploads, so
// a prefetched unit's host-to-device copy and all-gather run beside the compute stream's kernels
// instead of between them (parallel/zero.h, "ZeRO-3 gathers"; issue 50).
//
// Under --offload all each gather first copies the unit's host shard up: P psi'/N bytes a unit
// over the host link (a gpt2-1.5b block in bf16 on one GPU: 62 MB, about 2.5 ms at 25 GB/s).
// Issued on the compute stream, the copy of block i + 1 (the prefetch) waits for block i's queued
// kernels, and block i's kernels for the copy: the link's time adds to the step's. Here:
//
//   compute:  ... kernels of block i-1 | E | kernels of block i ............ | wait(D) | block i+1
//   upload:                              wait(E) | copy up i+1 | gather i+1 | D
//
// E orders the upload after the work queued before it (the gathered buffer's memory may be what
// the compute stream freed there); D, recorded after the gather, is what the compute stream waits
// for before block i + 1 reads it. Tensors the compute stream made and the upload stream uses (the
// gathered buffer) are recorded on it, so the allocator hands their memory out again only after
// the upload stream is done with it; what the upload stream allocates (the copied-up shard) is its
// own. A backend that runs the collective on a stream of its own (NCCL) waits for the upload
// stream, the current one when it is issued. One arithmetic either way: the same copy and gather,
// ordered otherwise.
//
// On the CPU (and for a shard already on the device) there is nothing to overlap: issue runs in
// line and the ticket is empty.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace kiln {

class UploadStream {
 public:
  explicit UploadStream(c10::Device device);
  ~UploadStream();
  UploadStream(const UploadStream&) = delete;
  UploadStream& operator=(const UploadStream&) = delete;

  // What the compute stream waits for (D above); empty when issue ran in line.
  struct Done;
  using Ticket = std::shared_ptr<Done>;

  // Runs issue() with the upload stream current, after the compute stream's queued work (E);
  // `shared`: tensors the compute stream made that the issued work uses. On the CPU: in line.
  Ticket run(const std::vector<at::Tensor>& shared, const std::function<void()>& issue);
  // The calling thread's current stream waits for the work run() issued (D). Empty: nothing.
  static void join(const Ticket& t);

 private:
  struct Stream;
  c10::Device device_;
  std::unique_ptr<Stream> stream_;  // made on the first run() on a GPU
};

}  // namespace kiln
