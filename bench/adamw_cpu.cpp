// bench/adamw_cpu.cpp -- kiln_adamw_bench: AdamW on the CPU over one flat fp32 buffer, in
// parameters per second, for kiln::cpu_adamw and LibTorch's two multi-tensor implementations.
//
//   kiln_adamw_bench [--n 100000000] [--threads T] [--iters 10] [--chunk 1000000]
//
// Rows:
//   kiln::cpu_adamw          optim/cpu_adamw.h on the raw pointers
//   at::_fused_adamw_        LibTorch's fused kernel on one flat tensor (what kiln's AdamW calls)
//   foreach, 1 tensor        PyTorch's _multi_tensor_adamw (torch/optim/adam.py, foreach=True,
//   foreach, chunks          decoupled decay) as at::_foreach_* calls, on the flat tensor and on
//                            it split into --chunk-element views
//   memory roof (same bytes) reads p g m v and writes p m v with no real math: what the memory
//                            system allows, for scale
//   offload step, 3 passes   what ZeRO offload's host step did per unit before issue 50: g.mul_(c),
//                            cpu_adamw, copy_ of p into a bf16 working copy (42 bytes a parameter)
//   offload step, one pass   cpu_adamw with the factor and the bf16 copy in its pass (32 bytes)
// Every row updates the same buffers (p, g, m, v: 16 bytes a parameter, 1.6 GB at the default n).
// The rows take turns, one update each per round, so a change in the machine's speed (other jobs)
// falls on all of them alike; after one warm-up round the time is the median of --iters rounds.
// GB/s counts the 28 bytes an update must move per parameter (the offload rows move more: 42, 32).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_addcdiv.h>
#include <ATen/ops/_foreach_addcmul.h>
#include <ATen/ops/_foreach_div.h>
#include <ATen/ops/_foreach_lerp.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_sqrt.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <torch/version.h>

#include "optim/cpu_adamw.h"

namespace {

constexpr double kLr = 1e-4, kBeta1 = 0.9, kBeta2 = 0.95, kEps = 1e-8, kWd = 0.1;

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x.size() % 2 ? x[x.size() / 2] : (x[x.size() / 2 - 1] + x[x.size() / 2]) / 2;
}

// torch/optim/adam.py _multi_tensor_adam, capturable=False, decoupled_weight_decay=True.
void foreach_adamw(std::vector<at::Tensor>& p, std::vector<at::Tensor>& g,
                   std::vector<at::Tensor>& m, std::vector<at::Tensor>& v, int64_t step) {
  const double bc1 = 1 - std::pow(kBeta1, step), bc2 = 1 - std::pow(kBeta2, step);
  const std::vector<at::Scalar> step_size(p.size(), at::Scalar(-(kLr / bc1)));
  const std::vector<at::Scalar> bc2_sqrt(p.size(), at::Scalar(std::sqrt(bc2)));
  at::_foreach_mul_(p, 1 - kLr * kWd);
  at::_foreach_lerp_(m, g, 1 - kBeta1);
  at::_foreach_mul_(v, kBeta2);
  at::_foreach_addcmul_(v, g, g, 1 - kBeta2);
  auto denom = at::_foreach_sqrt(v);
  at::_foreach_div_(denom, bc2_sqrt);
  at::_foreach_add_(denom, kEps);
  at::_foreach_addcdiv_(p, m, denom, step_size);
}

// AdamW's memory traffic (read p g m v, write p m v) with math that leaves the values as they
// are: x * one + g * zero.
void same_bytes(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                float* __restrict__ v, int64_t n, float one, float zero) {
  for (int64_t i = 0; i < n; ++i) {
    const float gz = g[i] * zero;
    p[i] = p[i] * one + gz;
    m[i] = m[i] * one + gz;
    v[i] = v[i] * one + gz;
  }
}

std::vector<at::Tensor> chunks_of(const at::Tensor& t, int64_t chunk) {
  std::vector<at::Tensor> out;
  for (int64_t i = 0; i < t.numel(); i += chunk) {
    out.push_back(t.narrow(0, i, std::min(chunk, t.numel() - i)));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  // --name value pairs, parsed here: cxxopts refuses a one-letter long flag such as --n.
  int64_t n = 100000000, chunk = 1000000;
  int threads = 0, iters = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::printf("usage: kiln_adamw_bench [--n 100000000] [--threads T (0: LibTorch's default)] "
                  "[--iters 10] [--chunk 1000000]\n");
      return 0;
    }
    int64_t* target = flag == "--n" ? &n : flag == "--chunk" ? &chunk : nullptr;
    int* small = flag == "--threads" ? &threads : flag == "--iters" ? &iters : nullptr;
    char* end = nullptr;
    const long long value = i + 1 < argc ? std::strtoll(argv[i + 1], &end, 10) : 0;
    if ((!target && !small) || i + 1 >= argc || *end != '\0' || value < 0 ||
        (small && value > INT32_MAX)) {
      std::fprintf(stderr, "kiln_adamw_bench: bad flag or value at '%s' (see --help)\n", argv[i]);
      return 2;
    }
    if (target) *target = value;
    if (small) *small = static_cast<int>(value);
    ++i;
  }
  if (n <= 0 || iters <= 0 || chunk <= 0) {
    std::fprintf(stderr, "kiln_adamw_bench: --n, --iters and --chunk must be positive\n");
    return 2;
  }
  if (threads > 0) at::set_num_threads(threads);

  at::manual_seed(0);
  at::Tensor p = at::randn({n}), g = at::randn({n}).mul_(1e-2);
  at::Tensor m = at::zeros({n}), v = at::zeros({n});
  float *pp = p.data_ptr<float>(), *gp = g.data_ptr<float>(), *mp = m.data_ptr<float>(),
        *vp = v.data_ptr<float>();
  int64_t t = 0;  // the step count keeps advancing across rows; only the time is measured

  struct Row {
    std::string name;
    std::function<void()> run;
    std::vector<double> seconds;
  };
  std::vector<Row> rows;
  auto add_row = [&](std::string name, std::function<void()> run) {
    rows.push_back(Row{std::move(name), std::move(run), {}});
  };
  auto next_step = [&] {  // the update's settings, the step advanced
    kiln::CpuAdamWStep s;
    s.lr = kLr;
    s.beta1 = kBeta1;
    s.beta2 = kBeta2;
    s.eps = kEps;
    s.weight_decay = kWd;
    s.step = ++t;
    return s;
  };
  add_row("kiln::cpu_adamw", [&] { kiln::cpu_adamw(pp, gp, mp, vp, n, next_step()); });
  at::Tensor step = at::zeros({}, at::kFloat);
  add_row("at::_fused_adamw_", [&] {
    step.fill_(static_cast<double>(++t));
    at::_fused_adamw_({p}, {g}, {m}, {v}, {}, {step}, kLr, kBeta1, kBeta2, kWd, kEps, false, false);
  });
  std::vector<at::Tensor> P1{p}, G1{g}, M1{m}, V1{v};
  add_row("foreach, 1 tensor", [&] { foreach_adamw(P1, G1, M1, V1, ++t); });
  auto P = chunks_of(p, chunk), G = chunks_of(g, chunk), M = chunks_of(m, chunk),
       V = chunks_of(v, chunk);
  add_row("foreach, " + std::to_string(P.size()) + " chunks",
          [&] { foreach_adamw(P, G, M, V, ++t); });
  volatile float one_v = 1.0f, zero_v = 0.0f;  // read at run time: the stores cannot be dropped
  const float one = one_v, zero = zero_v;
  add_row("memory roof (same bytes)", [&] {
    at::parallel_for(0, n, 32768, [&](int64_t b, int64_t e) {
      same_bytes(pp + b, gp + b, mp + b, vp + b, e - b, one, zero);
    });
  });

  at::Tensor w16 = at::empty({n}, at::kBFloat16);
  const double factor = 0.999;  // a clip factor: anything but 1 (g shrinks a little each round)
  add_row("offload step, 3 passes", [&] {
    g.mul_(factor);
    kiln::cpu_adamw(pp, gp, mp, vp, n, next_step());
    w16.copy_(p);
  });
  add_row("offload step, one pass", [&] {
    kiln::CpuAdamWStep s = next_step();
    s.grad_scale = factor;
    kiln::cpu_adamw(pp, gp, mp, vp, n, s, w16.data_ptr(), kiln::CpuWorking::bf16);
  });

  // Rounds of one update per row (see the top); round 0 is the warm-up.
  for (int r = 0; r <= iters; ++r) {
    for (auto& row : rows) {
      const auto t0 = std::chrono::steady_clock::now();
      row.run();
      const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
      if (r > 0) row.seconds.push_back(dt.count());
    }
  }

  std::printf("n = %lld fp32 parameters, %d intra-op threads, LibTorch %s, CPU capability %s, "
              "median of %d\n",
              static_cast<long long>(n), at::get_num_threads(), TORCH_VERSION,
              at::get_cpu_capability().c_str(), iters);
  std::printf("%-26s %10s %12s %8s %10s\n", "", "ms/update", "Mparam/s", "GB/s", "vs fused");
  const double fused = median(rows[1].seconds);
  for (auto& r : rows) {
    const double sec = median(r.seconds);
    std::printf("%-26s %10.3f %12.0f %8.1f %9.2fx\n", r.name.c_str(), sec * 1e3, n / sec / 1e6,
                28.0 * n / sec / 1e9, fused / sec);
  }
  return 0;
}
