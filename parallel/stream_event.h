// parallel/stream_event.h -- a CUDA event recorded on a stream after the work queued on it so far,
// for the offload's side streams (parallel/host_accumulator.h's copies down, parallel/
// upload_stream.h's copies up): another stream waits for it (wait_on), or the host does
// (wait_host). Without timing (the cheaper kind). CUDA builds only.
#pragma once

#if defined(KILN_WITH_CUDA)
#include <string>

#include <cuda_runtime_api.h>

#include "distributed/error.h"

namespace kiln {

class StreamEvent {
 public:
  explicit StreamEvent(cudaStream_t stream) {
    check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
    const cudaError_t rc = cudaEventRecord(event_, stream);
    if (rc != cudaSuccess) {
      cudaEventDestroy(event_);
      event_ = nullptr;
      check(rc, "cudaEventRecord");
    }
  }
  ~StreamEvent() {
    if (event_) cudaEventDestroy(event_);
  }
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;

  // `stream` waits for the recorded work (the host does not).
  void wait_on(cudaStream_t stream) const { check(cudaStreamWaitEvent(stream, event_, 0), "cudaStreamWaitEvent"); }
  // The host waits for it.
  void wait_host() const { check(cudaEventSynchronize(event_), "waiting for a copy (cudaEventSynchronize)"); }

 private:
  static void check(cudaError_t rc, const char* what) {
    if (rc == cudaSuccess) return;
    (void)cudaGetLastError();
    throw Error(std::string("CUDA event: ") + what + ": " + cudaGetErrorString(rc));
  }
  cudaEvent_t event_ = nullptr;
};

}  // namespace kiln
#endif
