// tests/test_cpu_adamw.cpp -- kiln::cpu_adamw against LibTorch's fused AdamW kernel, against the
// formula in double precision, and across thread counts and segmentations of the buffer.
//
// Sizes 1, 7 and 1000003 are not multiples of the vector width (8 with AVX2), so the partial last
// vector is always exercised; 1000003 is large enough for at::parallel_for to split it.
// Gradient magnitudes are log-uniform over 1e-10 .. 1e2, so eps (1e-8) dominates the denominator
// for some elements and is negligible for others.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "optim/cpu_adamw.h"

namespace {

constexpr double kU = 0x1p-24;  // unit roundoff of float: a correctly rounded op errs <= kU |x|

// randn's sign times a magnitude log-uniform over [1e-10, 1e2].
at::Tensor wide_randn(int64_t n, at::Generator& gen) {
  return at::randn({n}, gen).sign() * at::pow(10.0, at::rand({n}, gen) * 12 - 10);
}

struct State {
  at::Tensor p, m, v;
  State clone() const { return {p.clone(), m.clone(), v.clone()}; }
};

State random_state(int64_t n, at::Generator& gen) {
  // Moments as after a few steps: m of either sign, v >= 0.
  return {at::randn({n}, gen), wide_randn(n, gen) * 0.1, wide_randn(n, gen).square() * 0.05};
}

void kiln_step(State& s, const at::Tensor& g, const kiln::CpuAdamWStep& st) {
  kiln::cpu_adamw(s.p.data_ptr<float>(), g.data_ptr<float>(), s.m.data_ptr<float>(),
                  s.v.data_ptr<float>(), s.p.numel(), st);
}

void torch_step(State& s, const at::Tensor& g, const kiln::CpuAdamWStep& st) {
  auto step = at::full({}, static_cast<double>(st.step), at::kFloat);
  at::_fused_adamw_({s.p}, {g}, {s.m}, {s.v}, /*max_exp_avg_sqs=*/{}, {step}, st.lr, st.beta1,
                    st.beta2, st.weight_decay, st.eps, /*amsgrad=*/false, /*maximize=*/false);
}

kiln::CpuAdamWStep step_at(int t, double wd, double beta1 = 0.9, double beta2 = 0.95) {
  kiln::CpuAdamWStep st;
  st.beta1 = beta1;
  st.beta2 = beta2;
  st.lr = 1e-2 / t;  // a different lr each step
  st.weight_decay = wd;
  st.step = t;
  return st;
}

}  // namespace

// Against at::_fused_adamw_, the kernel kiln's AdamW uses: six steps from the same state with the
// same gradients, each run on its own. beta1 = 0.3 takes LibTorch's other lerp form (weight
// 1 - b1 >= 0.5).
//
// Expected: bit-identical over LibTorch's vector loop, i.e. all but the last n % Vec::size()
// elements (8 floats at AVX2 and DEFAULT, 16 at AVX512; the check spares the last n % 16). Both
// evaluate the same fp32 operations in the same order at the same ISA level, including the FMA
// that LibTorch's compiler formed in v's update and cpu_adamw writes out (cpu_adamw_kernel.h).
// A LibTorch compiled without that contraction would fail only this check, by 1 ulp of v.
//
// Tolerance, for every element (LibTorch's scalar tail rounds in another order, so n = 1 and 7
// rely on it alone): max |ours - torch| <= 8 kU max |torch|, 4 to 8 ulps of the tensor's largest
// value. One update is at most ~5 rounded operations per value, each of an intermediate no larger
// than about the tensor's largest value (|g - m| <= |g| + |m|, (1 - b2) g^2 <= v', the step
// << |p|), so two evaluation orders differ by a few ulps of it; the gap measured on the tail is
// <= 2 ulps after six steps. A wrong coefficient, bias correction or lerp form is off by far
// more (dropping 1 - b1^t doubles the step at t = 6).
TEST(CpuAdamW, MatchesTorchFusedAdamW) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(2024);
  struct Betas {
    double b1, b2;
  };
  for (int64_t n : {1, 7, 1000003}) {
    for (double wd : {0.1, 0.0}) {
      for (Betas b : {Betas{0.9, 0.95}, Betas{0.3, 0.5}}) {
        SCOPED_TRACE("n = " + std::to_string(n) + ", weight_decay = " + std::to_string(wd) +
                     ", beta1 = " + std::to_string(b.b1));
        State ours = random_state(n, gen);
        State ref = ours.clone();
        const int64_t body = n - n % 16;
        for (int t = 1; t <= 6; ++t) {
          const at::Tensor g = wide_randn(n, gen);
          kiln_step(ours, g, step_at(t, wd, b.b1, b.b2));
          torch_step(ref, g, step_at(t, wd, b.b1, b.b2));
          for (auto [x, y] : {std::pair{ours.p, ref.p}, {ours.m, ref.m}, {ours.v, ref.v}}) {
            EXPECT_EQ(x.narrow(0, 0, body).ne(y.narrow(0, 0, body)).sum().item<int64_t>(), 0)
                << "elements of LibTorch's vector loop that differ, step " << t;
            EXPECT_LE((x - y).abs().max().item<double>(), 8 * kU * y.abs().max().item<double>())
                << "step " << t;
          }
        }
      }
    }
  }
}

// Against the textbook formula in double, one step at a time from the kernel's own state:
//   m' = b1 m + (1 - b1) g      v' = b2 v + (1 - b2) g^2
//   p' = p (1 - lr wd) - lr (m' / (1 - b1^t)) / (sqrt(v' / (1 - b2^t)) + eps)
// Each fp32 result is a handful of correctly rounded operations away from the exact one, so the
// bound is a small multiple of kU times the size of the terms that were rounded (not of the
// result, which can cancel to ~0 for m and p):
//   m: 3 roundings (g - m, the fused add, the coefficient) of |m'| + (1 - b1)|g - m| -> 4 kU
//   v: 6 roundings on non-negative terms (b2, 1 - b2, three products, the sum)       -> 8 kU |v'|
//   p: the decay (2), the step size (2), sqrt and its divisor (2), eps, the quotient and the
//      sum: <= 10 roundings of |p| + |update| -> 12 kU. p' is checked given the kernel's m', v',
//      so an error in m' is reported once, against m.
TEST(CpuAdamW, MatchesDoublePrecisionFormula) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  for (int64_t n : {1, 7, 1000003}) {
    for (double wd : {0.1, 0.0}) {
      SCOPED_TRACE("n = " + std::to_string(n) + ", weight_decay = " + std::to_string(wd));
      State s = random_state(n, gen);
      for (int t = 1; t <= 4; ++t) {
        const auto st = step_at(t, wd);
        const at::Tensor g = wide_randn(n, gen);
        const State before = s.clone();
        kiln_step(s, g, st);
        const double b1 = st.beta1, b2 = st.beta2;
        const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
        const float *p0 = before.p.data_ptr<float>(), *m0 = before.m.data_ptr<float>(),
                    *v0 = before.v.data_ptr<float>(), *gg = g.data_ptr<float>();
        const float *p1 = s.p.data_ptr<float>(), *m1 = s.m.data_ptr<float>(),
                    *v1 = s.v.data_ptr<float>();
        int64_t bad_m = 0, bad_v = 0, bad_p = 0;
        for (int64_t i = 0; i < n; ++i) {
          const double gi = gg[i], mi = m0[i], vi = v0[i], pi = p0[i];
          const double m = b1 * mi + (1 - b1) * gi;
          const double v = b2 * vi + (1 - b2) * gi * gi;
          if (std::abs(m1[i] - m) > 4 * kU * (std::abs(m) + (1 - b1) * std::abs(gi - mi))) ++bad_m;
          if (std::abs(v1[i] - v) > 8 * kU * v) ++bad_v;
          const double update =
              st.lr * (double(m1[i]) / bc1) / (std::sqrt(double(v1[i]) / bc2) + st.eps);
          const double p = pi * (1 - st.lr * wd) - update;
          if (std::abs(p1[i] - p) > 12 * kU * (std::abs(pi) + std::abs(update))) ++bad_p;
        }
        EXPECT_EQ(bad_m, 0) << "step " << t;
        EXPECT_EQ(bad_v, 0) << "step " << t;
        EXPECT_EQ(bad_p, 0) << "step " << t;
      }
    }
  }
}

// The same bits however the buffer is cut: one thread, four threads, and separate calls on
// segments that start at odd offsets (as ZeRO's shards do) -- every element runs the same vector
// code wherever a chunk or segment boundary falls. n = 1000003 is 62501 blocks of 16, 30 grains
// of cpu_adamw's 2048, so at::parallel_for gives each of 4 threads a chunk (4 threads on a 2-core
// machine is fine: only the split matters). cpu_adamw.cpp refuses to compile where
// at::parallel_for would not split (an OpenMP LibTorch, the file built without OpenMP).
TEST(CpuAdamW, ThreadsAndSegmentsDoNotChangeBits) {
  const int saved = at::get_num_threads();
  const int64_t n = 1000003;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(99);
  const State start = random_state(n, gen);
  std::vector<at::Tensor> grads;
  for (int t = 0; t < 3; ++t) grads.push_back(wide_randn(n, gen));
  auto run = [&](int threads, const std::vector<int64_t>& cuts) {
    at::set_num_threads(threads);
    EXPECT_EQ(at::get_num_threads(), threads);
    State s = start.clone();
    for (int t = 1; t <= 3; ++t) {
      for (size_t k = 0; k + 1 < cuts.size(); ++k) {
        const int64_t b = cuts[k], len = cuts[k + 1] - cuts[k];
        kiln::cpu_adamw(s.p.data_ptr<float>() + b, grads[t - 1].data_ptr<float>() + b,
                        s.m.data_ptr<float>() + b, s.v.data_ptr<float>() + b, len,
                        step_at(t, 0.1));
      }
    }
    return s;
  };
  const State one = run(1, {0, n});
  const State four = run(4, {0, n});
  const State shards = run(2, {0, 5, 333337, 333338, 700001, n});
  at::set_num_threads(saved);
  for (const State* other : {&four, &shards}) {
    for (auto [a, b] : {std::pair{one.p, other->p}, {one.m, other->m}, {one.v, other->v}}) {
      EXPECT_EQ(std::memcmp(a.data_ptr<float>(), b.data_ptr<float>(), n * sizeof(float)), 0)
          << (other == &four ? "4 threads" : "separate calls on segments");
    }
  }
}

TEST(CpuAdamW, EmptyIsANoOpAndBadArgumentsThrow) {
  kiln::CpuAdamWStep st;
  st.lr = 1e-3;
  kiln::cpu_adamw(nullptr, nullptr, nullptr, nullptr, 0, st);
  float x = 1;
  EXPECT_THROW(kiln::cpu_adamw(&x, &x, &x, &x, -1, st), std::invalid_argument);
  st.step = 0;
  EXPECT_THROW(kiln::cpu_adamw(&x, &x, &x, &x, 1, st), std::invalid_argument);
}

// The offloaded step's one pass (optim/cpu_adamw.h): the factor applied as g is read and the
// 16-bit copy written beside p must equal the three passes they replace -- g.mul_(factor),
// the update, copy_ into a bf16 / fp16 tensor -- bit for bit, at a size with a partial vector
// and a split over threads.
TEST(CpuAdamW, OnePassEqualsScaleUpdateAndCopy) {
  const int64_t n = 100003;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const State start = random_state(n, gen);
  const at::Tensor g = wide_randn(n, gen);
  for (const double factor : {1.0, 0.37, 1.0 / 1024}) {
    for (const auto& [kind, dtype] : {std::pair{kiln::CpuWorking::bf16, at::kBFloat16}, {kiln::CpuWorking::fp16, at::kHalf}}) {
      kiln::CpuAdamWStep st = step_at(3, 0.1);
      State three = start.clone();
      const at::Tensor scaled = g.clone();
      if (factor != 1.0) scaled.mul_(factor);
      kiln_step(three, scaled, st);
      const at::Tensor copied = three.p.to(dtype);

      State one = start.clone();
      const at::Tensor g_in = g.clone();
      at::Tensor out = at::empty({n}, dtype);
      st.grad_scale = factor;
      kiln::cpu_adamw(one.p.data_ptr<float>(), g_in.data_ptr<float>(), one.m.data_ptr<float>(), one.v.data_ptr<float>(), n, st,
                      out.data_ptr(), kind);
      EXPECT_TRUE(at::equal(one.p, three.p)) << "factor " << factor;
      EXPECT_TRUE(at::equal(one.m, three.m)) << "factor " << factor;
      EXPECT_TRUE(at::equal(one.v, three.v)) << "factor " << factor;
      EXPECT_TRUE(at::equal(out, copied)) << "factor " << factor << ", the 16-bit copy";
      EXPECT_TRUE(at::equal(g_in, g)) << "the gradient is read, not scaled in place";
    }
  }
  float x = 1;
  kiln::CpuAdamWStep st;
  st.lr = 1e-3;
  EXPECT_THROW(kiln::cpu_adamw(&x, &x, &x, &x, 1, st, nullptr, kiln::CpuWorking::bf16), std::invalid_argument);
}
