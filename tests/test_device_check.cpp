// tests/test_device_check.cpp -- the device-check mode (distributed/device_check.h): which side each
// way of making a CPU tensor lands on, and that a group of the run refuses host memory
// (tests/test_comm_mpi.cpp has the MPI side; here the rules alone, in one process). Each test runs
// in a process of its own (gtest_discover_tests), so the mode a test enables stays in that test.
#include <thread>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#if defined(KILN_WITH_CUDA)
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "distributed/device_check.h"
#include "distributed/host_memory.h"

namespace {
const c10::Device kCpu(c10::kCPU);
}

TEST(DeviceCheck, OffUntilEnabled) {
  EXPECT_FALSE(kiln::device_check_enabled());
  EXPECT_FALSE(kiln::is_host_memory(at::ones({4})));  // no sides without the mode
}

TEST(DeviceCheck, FactoriesWithoutADeviceMakeHostMemory) {
  kiln::enable_device_check();
  EXPECT_TRUE(kiln::is_host_memory(at::ones({4})));
  EXPECT_TRUE(kiln::is_host_memory(at::full({1}, 2.0, at::kDouble)));
  EXPECT_TRUE(kiln::is_host_memory(at::tensor({1.0, 2.0}, at::kDouble)));
  EXPECT_TRUE(kiln::is_host_memory(at::zeros({3}, at::TensorOptions().dtype(at::kFloat))));
  EXPECT_FALSE(kiln::is_host_memory(at::zeros({3}, at::TensorOptions().device(kCpu))));
}

TEST(DeviceCheck, OpsTakeTheSideOfTheirInputs) {
  kiln::enable_device_check();
  const at::Tensor h = at::ones({4}), d = at::ones({4}, at::TensorOptions().device(kCpu));
  EXPECT_TRUE(kiln::is_host_memory(h * 2));
  EXPECT_TRUE(kiln::is_host_memory(h.to(at::kDouble).sum()));
  EXPECT_TRUE(kiln::is_host_memory(h.narrow(0, 1, 2)));  // a view shares its base's memory
  EXPECT_FALSE(kiln::is_host_memory(d * 2));
  EXPECT_FALSE(kiln::is_host_memory(at::empty_like(d)));
  EXPECT_FALSE(kiln::is_host_memory(at::zeros({2}, d.options())));
  EXPECT_FALSE(kiln::is_host_memory(d + h));  // mixed: device (what the check cannot catch)
  EXPECT_FALSE(kiln::is_host_memory(at::stack({d, h})));
  EXPECT_TRUE(kiln::is_host_memory(h.to(kCpu)));  // .to() of the same device is the same memory
}

TEST(DeviceCheck, ToDeviceCopiesHostMemory) {
  kiln::enable_device_check();
  const at::Tensor h = at::arange(6, at::kFloat);
  const at::Tensor d = kiln::to_device(h, kCpu);
  EXPECT_FALSE(kiln::is_host_memory(d));
  EXPECT_NE(d.data_ptr(), h.data_ptr());
  EXPECT_TRUE(at::equal(d, h));
  EXPECT_EQ(kiln::to_device(d, kCpu).data_ptr(), d.data_ptr());  // already there: itself
}

TEST(DeviceCheck, ModuleToDevicePlacesParameters) {
  kiln::enable_device_check();
  torch::nn::Linear lin(4, 3);
  EXPECT_TRUE(kiln::is_host_memory(lin->weight));  // built on the host, as on a GPU run
  const at::Tensor before = lin->weight.detach().clone();
  kiln::module_to_device(*lin, kCpu);
  EXPECT_FALSE(kiln::is_host_memory(lin->weight));
  EXPECT_FALSE(kiln::is_host_memory(lin->bias));
  EXPECT_TRUE(at::equal(lin->weight.detach(), before));
  // Gradients of device parameters are device memory.
  lin->forward(at::ones({2, 4})).sum().backward();
  EXPECT_FALSE(kiln::is_host_memory(lin->weight.grad()));
}

TEST(DeviceCheck, DeliberateHostBuffersAndForeignMemoryAreHost) {
  kiln::enable_device_check();
  EXPECT_TRUE(kiln::is_host_memory(kiln::host_buffer(8, /*pinned=*/false)));
  {
    kiln::HostAllocationScope host;
    EXPECT_TRUE(kiln::is_host_memory(at::zeros({2}, at::TensorOptions().device(kCpu))));
  }
  EXPECT_FALSE(kiln::is_host_memory(at::zeros({2}, at::TensorOptions().device(kCpu))));
  std::vector<float> v(4, 1.0f);
  EXPECT_TRUE(kiln::is_host_memory(at::from_blob(v.data(), {4})));
}

// device_to_host_reads: what would wait for a GPU -- a scalar or a truth value out of device
// memory, a copy of it into host memory (to_host) -- is counted; work on either side alone, and
// host-to-device copies, are not.
TEST(DeviceCheck, CountsTheHostsReadsOfDeviceMemory) {
  kiln::enable_device_check();
  const at::Tensor h = at::ones({4}), d = at::ones({4}, at::TensorOptions().device(kCpu));
  const int64_t start = kiln::device_to_host_reads();
  (void)(d * 2 + 1).sum();
  (void)h.sum().item<float>();            // host memory: no device to wait for
  (void)kiln::to_device(h, kCpu);         // host to device
  at::Tensor dh = at::empty({4}, d.options());
  dh.copy_(h);
  EXPECT_EQ(kiln::device_to_host_reads(), start);
  (void)d.sum().item<float>();  // 1
  EXPECT_EQ(kiln::device_to_host_reads(), start + 1);
  const at::Tensor back = kiln::to_host(d * 3);  // 2
  EXPECT_TRUE(kiln::is_host_memory(back));
  EXPECT_EQ(back[0].item<float>(), 3.0f);  // host memory: not a read
  EXPECT_EQ(kiln::device_to_host_reads(), start + 2);
  (void)at::equal(d, d);  // 3
  (void)static_cast<bool>(d.sum().is_nonzero());  // 4
  EXPECT_EQ(kiln::device_to_host_reads(), start + 4);
}

// waiting_host_to_device_copies: a copy into device memory waits on a GPU when it is blocking or
// from pageable memory (issue 34: the ep dispatch's index went that way, a second sync per layer
// the read counter did not see); only a non-blocking copy from page-locked memory does not.
TEST(DeviceCheck, CountsTheCopiesIntoDeviceMemoryThatWait) {
  kiln::enable_device_check();
  const at::Tensor pageable = at::ones({4}), pinned = kiln::host_buffer(4, /*pinned=*/true).fill_(1.0f);
  EXPECT_TRUE(kiln::is_host_memory(pinned));
  const int64_t start = kiln::waiting_host_to_device_copies(), syncs = kiln::host_syncs();
  (void)kiln::to_device(pinned, kCpu, /*non_blocking=*/true);  // asynchronous
  at::Tensor d = at::empty({4}, at::TensorOptions().device(kCpu));
  d.copy_(d * 2);                                              // device to device
  EXPECT_EQ(kiln::waiting_host_to_device_copies(), start);
  (void)kiln::to_device(pinned, kCpu);                         // 1: blocking
  (void)kiln::to_device(pageable, kCpu, /*non_blocking=*/true);  // 2: pageable
  d.copy_(pageable);                                           // 3
  (void)kiln::to_device(at::tensor({1, 2, 3}, at::kLong), kCpu, true);  // 4: at::tensor is pageable
  EXPECT_EQ(kiln::waiting_host_to_device_copies(), start + 4);
  EXPECT_EQ(kiln::host_syncs(), syncs + 4);
  (void)d.sum().item<float>();
  EXPECT_EQ(kiln::host_syncs(), syncs + 5);
}

#if defined(KILN_WITH_CUDA)
// The GPU half without a GPU: c10::cuda::warn_or_error_on_sync is what LibTorch calls at each
// synchronizing CUDA call (memcpy_and_sync, stream_synchronize, ...); it only looks at the mode, so
// it is called here directly. Counted on the thread that enabled the count, and only that warning.
TEST(DeviceCheck, CudaSyncCountTakesLibTorchsSyncWarningsOfItsThread) {
  EXPECT_FALSE(kiln::host_sync_count_enabled());
  c10::cuda::warn_or_error_on_sync();  // the mode is off: nothing said, nothing counted
  EXPECT_EQ(kiln::host_syncs(), 0);
  kiln::enable_cuda_sync_count();
  EXPECT_TRUE(kiln::host_sync_count_enabled());
  EXPECT_FALSE(kiln::device_check_enabled());  // the CPU's sides stay off
  c10::cuda::warn_or_error_on_sync();
  c10::cuda::warn_or_error_on_sync();
  EXPECT_EQ(kiln::host_syncs(), 2);
  std::thread([] { c10::cuda::warn_or_error_on_sync(); }).join();  // another thread: LibTorch prints it
  EXPECT_EQ(kiln::host_syncs(), 2);
  TORCH_WARN("an unrelated warning");  // passed on to the handler it replaced
  EXPECT_EQ(kiln::host_syncs(), 2);
  kiln::enable_cuda_sync_count();  // idempotent: one counter, not two in a chain
  c10::cuda::warn_or_error_on_sync();
  EXPECT_EQ(kiln::host_syncs(), 3);
}
#endif
