// distributed/cuda_backend.h -- LibTorch's CUDA half, loaded when a command may compute on a GPU.
//
// kiln links LibTorch's CPU library, c10_cuda, the CUDA runtime and NCCL, but not libtorch_cuda.so:
// that library (LibTorch's CUDA kernels and hooks) brings cuBLAS(Lt), cuDNN, cuFFT, cuSPARSE and
// nvJitLink with it, whose loading alone cost every kiln process 0.15 s of its 0.51 s start-up and
// 34k of its 51k page faults (perf stat, 2026-11-28; an empty program linking libtorch_cpu: 0.29 s,
// 16k). A CPU run, `kiln plan`, `prep`, `report` and the test suite's few thousand processes never
// need it. A command that may use a GPU loads it (dlopen, global symbols) before it touches
// anything of LibTorch's: LibTorch fixes its CUDA hooks at their first use, so a backend loaded
// after a query would leave CUDA off for the process (`load_cuda_backend` then returns false, and
// `cuda_backend_error` says so).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

// True when this kiln was built against a LibTorch with CUDA (KILN_WITH_CUDA).
bool cuda_backend_built();

// Loads libtorch_cuda.so from the directory libtorch_cpu.so was loaded from (the same LibTorch),
// once per process; true when it is loaded. False (and cuda_backend_error() says why: dlerror()'s
// reason, or LibTorch's CUDA hooks fixed as absent before the load) leaves the process on the CPU:
// select_device then refuses --device cuda with that reason. False without CUDA.
bool load_cuda_backend();

// True once load_cuda_backend succeeded in this process.
bool cuda_backend_loaded();

// Why the load failed ("" when it did not fail or was not tried).
std::string cuda_backend_error();

// Whether `kiln ARGS` (ARGS without the program name) may compute on a GPU: train, eval, sample and
// bench, unless it says --device cpu.
bool command_may_use_cuda(const std::vector<std::string>& args);

// at::cuda::sleep (libtorch_cuda): a kernel spinning `cycles` clock cycles on the current stream,
// resolved after load_cuda_backend. Test paths only (KILN_TEST_SLOW_RANK on a GPU).
void cuda_spin(int64_t cycles);

}  // namespace kiln
