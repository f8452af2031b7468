// tests/test_host_accumulator.cpp -- parallel/host_accumulator.h on the CPU: every add lands,
// adds into one destination land in the order issued (the same sums as adding in line), the two
// slots are reused without losing a source, and drain() waits for all of it.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "parallel/host_accumulator.h"

TEST(HostAccumulator, SumsEqualAddingInLine) {
  kiln::HostAccumulator acc(c10::Device(c10::kCPU), /*capacity=*/1000, /*slots=*/2);
  std::vector<at::Tensor> got, want;
  for (int u = 0; u < 5; ++u) {
    got.push_back(at::zeros({100 + 150 * u}, at::kFloat));
    want.push_back(at::zeros({100 + 150 * u}, at::kFloat));
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  for (int micro = 0; micro < 4; ++micro) {   // four micro-steps, every unit each time
    for (size_t u = 0; u < got.size(); ++u) {
      at::Tensor src = at::randn({got[u].numel()}, gen);
      want[u].add_(src);
      acc.add(src, got[u]);
      src.fill_(1e9);  // the caller may drop or reuse its source at once
    }
  }
  acc.drain();
  for (size_t u = 0; u < got.size(); ++u) EXPECT_TRUE(at::equal(got[u], want[u])) << "unit " << u;
}

TEST(HostAccumulator, RefusesWhatItCannotAdd) {
  kiln::HostAccumulator acc(c10::Device(c10::kCPU), 10);
  EXPECT_ANY_THROW(acc.add(at::zeros({11}), at::zeros({11})));                 // over capacity
  EXPECT_ANY_THROW(acc.add(at::zeros({4}), at::zeros({5})));                   // sizes differ
  EXPECT_ANY_THROW(acc.add(at::zeros({4}, at::kDouble), at::zeros({4}, at::kDouble)));  // not fp32
}
