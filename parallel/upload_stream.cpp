// parallel/upload_stream.cpp -- the upload stream's events and guards (CUDA builds); in line elsewhere.
#include "parallel/upload_stream.h"


#if defined(KILN_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "parallel/stream_event.h"

namespace kiln {

struct UploadStream::Stream {
#if defined(KILN_WITH_CUDA)
  c10::cuda::CUDAStream stream;
#endif
};

struct UploadStream::Done {
#if defined(KILN_WITH_CUDA)
  StreamEvent event;
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
    StreamEvent(compute.stream()).wait_on(upload.stream());  // E: after the compute stream's work so far
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
  t->event.wait_on(c10::cuda::getCurrentCUDAStream(t->device).stream());
#endif
}

}  // namespace kiln
