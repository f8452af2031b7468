// distributed/cuda_graph.cpp -- at::cuda::CUDAGraph through dlsym (see the header).
#include "distributed/cuda_graph.h"

#include <string>
#include <utility>

#include "distributed/cuda_backend.h"
#include "distributed/error.h"

#if defined(KILN_WITH_CUDA)
#include <dlfcn.h>

#include <ATen/cuda/CUDAGraph.h>  // the object's size and alignment only: its functions come by dlsym
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace kiln {

#if defined(KILN_WITH_CUDA)
namespace {

// at::cuda::CUDAGraph's members, as the Itanium ABI calls them: `this` first.
using Pool = std::pair<unsigned long long, unsigned long long>;  // c10::MempoolId_t
struct GraphFns {
  void (*construct)(void*, bool);
  void (*destroy)(void*);
  void (*capture_begin)(void*, Pool, cudaStreamCaptureMode);
  void (*capture_end)(void*);
  void (*replay)(void*);
};

const GraphFns& graph_fns() {
  static const GraphFns fns = [] {
    if (!load_cuda_backend()) throw Error("--cuda-graph: " + cuda_backend_error());
    auto find = [](const char* name) {
      void* f = dlsym(RTLD_DEFAULT, name);
      if (f == nullptr) throw Error(std::string("--cuda-graph: ") + name + " not found in LibTorch's CUDA library");
      return f;
    };
    GraphFns g{};
    g.construct = reinterpret_cast<void (*)(void*, bool)>(find("_ZN2at4cuda9CUDAGraphC1Eb"));
    g.destroy = reinterpret_cast<void (*)(void*)>(find("_ZN2at4cuda9CUDAGraphD1Ev"));
    g.capture_begin = reinterpret_cast<void (*)(void*, Pool, cudaStreamCaptureMode)>(
        find("_ZN2at4cuda9CUDAGraph13capture_beginESt4pairIyyE21cudaStreamCaptureMode"));
    g.capture_end = reinterpret_cast<void (*)(void*)>(find("_ZN2at4cuda9CUDAGraph11capture_endEv"));
    g.replay = reinterpret_cast<void (*)(void*)>(find("_ZN2at4cuda9CUDAGraph6replayEv"));
    return g;
  }();
  return fns;
}

}  // namespace

struct CudaGraph::Impl {  // a constructor that throws leaves no object behind to destroy
  alignas(at::cuda::CUDAGraph) unsigned char storage[sizeof(at::cuda::CUDAGraph)];
  Impl() { graph_fns().construct(storage, /*keep_graph=*/false); }
  ~Impl() { graph_fns().destroy(storage); }
};

bool cuda_graph_functions_found(std::string* why) {
  try {
    (void)graph_fns();
    return true;
  } catch (const std::exception& e) {
    if (why) *why = e.what();
    return false;
  }
}

CudaGraph::CudaGraph() : impl_(std::make_unique<Impl>()) {}
CudaGraph::~CudaGraph() = default;

void use_side_stream(int device) {
  const auto index = static_cast<c10::DeviceIndex>(device);
  const c10::cuda::CUDAGuard guard(index);
  if (cudaDeviceSynchronize() != cudaSuccess) throw Error("--cuda-graph: the device failed before the run's stream was set");
  c10::cuda::setCurrentCUDAStream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index));
}

void CudaGraph::capture(int device, const std::function<void()>& fn) {
  if (captured_) throw Error("CudaGraph: captured twice");
  const auto index = static_cast<c10::DeviceIndex>(device);
  const c10::cuda::CUDAGuard guard(index);
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(index);
  const c10::cuda::CUDAStream side =
      current == c10::cuda::getDefaultCUDAStream(index) ? c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index) : current;
  const c10::cuda::CUDAStreamGuard on_side(side);
  // The blocks the eager steps cached go back to the device: the graph's pool is its own, and would
  // otherwise hold a second copy of the step's activations beside them (a sync, once).
  c10::cuda::CUDACachingAllocator::emptyCache();
  graph_fns().capture_begin(impl_->storage, Pool{0, 0}, cudaStreamCaptureModeThreadLocal);
  try {
    fn();
  } catch (...) {
    try {
      graph_fns().capture_end(impl_->storage);  // ends the capture (it may itself fail: the first error is the one reported)
    } catch (...) {
    }
    throw;
  }
  graph_fns().capture_end(impl_->storage);
  captured_ = true;
}

void CudaGraph::replay() {
  if (!captured_) throw Error("CudaGraph: replayed before its capture");
  graph_fns().replay(impl_->storage);
}

#else

bool cuda_graph_functions_found(std::string* why) {
  if (why) *why = "a kiln built without CUDA";
  return false;
}

void use_side_stream(int) { throw Error("--cuda-graph needs a kiln built with CUDA"); }

struct CudaGraph::Impl {};
CudaGraph::CudaGraph() { throw Error("--cuda-graph needs a kiln built with CUDA"); }
CudaGraph::~CudaGraph() = default;
void CudaGraph::capture(int, const std::function<void()>&) { throw Error("--cuda-graph needs a kiln built with CUDA"); }
void CudaGraph::replay() { throw Error("--cuda-graph needs a kiln built with CUDA"); }

#endif

}  // namespace kiln
