// tests/test_zero_engine.cpp -- the ZeRO engine (parallel/zero.h) in one process, over a group of
// one: the streamed gradient buffer, the delayed update, and ZeRO-3's 8-bit gather of float8 weights.
//
// The streamed buffer (ZeRO-2/3): each parameter's first gradient of a micro-step is copied into a
// buffer that is not zeroed first, so the parameters a backward leaves without a gradient must be
// zeroed when the unit's reduction launches -- checked with a backward that reaches one parameter
// of a block, after a full one has left gradients in the allocator's memory.
//
// ZeRO-Offload's delayed parameter update (--offload-delayed-update;
// parallel/zero.h, "The delayed update") against a reference of its rule written here apart from
// the engine: kiln's single-process AdamW (optim/adamw.h, the ground truth of every parity test)
// over a plain model, whose forward and backward run on weights one update old:
//   D_1 = M_0,  D_k = M_{k-2} (k >= 2),  M_k = AdamW(M_{k-1}, clip(g(D_k)))
// and, after a publication at step s (a save), D_{s+1} = M_s: the delay restarts.
//
// The engine runs over a group of one (distributed/comm_self.h) as a one-process `kiln train
// --zero S --offload optimizer` does, driven as the trainer drives it (begin_micro, the micro-
// batch's backward, end_micro; the norm, the clipping factor, step). Its host AdamW
// (optim/cpu_adamw.h) and the reference's (LibTorch's _fused_adamw_) compute the same formula in
// fp32, possibly in another order, so the check allows rounding: losses within 2e-6 relative and
// weights within 2e-6 absolute after 6 steps at lr 1e-2 (measured on this project's x86 CPUs:
// equal bit for bit, 0 and 0). The same harness without the delay checks the reference (the engine's undelayed step
// against the plain one), and the delayed and undelayed runs must differ by far more than the
// tolerance (a rule that did nothing would pass the first two checks).
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "distributed/comm_self.h"
#include "distributed/error.h"
#include "kernels/float8.h"
#include "models/gpt.h"
#include "optim/adamw.h"
#include "optim/grad_clip.h"
#include "parallel/zero.h"

namespace {

using kiln::GPT;
using kiln::GPTConfig;

constexpr int kSteps = 6;
constexpr int kAccum = 2;
constexpr double kLr = 1e-2, kClip = 1.0;
const kiln::AdamWConfig kAdam{0.9, 0.95, 1e-8, 0.1};

struct Trace {
  std::vector<double> losses;     // per step, the mean over its micro-batches
  std::vector<at::Tensor> final;  // the fp32 weights after the last step, in parameters() order
};

GPTConfig config() {
  GPTConfig c = GPTConfig::preset("tiny");
  c.dropout = 0.0;
  return c;
}

// The batches: step k's micro-batch j, the same in every run.
std::pair<at::Tensor, at::Tensor> batch(const GPTConfig& c, int k, int j) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + 10 * k + j);
  auto tokens = at::randint(c.vocab_size, {2, c.seq_len + 1}, gen, at::kLong);
  return {tokens.narrow(1, 0, c.seq_len), tokens.narrow(1, 1, c.seq_len)};
}

at::Tensor factor_of(const at::Tensor& sq_norm) {
  at::Tensor f = kiln::clip_factor(sq_norm.to(at::kFloat).sqrt(), kClip, 1.0);
  return f.defined() ? f : at::ones({}, at::kFloat);
}

// The rule, over kiln's plain AdamW. publish_at: the step after whose update the weights catch
// up (a save's publication; 0: never). from: the updates published undelayed first (delay_from).
Trace reference(bool delayed, int publish_at = 0, int from = 0) {
  const GPTConfig c = config();
  GPT m(c);
  m.init_weights(1);
  auto params = m.parameters();
  kiln::AdamW opt(params, kAdam);
  auto copy = [&] {
    std::vector<at::Tensor> out;
    for (const auto& p : params) out.push_back(p.detach().clone());
    return out;
  };
  auto load = [&](const std::vector<at::Tensor>& from) {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(from[i]);
  };
  Trace t;
  std::vector<at::Tensor> forward_weights = copy();  // D_1 = M_0
  for (int k = 1; k <= kSteps; ++k) {
    const std::vector<at::Tensor> masters = copy();  // M_{k-1}
    if (delayed) load(forward_weights);
    m.zero_grad(/*set_to_none=*/true);
    double loss = 0.0;
    for (int j = 0; j < kAccum; ++j) {
      auto [x, y] = batch(c, k, j);
      auto l = m.loss(x, y);
      (l / kAccum).backward();
      loss += l.item<double>() / kAccum;
    }
    t.losses.push_back(loss);
    if (delayed) load(masters);
    at::Tensor sq = at::zeros({}, at::kDouble);
    for (const auto& p : params)
      if (p.grad().defined()) sq += p.grad().to(at::kDouble).square().sum();
    opt.step(kLr, at::Tensor(), factor_of(sq));
    // D_{k+1}: M_{k-1}, or M_k after a publication or while the delay has not started
    forward_weights = k == publish_at || k <= from ? copy() : masters;
  }
  t.final = copy();
  return t;
}

// Step k through the engine as the trainer drives it (its micro-batches' forward and backward, the
// norm, the clipping factor, the update); returns the step's mean loss.
double engine_step(kiln::ZeroEngine& z, GPT& m, const GPTConfig& c, int k) {
  double loss = 0.0;
  for (int j = 0; j < kAccum; ++j) {
    z.begin_micro(j);
    auto [x, y] = batch(c, k, j);
    auto l = m.loss(x, y);
    (l / kAccum).backward();
    z.end_micro();
    loss += l.item<double>() / kAccum;
  }
  z.step(kLr, factor_of(z.local_grad_sq_norm()), at::zeros({}, at::kFloat));
  return loss;
}

// The engine, driven as the trainer drives it.
Trace engine(int stage, bool delayed, int publish_at = 0, int from = 0) {
  const GPTConfig c = config();
  GPT m(c);
  m.init_weights(1);
  kiln::ZeroConfig zc;
  zc.stage = stage;
  zc.offload = kiln::Offload::Optimizer;
  zc.grad_accum = kAccum;
  zc.delayed_update = delayed;
  zc.delay_from = from;
  kiln::ZeroEngine z(m, at::Device(at::kCPU), kiln::make_self_communicator("dp", "local"), zc, kAdam);
  Trace t;
  for (int k = 1; k <= kSteps; ++k) {
    t.losses.push_back(engine_step(z, m, c, k));
    if (k == publish_at) z.publish();
  }
  for (const auto& p : m.parameters()) t.final.push_back(z.gather_param(p, kiln::StatePart::Param));
  return t;
}

// The largest relative difference of the losses and absolute difference of the weights.
std::pair<double, double> distance(const Trace& a, const Trace& b) {
  double loss = 0.0, weight = 0.0;
  for (size_t k = 0; k < a.losses.size(); ++k)
    loss = std::max(loss, std::abs(a.losses[k] - b.losses[k]) / std::abs(a.losses[k]));
  for (size_t i = 0; i < a.final.size(); ++i)
    weight = std::max(weight, (a.final[i] - b.final[i]).abs().max().item<double>());
  return {loss, weight};
}

constexpr double kLossTol = 2e-6, kWeightTol = 2e-6;

void expect_close(const Trace& got, const Trace& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  ASSERT_EQ(got.final.size(), want.final.size());
  const auto [loss, weight] = distance(got, want);
  EXPECT_LE(loss, kLossTol) << what;
  EXPECT_LE(weight, kWeightTol) << what;
  std::printf("%s: losses within %.2e relative, weights within %.2e\n", what.c_str(), loss, weight);
}

class ZeroDelayed : public ::testing::TestWithParam<int> {};

TEST_P(ZeroDelayed, UndelayedEngineMatchesThePlainReference) {
  expect_close(engine(GetParam(), false), reference(false), "ZeRO-" + std::to_string(GetParam()) + " undelayed");
}

TEST_P(ZeroDelayed, DelayedEngineFollowsTheRule) {
  const Trace delayed = engine(GetParam(), true);
  expect_close(delayed, reference(true), "ZeRO-" + std::to_string(GetParam()) + " delayed");
  // Steps 1 and 2 both run on the initial weights (D_1 = D_2 = M_0), where the undelayed run's
  // step 2 runs on M_1: the delay shows from step 2 on.
  const Trace plain = reference(false);
  EXPECT_DOUBLE_EQ(delayed.losses[0], plain.losses[0]);
  const auto [loss, weight] = distance(delayed, plain);
  EXPECT_GT(loss, 100 * kLossTol) << "the delay changed nothing";
  EXPECT_GT(weight, 100 * kWeightTol) << "the delay changed nothing";
}

TEST_P(ZeroDelayed, APublicationRestartsTheDelay) {
  // A save after step 3 publishes M_3: step 4 runs on it, then the delay goes on.
  expect_close(engine(GetParam(), true, 3), reference(true, 3), "ZeRO-" + std::to_string(GetParam()) + " delayed, published at 3");
  const auto [loss, weight] = distance(reference(true, 3), reference(true));
  EXPECT_GT(loss, 100 * kLossTol) << "the publication changed nothing";
  (void)weight;
}

TEST_P(ZeroDelayed, TheDelayStartsAfterDelayFromUpdates) {
  // --offload-delay-from 3: updates 1-3 undelayed (steps 2-4 on M_1..M_3), then steps 5, 6 one
  // update behind (on M_3, M_4).
  const Trace late = engine(GetParam(), true, 0, 3);
  expect_close(late, reference(true, 0, 3), "ZeRO-" + std::to_string(GetParam()) + " delayed from update 4");
  const Trace plain = reference(false);
  for (int k = 0; k < 4; ++k) EXPECT_DOUBLE_EQ(late.losses[static_cast<size_t>(k)], plain.losses[static_cast<size_t>(k)]) << k;
  EXPECT_GT(std::abs(late.losses[5] - plain.losses[5]) / plain.losses[5], 100 * kLossTol) << "the delay never started";
}

TEST_P(ZeroDelayed, ASlowHostWorkerChangesNothing) {
  // The host worker late on purpose (each task 20 ms behind): the next forward and backward run
  // while the update is queued; the gathers must not wait for it, the downloads must.
  setenv("KILN_TEST_HOST_WORKER", "thread", 1);
  setenv("KILN_TEST_HOST_STEP_DELAY_MS", "20", 1);
  const Trace slow = engine(GetParam(), true);
  unsetenv("KILN_TEST_HOST_STEP_DELAY_MS");
  setenv("KILN_TEST_HOST_WORKER", "inline", 1);
  const Trace inline_ = engine(GetParam(), true);
  unsetenv("KILN_TEST_HOST_WORKER");
  EXPECT_EQ(slow.losses, inline_.losses);
  for (size_t i = 0; i < slow.final.size(); ++i) EXPECT_TRUE(at::equal(slow.final[i], inline_.final[i])) << i;
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroDelayed, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& i) { return "zero" + std::to_string(i.param); });

TEST(ZeroStreamed, ParametersWithoutAGradientCountAsZero) {
  for (const int stage : {2, 3}) {
    const GPTConfig c = config();
    GPT m(c);
    m.init_weights(1);
    kiln::ZeroConfig zc;
    zc.stage = stage;
    zc.grad_accum = 2;
    kiln::ZeroEngine z(m, at::Device(at::kCPU), kiln::make_self_communicator("dp", "local"), zc, kAdam);
    // A whole step first: the buffers it frees hold gradients, which the next ones may reuse.
    for (int j = 0; j < 2; ++j) {
      z.begin_micro(j);
      auto [x, y] = batch(c, 1, j);
      (m.loss(x, y) * 1000.0).backward();
      z.end_micro();
    }
    z.step(kLr, at::ones({}, at::kFloat), at::zeros({}, at::kFloat));
    // Then a step whose backward reaches one parameter of the last block (d sum(w) / dw = 1):
    // every other gradient is 0, so the squared norm is (1 + 1)^2 x numel over the 2 micro-steps.
    // A forward first, whose result no backward reaches: under ZeRO-3 it leaves the last block
    // gathered for its backward.
    auto& w = m.h[c.n_layer - 1]->as<kiln::BlockImpl>()->attn->c_attn->weight;
    for (int j = 0; j < 2; ++j) {
      z.begin_micro(j);
      (void)m.hidden(batch(c, 2, j).first);
      w.sum().backward();
      z.end_micro();
    }
    const double sq = z.local_grad_sq_norm().item<double>();
    EXPECT_DOUBLE_EQ(sq, 4.0 * static_cast<double>(w.numel())) << "ZeRO-" << stage;
  }
}

// ZeRO-3's 8-bit gather of the float8 weights (parallel/zero.h, "Float8 weights"): every block
// layer in float8 (tensorwise), bf16 working weights; one engine whose layers read q_W from the
// gathered 8-bit units, one whose layers quantise their gathered 16-bit W themselves. The bytes are
// the same (the amax of the pieces is the whole's, the cast elementwise), so the two runs are
// equal bit for bit, step after step -- which also checks that the 8-bit shard is requantised
// after each update (a stale one would run a step on the old weights). With the optimizer offloaded
// the update reaches the shard by its upload; delayed, by publish().
struct Float8Run {
  std::vector<double> losses;
  std::vector<at::Tensor> final;
  int64_t device_params = 0;
};
Float8Run float8_engine(kiln::Offload offload, bool delayed, bool eight_bit) {
  const GPTConfig c = config();
  GPT m(c);
  m.init_weights(1);
  m.set_float8(kiln::float8_tensorwise(), /*auto_filter=*/false);
  std::vector<std::pair<at::Tensor, std::shared_ptr<kiln::Float8Tensor>>> slots;
  for (kiln::LinearImpl* l : m.float8_linears()) {
    l->float8.weight8 = std::make_shared<kiln::Float8Tensor>();
    slots.emplace_back(l->weight, l->float8.weight8);
  }
  EXPECT_EQ(slots.size(), 16u);
  kiln::ZeroConfig zc;
  zc.stage = 3;
  zc.offload = offload;
  zc.delayed_update = delayed;
  zc.grad_accum = kAccum;
  zc.param_dtype = at::kBFloat16;
  if (eight_bit) {
    zc.float8_weight = [slots](const at::Tensor& p) -> std::shared_ptr<kiln::Float8Tensor> {
      for (const auto& [w, slot] : slots)
        if (w.is_same(p)) return slot;
      return nullptr;
    };
  }
  Float8Run r;
  {
    kiln::ZeroEngine z(m, at::Device(at::kCPU), kiln::make_self_communicator("dp", "local"), zc, kAdam);
    for (const auto& [w, slot] : slots) EXPECT_EQ(slot->data.defined(), eight_bit);
    for (int k = 1; k <= 4; ++k) r.losses.push_back(engine_step(z, m, c, k));
    for (const auto& p : m.parameters()) r.final.push_back(z.gather_param(p, kiln::StatePart::Param));
    r.device_params = z.memory().device.params;
  }
  for (const auto& [w, slot] : slots) EXPECT_FALSE(slot->data.defined());  // the engine gone, the layers quantise W again
  return r;
}

TEST(ZeroFloat8, TheEightBitGatherEqualsTheLayersOwnQuantisation) {
  struct Case {
    kiln::Offload offload;
    bool delayed;
    const char* name;
  };
  for (const Case& c : {Case{kiln::Offload::None, false, "no offload"}, Case{kiln::Offload::Optimizer, false, "offload optimizer"},
                        Case{kiln::Offload::Optimizer, true, "offload optimizer, delayed"}}) {
    const Float8Run a = float8_engine(c.offload, c.delayed, /*eight_bit=*/true), b = float8_engine(c.offload, c.delayed, false);
    ASSERT_EQ(a.losses.size(), 4u);
    for (size_t k = 0; k < a.losses.size(); ++k) EXPECT_EQ(a.losses[k], b.losses[k]) << c.name << ", step " << k + 1;
    EXPECT_NE(a.losses[0], a.losses[3]) << c.name;  // it trains
    ASSERT_EQ(a.final.size(), b.final.size());
    for (size_t i = 0; i < a.final.size(); ++i) EXPECT_TRUE(at::equal(a.final[i], b.final[i])) << c.name << ", parameter " << i;
    // 16 float8 weights, 196,608 elements a block: their 8-bit shard beside the 2-byte one, padded
    // alike (a group of one pads to 64 elements: 196,608 and the rest's 1,664 both are)
    if (c.offload == kiln::Offload::None) EXPECT_EQ(a.device_params - b.device_params, 4 * 196608) << c.name;
    std::printf("ZeRO-3 float8, %s: 4 steps equal bit for bit (loss %.6f -> %.6f)\n", c.name, a.losses[0], a.losses[3]);
  }
}

TEST(ZeroFloat8, NeedsZeroThreeWithoutOffloadAll) {
  GPT m(config());
  m.init_weights(1);
  kiln::ZeroConfig zc;
  zc.float8_weight = [](const at::Tensor&) { return std::shared_ptr<kiln::Float8Tensor>(); };
  zc.stage = 2;
  EXPECT_THROW(kiln::ZeroEngine(m, at::Device(at::kCPU), kiln::make_self_communicator("dp", "local"), zc, kAdam), kiln::ConfigError);
  zc.stage = 3;
  zc.offload = kiln::Offload::All;
  EXPECT_THROW(kiln::ZeroEngine(m, at::Device(at::kCPU), kiln::make_self_communicator("dp", "local"), zc, kAdam), kiln::ConfigError);
}

TEST(ZeroDelayedConfig, NeedsOffloadOptimizer) {
  GPT m(config());
  m.init_weights(1);
  kiln::ZeroConfig zc;
  zc.stage = 3;
  zc.offload = kiln::Offload::All;
  zc.delayed_update = true;
  EXPECT_THROW(kiln::ZeroEngine(m, at::Device(at::kCPU), kiln::make_self_communicator("dp", "local"), zc, kAdam),
               kiln::ConfigError);
}

}  // namespace
