// tests/test_host_memory.cpp -- distributed/host_memory.h's pool: exact sizes, reuse of a returned
// buffer for the next request of its size, and the cap on what it keeps.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "distributed/host_memory.h"

TEST(HostBufferPool, ExactSizeAndReused) {
  auto pool = kiln::HostBufferPool::make();
  const at::Tensor like = at::empty({3, 5}, at::kFloat);
  void* first = nullptr;
  {
    at::Tensor a = pool->take(like, /*pinned=*/false);
    EXPECT_EQ(a.sizes(), like.sizes());
    EXPECT_EQ(a.scalar_type(), at::kFloat);
    EXPECT_EQ(pool->used_bytes(), 60u);
    EXPECT_EQ(pool->free_bytes(), 0u);
    first = a.data_ptr();
  }
  EXPECT_EQ(pool->used_bytes(), 0u);
  EXPECT_EQ(pool->free_bytes(), 60u);
  at::Tensor b = pool->take(like, false);
  EXPECT_EQ(b.data_ptr(), first);  // the same buffer again
  EXPECT_EQ(pool->free_bytes(), 0u);
  at::Tensor c = pool->take(at::empty({15}, at::kInt), false);  // same bytes, another dtype: fine
  EXPECT_EQ(c.scalar_type(), at::kInt);
  EXPECT_NE(c.data_ptr(), b.data_ptr());
}

TEST(HostBufferPool, KeepsNoMoreThanItsCap) {
  auto pool = kiln::HostBufferPool::make();
  // The cap is 2 x the largest buffer + 64 MiB: one-off sizes beyond it are given back.
  const int64_t mib = 1 << 20;
  std::vector<at::Tensor> held;
  for (int64_t k = 1; k <= 40; ++k) held.push_back(pool->take(at::empty({k * mib / 4 + k}, at::kFloat), false));
  size_t largest = 0;
  for (const auto& t : held) largest = std::max(largest, static_cast<size_t>(t.nbytes()));
  held.clear();
  EXPECT_LE(pool->free_bytes(), 2 * largest + 64 * static_cast<size_t>(mib));
  EXPECT_GT(pool->free_bytes(), 0u);
  EXPECT_EQ(pool->used_bytes(), 0u);
}

TEST(HostBufferPool, OutlivedByItsTensors) {
  at::Tensor t;
  {
    auto pool = kiln::HostBufferPool::make();
    t = pool->take(at::empty({4}, at::kDouble), false);
  }
  t.fill_(1.5);  // still valid: freed when t dies, not with the pool
  EXPECT_EQ(t.sum().item<double>(), 6.0);
}
