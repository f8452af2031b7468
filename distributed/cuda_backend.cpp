// distributed/cuda_backend.cpp -- LibTorch's CUDA half on demand (see the header).
#include "distributed/cuda_backend.h"

#include <dlfcn.h>

#include <mutex>

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include "distributed/error.h"

namespace kiln {
namespace {

std::once_flag g_once;
bool g_loaded = false;
std::string g_error;

// The directory of the libtorch_cpu.so this process runs (the LibTorch kiln was built against,
// wherever its RUNPATH found it), with a trailing slash; empty when unknown.
std::string torch_lib_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&at::globalContext), &info) == 0 || info.dli_fname == nullptr) return "";
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

void load_once() {
  const std::string dir = torch_lib_dir();
  const std::string lib = dir + "libtorch_cuda.so";
  if (dlopen(lib.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    const char* why = dlerror();
    g_error = "cannot load LibTorch's CUDA library " + lib + ": " + (why ? why : "unknown reason");
    return;
  }
  // Its static initialisers registered the CUDA kernels and hooks; hooks fixed before (as absent)
  // would keep CUDA off for good.
  if (!at::detail::getCUDAHooks().isBuilt()) {
    g_error = "LibTorch's CUDA hooks were used before " + lib + " was loaded: CUDA stays off in this process";
    return;
  }
  g_loaded = true;
}

}  // namespace

bool cuda_backend_built() {
#if defined(KILN_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

bool load_cuda_backend() {
  if (!cuda_backend_built()) return false;
  std::call_once(g_once, load_once);
  return g_loaded;
}

bool cuda_backend_loaded() { return g_loaded; }

std::string cuda_backend_error() { return g_error; }

bool command_may_use_cuda(const std::vector<std::string>& args) {
  if (args.empty()) return false;
  const std::string& cmd = args[0];
  if (cmd != "train" && cmd != "eval" && cmd != "sample" && cmd != "bench") return false;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--device=cpu" || (args[i] == "--device" && i + 1 < args.size() && args[i + 1] == "cpu")) return false;
  }
  return true;
}

void cuda_spin(int64_t cycles) {
  if (!load_cuda_backend()) throw Error(cuda_backend_error());
  using Sleep = void (*)(int64_t);
  static const auto sleep = reinterpret_cast<Sleep>(dlsym(RTLD_DEFAULT, "_ZN2at4cuda5sleepEl"));  // at::cuda::sleep(long)
  if (sleep == nullptr) throw Error("at::cuda::sleep not found in LibTorch's CUDA library");
  sleep(cycles);
}

}  // namespace kiln
