// tests/test_cuda_backend.cpp -- LibTorch's CUDA half, loaded on demand (distributed/cuda_backend.h).
// One process, in order: nothing of it before the load; after it, LibTorch's CUDA kernels and hooks
// are registered (checked without a GPU: the dispatcher and the hooks say so, not a device).
#include <fstream>
#include <sstream>
#include <string>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <gtest/gtest.h>

#include "distributed/cuda_backend.h"
#include "distributed/cuda_graph.h"

namespace {

bool mapped(const std::string& lib) {
  std::ifstream maps("/proc/self/maps");
  std::stringstream all;
  all << maps.rdbuf();
  return all.str().find("/" + lib) != std::string::npos;
}

TEST(CudaBackend, WhichCommandsMayUseAGpu) {
  using kiln::command_may_use_cuda;
  EXPECT_TRUE(command_may_use_cuda({"train"}));  // --device auto
  EXPECT_TRUE(command_may_use_cuda({"train", "--device", "cuda:1"}));
  EXPECT_TRUE(command_may_use_cuda({"sample", "--checkpoint", "cpu", "--device", "auto"}));
  EXPECT_TRUE(command_may_use_cuda({"bench", "--device", "cuda"}));
  EXPECT_FALSE(command_may_use_cuda({"train", "--steps", "1", "--device", "cpu"}));
  EXPECT_FALSE(command_may_use_cuda({"eval", "--device=cpu"}));
  EXPECT_FALSE(command_may_use_cuda({"plan", "--gpu", "h100"}));
  EXPECT_FALSE(command_may_use_cuda({"prep"}));
  EXPECT_FALSE(command_may_use_cuda({"report"}));
  EXPECT_FALSE(command_may_use_cuda({"version"}));
  EXPECT_FALSE(command_may_use_cuda({"--help"}));
  EXPECT_FALSE(command_may_use_cuda({"trian", "--device", "cuda"}));  // refused before any device
  EXPECT_FALSE(command_may_use_cuda({}));
}

TEST(CudaBackend, LoadedOnDemandWithItsKernelsAndHooks) {
  // kiln_core links LibTorch without libtorch_cuda.so: a CPU process never maps it.
  ASSERT_FALSE(mapped("libtorch_cuda.so"));
  EXPECT_FALSE(kiln::cuda_backend_loaded());
  if (!kiln::cuda_backend_built()) {
    EXPECT_FALSE(kiln::load_cuda_backend());
    GTEST_SKIP() << "kiln built without CUDA";
  }
  const auto& add = c10::Dispatcher::singleton().findSchemaOrThrow("aten::add", "Tensor");
  EXPECT_FALSE(add.hasKernelForDispatchKey(c10::DispatchKey::CUDA));
  ASSERT_TRUE(kiln::load_cuda_backend()) << kiln::cuda_backend_error();
  EXPECT_TRUE(kiln::load_cuda_backend());  // once per process
  EXPECT_TRUE(kiln::cuda_backend_loaded());
  EXPECT_EQ(kiln::cuda_backend_error(), "");
  EXPECT_TRUE(mapped("libtorch_cuda.so"));
  // Its static initialisers ran: the CUDA kernels and LibTorch's CUDA hooks (not the stand-in a
  // CPU-only LibTorch answers with) -- what a GPU run needs before its first CUDA tensor.
  EXPECT_TRUE(add.hasKernelForDispatchKey(c10::DispatchKey::CUDA));
  EXPECT_TRUE(at::detail::getCUDAHooks().isBuilt());
  // --cuda-graph's functions (distributed/cuda_graph.h: LibTorch's CUDAGraph by its mangled
  // names): every one resolves in this LibTorch, so a GPU run finds them (a LibTorch whose names
  // moved fails here, on the CPU, not on a GPU visit).
  std::string why;
  EXPECT_TRUE(kiln::cuda_graph_functions_found(&why)) << why;
}

}  // namespace
