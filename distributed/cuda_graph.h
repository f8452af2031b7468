// distributed/cuda_graph.h -- a CUDA graph of LibTorch work: captured once, replayed many times.
//
// LibTorch's own wrapper (at::cuda::CUDAGraph, in libtorch_cuda.so) does what a raw
// cudaStreamBeginCapture cannot: the captured work allocates from a private memory pool of the
// caching allocator that outlives the capture (so a replay writes the same addresses, and nothing
// else is handed them), and its RNG ops read the generator's seed and offset from device tensors
// that each replay fills from the generator's state then (so dropout draws afresh each replay,
// and a manual_seed before a replay is the seed the replay uses -- the same masks an eager step
// would draw). kiln does not link libtorch_cuda (distributed/cuda_backend.h): the wrapper's five
// functions are resolved with dlsym once the backend is loaded, and its object is built in place.
//
// capture(fn) runs fn on the current stream (use_side_stream's), or on a side stream where the
// current one is the default (a capture must not be on the default stream), in thread-local
// capture mode (the prefetch and save threads may allocate pinned memory meanwhile;
// the autograd engine's worker thread issues the backward's kernels on the captured stream,
// which are captured as the stream's). fn's kernels are recorded, not run: replay() runs them, on
// the current stream. fn must not synchronise with the host (kiln's step does not: sync_free.sh)
// and must read its inputs from tensors that stay where they are (the caller copies each
// replay's inputs into them first). GPU only: a build without CUDA, or a process without the
// backend, throws.
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace kiln {

// Whether LibTorch's CUDA graph functions resolve in this process (loading the CUDA backend; no
// device needed): false, with why, in a build without CUDA or a LibTorch whose names moved.
bool cuda_graph_functions_found(std::string* why = nullptr);

// Makes a non-default stream of `device` the calling thread's current stream from now on, after
// the device's queued work (a sync, once). A graphed run warms up, captures and replays on that
// one stream, as PyTorch asks of whole-network capture: autograd runs a parameter's
// AccumulateGrad node on the stream it was made on, and the hooks that hold those nodes across
// steps (parallel/main_grads.h) would otherwise keep the default stream's, whose wait on the
// captured stream breaks the capture.
void use_side_stream(int device);

class CudaGraph {
 public:
  CudaGraph();
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Records fn's device work on `device` (its index) into the graph; once per graph.
  void capture(int device, const std::function<void()>& fn);
  bool captured() const { return captured_; }
  // Runs the recorded work on the current stream.
  void replay();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  bool captured_ = false;
};

}  // namespace kiln
