// parallel/upload_stream.cpp -- the upload stream's events and guards (CUDA builds); in line elsewhere.
#include "parallel/upload_stream.h"

#include <string>

#if defined(KILN_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include "distributed/error.h"

namespace kiln {

namespace {
#if defined(KILN_WITH_CUDA)
void check(cudaError_t rc, const char* what) {
  if (rc == cudaSuccess) return;
  (void)cudaGetLastError();
  throw Error(std::string("upload stream: ") + what + ": " + cudaGetErrorString(rc));
}

// An event recorded on `stream` after the work queued on it so far.
struct Event {
  cudaEvent_t event = nullptr;
  explicit Event(cudaStream_t stream) {
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    const cudaError_t rc = cudaEventRecord(event, stream);
    if (rc != cudaSuccess) {
      cudaEventDestroy(event);
      event = nullptr;
      check(rc, "cudaEventRecord");
    }
  }
  ~Event() {
    if (event) cudaEventDestroy(event);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};
#endif
}  // namespace

struct UploadStream::Stream {
#if defined(KILN_WITH_CUDA)
  c10::cuda::CUDAStream stream;
#endif
};

struct UploadStream::Done {
#if defined(KILN_WITH_CUDA)
  Event event;
  c10::DeviceIndex device;
  Done(cudaStream_t s, c10::DeviceIndex d) : event(s), device(d) {}
#endif
};

UploadStream::UploadStream(c10::Device device) : device_(device) {}
UploadStream::~UploadStream() = default;

UploadStream::Ticket UploadStream::run(const std::vector<at::Tensor>& shared, const std::function<void()>& issue) {
#if defined(KILN_WITH_CUDA)
  if (device_.is_cuda()) {
    const c10::DeviceIndex index = device_.index() < 0 ? c10::cuda::current_device() : device_.index();
    if (!stream_) stream_.reset(new Stream{c10::cuda::getStreamFromPool(false, index)});
    const c10::cuda::CUDAStream& upload = stream_->stream;
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(index);
    {
      const Event queued(compute.stream());  // E: after the compute stream's work so far
      check(cudaStreamWaitEvent(upload.stream(), queued.event, 0), "cudaStreamWaitEvent");
    }
    for (const auto& t : shared)
      if (t.defined() && t.is_cuda()) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), upload);
    {
      c10::cuda::CUDAStreamGuard on_upload(upload);
      issue();
    }
    return std::make_shared<Done>(upload.stream(), index);  // D
  }
#endif
  (void)shared;
  issue();
  return nullptr;
}

void UploadStream::join(const Ticket& t) {
  if (!t) return;
#if defined(KILN_WITH_CUDA)
  check(cudaStreamWaitEvent(c10::cuda::getCurrentCUDAStream(t->device).stream(), t->event.event, 0), "cudaStreamWaitEvent");
#endif
}

}  // namespace kiln
