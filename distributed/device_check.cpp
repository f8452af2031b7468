// distributed/device_check.cpp -- tagged CPU allocations and the mode fallback that decides their side.
#include "distributed/device_check.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <unordered_map>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/library.h>
#include <torch/nn/module.h>
#if defined(KILN_WITH_CUDA)
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace kiln {

namespace {

constexpr auto kModeKey = c10::DispatchKey::TESTING_ONLY_GenericMode;

enum Side : int { kUnset = 0, kHost = 1, kDevice = 2 };

// The side the calling thread's allocations get now: set by the fallback for the length of an op,
// by HostAllocationScope, and device memory otherwise.
thread_local int g_side = kDevice;
thread_local bool g_pinned = false;  // host allocations now are page-locked ones (HostAllocationScope)
std::atomic<bool> g_enabled{false};
std::atomic<int64_t> g_reads{0};   // device_to_host_reads()
std::atomic<int64_t> g_writes{0};  // waiting_host_to_device_copies()
std::atomic<bool> g_cuda_count{false};
std::atomic<int64_t> g_cuda_syncs{0};  // the syncs LibTorch flagged on the counting thread (GPU half)

// What LibTorch's sync-debug mode says at each synchronizing CUDA call (c10::cuda::warn_or_error_on_sync).
constexpr const char* kSyncWarning = "called a synchronizing CUDA operation";

// Counts the sync-debug mode's warnings of the thread it is installed on; passes the rest on.
class SyncCounter final : public c10::WarningHandler {
 public:
  explicit SyncCounter(c10::WarningHandler* next) : next_(next) {}
  void process(const c10::Warning& warning) override {
    if (warning.msg().find(kSyncWarning) != std::string::npos) {
      ++g_cuda_syncs;
      return;
    }
    next_->process(warning);
  }

 private:
  c10::WarningHandler* next_;
};

// The side of every live allocation of the wrapped allocator, by address. (Not in the DataPtr's
// context: LibTorch's raw_allocate needs the context to be the data pointer itself.)
struct Allocation {
  c10::DeleterFnPtr deleter;  // the wrapped allocator's
  bool host;
  bool pinned;  // host memory that a GPU run would page-lock (host_buffer(n, true))
};
std::mutex g_mu;
std::unordered_map<void*, Allocation>& allocations() {
  static auto* table = new std::unordered_map<void*, Allocation>();  // outlives every tensor
  return *table;
}

void tagged_delete(void* p) {
  c10::DeleterFnPtr deleter = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = allocations().find(p);
    if (it != allocations().end()) {
      deleter = it->second.deleter;
      allocations().erase(it);
    }
  }
  if (deleter) deleter(p);
}

class TaggingAllocator final : public c10::Allocator {
 public:
  explicit TaggingAllocator(c10::Allocator* inner) : inner_(inner) {}
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr p = inner_->allocate(n);
    void* data = p.get();
    if (p.get_context() != data) {
      throw std::runtime_error("device check: the CPU allocator's pointers carry a context; cannot tag them");
    }
    const c10::DeleterFnPtr deleter = p.get_deleter();
    p.release_context();
    {
      std::lock_guard<std::mutex> lock(g_mu);
      allocations()[data] = Allocation{deleter, g_side == kHost, g_side == kHost && g_pinned};
    }
    return c10::DataPtr(data, data, &tagged_delete, c10::Device(c10::kCPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &tagged_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

 private:
  c10::Allocator* inner_;
};

const Allocation* allocation_of(const at::Tensor& t) {  // under g_mu
  if (!t.has_storage()) return nullptr;
  const c10::DataPtr& dp = t.storage().data_ptr();
  if (dp.get_deleter() != &tagged_delete) return nullptr;
  auto it = allocations().find(dp.get_context());
  return it == allocations().end() ? nullptr : &it->second;
}

bool device_memory(const at::Tensor& t) {
  std::lock_guard<std::mutex> lock(g_mu);
  const Allocation* a = allocation_of(t);
  return a != nullptr && !a->host;
}

bool pinned_memory(const at::Tensor& t) {
  std::lock_guard<std::mutex> lock(g_mu);
  const Allocation* a = allocation_of(t);
  return a != nullptr && a->pinned;
}

// Every op on a thread with the mode: its side from its arguments, then the op itself, unchanged.
void decide_side(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  int side = kUnset;
  auto look = [&](const at::Tensor& t) {
    if (!t.defined() || !t.is_cpu()) return;
    if (device_memory(t)) side = kDevice;
    else if (side == kUnset) side = kHost;
  };
  const auto values = torch::jit::last(*stack, args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = values[i];
    if (v.isTensor()) {
      look(v.toTensor());
    } else if (v.isTensorList()) {
      const c10::List<at::Tensor> list = v.toTensorList();
      for (size_t k = 0; k < list.size(); ++k) look(list.get(k));
    } else if (v.isOptionalTensorList()) {
      for (const std::optional<at::Tensor> t : v.toOptionalTensorList())
        if (t.has_value()) look(*t);
    }
  }
  // A read of device memory by the host (device_to_host_reads): a scalar out of it, a truth
  // value or comparison of it, or a copy into host memory. A copy of host memory into device
  // memory that waits (waiting_host_to_device_copies): blocking, or from pageable memory.
  const std::string& name = op.schema().name();
  if (name == "aten::item" || name == "aten::_local_scalar_dense" || name == "aten::is_nonzero" || name == "aten::equal") {
    if (side == kDevice) ++g_reads;
  } else if (name == "aten::copy_" && values.size() >= 2 && values[0].isTensor() && values[1].isTensor()) {
    const at::Tensor &dst = values[0].toTensor(), &src = values[1].toTensor();
    if (dst.is_cpu() && src.is_cpu()) {
      const bool dst_device = device_memory(dst), src_device = device_memory(src);
      if (!dst_device && src_device) ++g_reads;
      if (dst_device && !src_device) {
        const bool non_blocking = values.size() >= 3 && values[2].isBool() && values[2].toBool();
        if (!non_blocking || !pinned_memory(src)) ++g_writes;
      }
    }
  }
  if (side == kUnset) {  // a factory: its device argument decides
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i].name() != "device") continue;
      side = values[i].isNone() ? kHost : kDevice;
    }
  }
  const int saved = g_side;
  if (side != kUnset) g_side = side;
  try {
    c10::impl::ExcludeDispatchKeyGuard below(kModeKey);  // what the op calls inside keeps its side
    op.redispatchBoxed(keys.remove(kModeKey), stack);
  } catch (...) {
    g_side = saved;
    throw;
  }
  g_side = saved;
}

}  // namespace

bool device_check_requested() {
  const char* v = std::getenv("KILN_DEVICE_CHECK");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

void enable_device_check() {
  static std::once_flag once;
  std::call_once(once, [] {
    static TaggingAllocator allocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(&allocator, /*priority=*/std::numeric_limits<uint8_t>::max());
    static auto* library = new torch::Library(torch::Library::IMPL, "_", kModeKey, __FILE__, __LINE__);
    library->fallback(torch::CppFunction::makeFromBoxedFunction<&decide_side>());
    g_enabled = true;
  });
  c10::impl::tls_set_dispatch_key_included(kModeKey, true);
}

bool device_check_enabled() { return g_enabled.load(); }

int64_t device_to_host_reads() { return g_reads.load(); }

int64_t waiting_host_to_device_copies() { return g_writes.load(); }

int64_t host_syncs() { return g_reads.load() + g_writes.load() + g_cuda_syncs.load(); }

void enable_cuda_sync_count() {
#if defined(KILN_WITH_CUDA)
  static std::once_flag once;
  std::call_once(once, [] {
    // LibTorch's warning handler is the calling thread's: installed here, it sees this thread's
    // warnings only. Never freed: the thread may warn until the process ends.
    static auto* counter = new SyncCounter(c10::WarningUtils::get_warning_handler());
    c10::WarningUtils::set_warning_handler(counter);
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
    g_cuda_count = true;
  });
#endif
}

bool host_sync_count_enabled() { return g_enabled.load() || g_cuda_count.load(); }

bool is_host_memory(const at::Tensor& t) {
  if (!g_enabled.load() || !t.defined() || !t.is_cpu() || !t.has_storage()) return false;
  return !device_memory(t);
}

HostAllocationScope::HostAllocationScope(bool pinned) : saved_side_(g_side), saved_pinned_(g_pinned) {
  g_side = kHost;
  g_pinned = pinned;
  // The fallback would decide the side from the op's arguments: bypassed for the scope.
  saved_mode_ = c10::impl::tls_is_dispatch_key_included(kModeKey);
  if (saved_mode_) c10::impl::tls_set_dispatch_key_included(kModeKey, false);
}

HostAllocationScope::~HostAllocationScope() {
  g_side = saved_side_;
  g_pinned = saved_pinned_;
  if (saved_mode_) c10::impl::tls_set_dispatch_key_included(kModeKey, true);
}

at::Tensor to_device(const at::Tensor& t, c10::Device device, bool non_blocking) {
  if (device.is_cpu() && is_host_memory(t)) {
    // A factory naming the device makes device memory; the copy is what .to(cuda) would do.
    at::Tensor d = at::empty(t.sizes(), t.options().device(device));
    d.copy_(t, non_blocking);
    return d;
  }
  return t.to(device, non_blocking);
}

at::Tensor to_host(const at::Tensor& t) {
  at::Tensor h;
  {
    HostAllocationScope host;
    h = at::empty(t.sizes(), t.options().device(at::kCPU));
  }
  h.copy_(t);
  return h;
}

void module_to_device(torch::nn::Module& m, c10::Device device) {
  m.to(device);
  if (!device_check_enabled() || !device.is_cpu()) return;
  at::NoGradGuard no_grad;
  for (auto& p : m.parameters())
    if (is_host_memory(p)) p.set_data(to_device(p, device));
  for (auto& b : m.buffers())
    if (is_host_memory(b)) b.set_data(to_device(b, device));
}

}  // namespace kiln
