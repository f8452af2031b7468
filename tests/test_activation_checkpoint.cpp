// tests/test_activation_checkpoint.cpp -- activation checkpointing against the plain model:
// gradients bit for bit (dropout on, two accumulated steps, bf16 autocast), the memory autograd
// keeps between forward and backward, and that RNG replay is what makes the gradients equal.
//
// Tolerance: none. The recomputation runs the same ATen calls on the same inputs, with the same
// dropout masks (RNG replayed) and the same autocast casts, and the reentrant backward runs the
// same backward ops; the only reordering is of two-operand gradient sums (x + y == y + x in IEEE
// arithmetic). So every comparison is at::equal, in fp32 and under bf16 autocast alike.
#include <malloc.h>

#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "distributed/error.h"
#include "models/gpt.h"
#include "parallel/activation_checkpoint.h"
#include "plan/cost_model.h"

using kiln::ActivationCheckpointing;
using kiln::GPT;
using kiln::GPTConfig;

namespace {

constexpr int64_t kBatch = 4;

GPTConfig config(int64_t layers, double dropout) {
  auto c = GPTConfig::preset("tiny");  // d 128, 4 heads, T 128, vocabulary 512
  c.n_layer = layers;
  c.dropout = dropout;
  return c;
}

std::pair<at::Tensor, at::Tensor> batch(const GPTConfig& c, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto idx = at::randint(c.vocab_size, {kBatch, c.seq_len}, gen, at::kLong);
  auto tgt = at::randint(c.vocab_size, {kBatch, c.seq_len}, gen, at::kLong);
  return {idx, tgt};
}

// Mixed precision of the forward: off, bf16 autocast on the CPU with the cast cache cleared on
// leaving it (as torch.autocast's exit does), or bf16 with the cache cleared only after
// backward (a caller that merely toggles autocast: the recomputation then meets the forward's
// cached casts, and must not use them).
enum class Amp { Off, Bf16, Bf16CacheKept };

class CpuAutocast {
 public:
  explicit CpuAutocast(bool clear_cache)
      : clear_cache_(clear_cache),
        enabled_(at::autocast::is_autocast_enabled(at::kCPU)),
        dtype_(at::autocast::get_autocast_dtype(at::kCPU)) {
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCPU, true);
  }
  ~CpuAutocast() {
    at::autocast::set_autocast_enabled(at::kCPU, enabled_);
    at::autocast::set_autocast_dtype(at::kCPU, dtype_);
    if (clear_cache_) at::autocast::clear_cache();
  }

 private:
  bool clear_cache_, enabled_;
  at::ScalarType dtype_;
};

struct Result {
  std::vector<at::Tensor> losses;                          // one per step
  std::vector<std::pair<std::string, at::Tensor>> grads;  // accumulated over the steps
};

// `steps` forward/backward passes without zeroing (gradient accumulation), dropout stream seeded.
Result train(const GPTConfig& c, ActivationCheckpointing mode, int steps = 1, Amp amp = Amp::Off,
             kiln::CheckpointOptions opts = {}) {
  GPT model(c);
  model.init_weights(1);
  model.train();
  kiln::apply_activation_checkpointing(model, mode, opts);
  at::manual_seed(1234);
  Result run;
  for (int s = 0; s < steps; ++s) {
    auto [idx, tgt] = batch(c, 100 + static_cast<uint64_t>(s));
    at::Tensor loss;
    {
      std::optional<CpuAutocast> ac;
      if (amp != Amp::Off) ac.emplace(/*clear_cache=*/amp == Amp::Bf16);
      loss = model.loss(idx, tgt);
    }
    loss.backward();  // outside autocast, as the trainer does
    at::autocast::clear_cache();
    run.losses.push_back(loss.detach());
  }
  for (const auto& item : model.named_parameters()) {
    EXPECT_TRUE(item.value().grad().defined()) << item.key();
    run.grads.emplace_back(item.key(), item.value().grad().clone());
  }
  return run;
}

void expect_identical(const Result& a, const Result& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t s = 0; s < a.losses.size(); ++s) EXPECT_TRUE(at::equal(a.losses[s], b.losses[s])) << what << " loss " << s;
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    EXPECT_TRUE(at::equal(a.grads[i].second, b.grads[i].second))
        << what << ": " << a.grads[i].first << " differs by up to "
        << (a.grads[i].second - b.grads[i].second).abs().max().item<double>();
  }
}

int differing_grads(const Result& a, const Result& b) {
  int n = 0;
  for (size_t i = 0; i < a.grads.size(); ++i) n += at::equal(a.grads[i].second, b.grads[i].second) ? 0 : 1;
  return n;
}

// Bytes the process has allocated and not freed: glibc's heap in use plus its mmapped blocks
// (large tensors); mallinfo2 sums every arena.
int64_t heap_in_use() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
}

// Bytes allocated during the forward and still held when it returns: what autograd keeps for
// backward (the loss scalar aside). A warm-up step first, so gradients and lazily made buffers
// exist before the measurement; the forward's temporaries are freed by the time it returns.
// Under bf16 (CPU autocast over fp32 weights) the cast cache is kept until after backward, as the
// trainer keeps it: its weight copies are then part of what the forward leaves behind.
int64_t kept_by_forward(const GPTConfig& c, ActivationCheckpointing mode, bool bf16 = false) {
  GPT model(c);
  model.init_weights(1);
  model.train();
  kiln::apply_activation_checkpointing(model, mode);
  auto [idx, tgt] = batch(c, 7);
  auto forward = [&] {
    std::optional<CpuAutocast> ac;
    if (bf16) ac.emplace(/*clear_cache=*/false);
    return model.loss(idx, tgt);
  };
  forward().backward();
  at::autocast::clear_cache();
  const int64_t before = heap_in_use();
  auto loss = forward();
  const int64_t kept = heap_in_use() - before;
  loss.backward();
  at::autocast::clear_cache();
  return kept;
}

// Calls fn after the node it is attached to has run (as DDP's GradReadyHook).
class CountingHook final : public torch::autograd::FunctionPostHook {
 public:
  explicit CountingHook(int* count) : count_(count) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    ++*count_;
    return outputs;
  }

 private:
  int* count_;
};

}  // namespace

TEST(ActivationCheckpointing, ParsesTheFlag) {
  EXPECT_EQ(kiln::parse_activation_checkpointing("none"), ActivationCheckpointing::None);
  EXPECT_EQ(kiln::parse_activation_checkpointing("full"), ActivationCheckpointing::Full);
  EXPECT_EQ(kiln::parse_activation_checkpointing("selective"), ActivationCheckpointing::Selective);
  for (auto m : {ActivationCheckpointing::None, ActivationCheckpointing::Full, ActivationCheckpointing::Selective})
    EXPECT_EQ(kiln::parse_activation_checkpointing(kiln::to_string(m)), m);
  try {
    kiln::parse_activation_checkpointing("partial");
    FAIL() << "'partial' is not a mode";
  } catch (const kiln::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--activation-checkpointing 'partial' is not one of none, full, selective"),
              std::string::npos)
        << e.what();
  }
}

// Without biases (--bias none) selective's gelu_linear takes no bias: it once handed autograd an
// undefined tensor, which aborted the process. The Llama family (SwiGLU) too, under bf16.
TEST(ActivationCheckpointing, WithoutBiasesBitIdentical) {
  auto c = config(2, 0.1);
  c.bias = "none";
  const Result none = train(c, ActivationCheckpointing::None);
  expect_identical(none, train(c, ActivationCheckpointing::Selective), "selective, no biases");
  expect_identical(none, train(c, ActivationCheckpointing::Full), "full, no biases");
  auto llama = GPTConfig::preset("tiny-llama");
  llama.n_layer = 2;
  llama.dropout = 0.1;
  const Result plain = train(llama, ActivationCheckpointing::None, 1, Amp::Bf16);
  expect_identical(plain, train(llama, ActivationCheckpointing::Selective, 1, Amp::Bf16), "tiny-llama selective, bf16");
  expect_identical(plain, train(llama, ActivationCheckpointing::Full, 1, Amp::Bf16), "tiny-llama full, bf16");
}

// (a) Loss and every parameter gradient, dropout 0.1: bit-identical in all three modes.
TEST(ActivationCheckpointing, GradientsBitIdenticalWithDropout) {
  const auto c = config(2, 0.1);
  const Result none = train(c, ActivationCheckpointing::None);
  expect_identical(none, train(c, ActivationCheckpointing::Full), "full");
  expect_identical(none, train(c, ActivationCheckpointing::Selective), "selective");
}

// (c) Dropout 0.5: the gradients are equal because the recomputation replays the forward's RNG
// state. Negative control: with replay off (preserve_rng_state = false) the recomputation draws
// new masks; the loss is the same (the forward is), the gradients are not.
TEST(ActivationCheckpointing, RngReplayIsWhatMakesGradientsEqual) {
  const auto c = config(2, 0.5);
  const Result none = train(c, ActivationCheckpointing::None);
  for (auto mode : {ActivationCheckpointing::Full, ActivationCheckpointing::Selective}) {
    const std::string name = kiln::to_string(mode);
    expect_identical(none, train(c, mode), name);
    const Result no_replay = train(c, mode, 1, Amp::Off, kiln::CheckpointOptions{/*preserve_rng_state=*/false});
    EXPECT_TRUE(at::equal(none.losses[0], no_replay.losses[0])) << name;
    const int differ = differing_grads(none, no_replay);
    std::printf("%s without RNG replay: %d of %zu gradients differ\n", name.c_str(), differ, none.grads.size());
    EXPECT_GT(differ, 0) << name << ": the test cannot see a missing RNG replay";
  }
}

// (d) Two forward/backward passes in a row, gradients accumulating: the second step's dropout
// masks depend on the RNG stream being left where the plain model leaves it.
TEST(ActivationCheckpointing, TwoAccumulatedStepsBitIdentical) {
  const auto c = config(2, 0.1);
  const Result none = train(c, ActivationCheckpointing::None, 2);
  expect_identical(none, train(c, ActivationCheckpointing::Full, 2), "full, 2 steps");
  expect_identical(none, train(c, ActivationCheckpointing::Selective, 2), "selective, 2 steps");
}

// (d) bf16 autocast on the CPU for the forward, backward outside it: the recomputation restores
// the forward's autocast state, so it casts exactly as the forward did; bit-identical again.
TEST(ActivationCheckpointing, AutocastBf16BitIdentical) {
  const auto c = config(2, 0.1);
  const Result none = train(c, ActivationCheckpointing::None, 2, Amp::Bf16);
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  expect_identical(none, train(c, ActivationCheckpointing::Full, 2, Amp::Bf16), "full, bf16 autocast");
  expect_identical(none, train(c, ActivationCheckpointing::Selective, 2, Amp::Bf16), "selective, bf16 autocast");
  // And autocast did change the numbers (the test is not comparing fp32 with fp32).
  const Result fp32 = train(c, ActivationCheckpointing::None, 2);
  EXPECT_FALSE(at::equal(none.losses[0], fp32.losses[0]));
}

// The autocast cast cache still holding the forward's casts at backward (a caller that only
// toggles autocast). Before PyTorch's #158232 fix a cast cached under no-grad had no grad_fn,
// and a recomputation finding it would lose its weight's gradient; the checkpoint therefore runs
// with the cache off. LibTorch 2.11 has the fix, so on 2.11 this passes with the cache on too: it
// guards the scenario, not the NoCastCache guard itself.
TEST(ActivationCheckpointing, AutocastCastCacheLeftFullAtBackward) {
  const auto c = config(2, 0.1);
  const Result none = train(c, ActivationCheckpointing::None, 1, Amp::Bf16CacheKept);
  expect_identical(none, train(c, ActivationCheckpointing::Full, 1, Amp::Bf16CacheKept), "full, cache kept");
  expect_identical(none, train(c, ActivationCheckpointing::Selective, 1, Amp::Bf16CacheKept), "selective, cache kept");
}

// (b) Memory kept by the forward for backward, per layer (4 layers minus 2, over 2), against
// the header's formulas for fp32 on the CPU math path (dropout > 0, kv = d here):
//   none 72d + 12HT + 16, selective 56d + 16, full 4d  bytes per token, plus per layer the CPU
//   generator state for each checkpoint (full: one, selective: one, for the attention core).
TEST(ActivationCheckpointing, MemoryKeptBetweenForwardAndBackward) {
  const auto c4 = config(4, 0.1), c2 = config(2, 0.1);
  const int64_t d = c4.d_model, H = c4.n_head, T = c4.seq_len, tokens = kBatch * T;
  const int64_t rng_bytes = at::detail::getDefaultCPUGenerator().get_state().nbytes();
  struct Row {
    ActivationCheckpointing mode;
    int64_t predicted;  // bytes per layer
    int64_t total4 = 0, per_layer = 0;
  };
  std::vector<Row> rows = {{ActivationCheckpointing::None, (72 * d + 12 * H * T + 16) * tokens},
                           {ActivationCheckpointing::Selective, (56 * d + 16) * tokens + rng_bytes},
                           {ActivationCheckpointing::Full, 4 * d * tokens + rng_bytes}};
  std::printf("memory kept between forward and backward (CPU, fp32, B %lld, T %lld, d %lld, H %lld, dropout 0.1)\n",
              static_cast<long long>(kBatch), static_cast<long long>(T), static_cast<long long>(d),
              static_cast<long long>(H));
  for (auto& r : rows) {
    r.total4 = kept_by_forward(c4, r.mode);
    r.per_layer = (r.total4 - kept_by_forward(c2, r.mode)) / 2;
    std::printf("  %-9s  whole model (4 layers) %10lld B | per layer %9lld B = %8.1f B/token, predicted %9lld B (%+.2f%%)\n",
                kiln::to_string(r.mode).c_str(), static_cast<long long>(r.total4), static_cast<long long>(r.per_layer),
                static_cast<double>(r.per_layer) / static_cast<double>(tokens), static_cast<long long>(r.predicted),
                100.0 * static_cast<double>(r.per_layer - r.predicted) / static_cast<double>(r.predicted));
    // 3%: the formula counts saved tensors only; autograd's nodes and glibc's chunk headers
    // add a few kB per layer.
    EXPECT_NEAR(static_cast<double>(r.per_layer), static_cast<double>(r.predicted), 0.03 * static_cast<double>(r.predicted))
        << kiln::to_string(r.mode);
  }
  const Row &none = rows[0], &selective = rows[1], &full = rows[2];
  EXPECT_LT(full.per_layer, selective.per_layer);
  EXPECT_LT(selective.per_layer, none.per_layer);
  EXPECT_LT(full.total4, selective.total4);
  EXPECT_LT(selective.total4, none.total4);
}

// (c) The Llama family (rotary positions, RMSNorm, SwiGLU, no biases, grouped kv heads, an untied
// head: tiny-llama) against kiln plan's own per-layer figure, plan::layer_activation_bytes (plan/
// cost_model.h section 3), for each mode, fp32 and bf16 autocast over fp32 weights (plus autocast's
// cached weight copies, the plan's cast_copy_bytes, which the forward leaves behind too), on the
// CPU's flash kernel (no dropout; it takes the grouped kv heads) and its math path (dropout; fp32
// only: under bf16 the CPU's math attention keeps more than the plan's 3 a d + a H T + (m + a) H T
// -- +20% of the layer, GPT-2 alike; a GPU runs the fused kernels, docs/plan.md section 9).
// What it checks beyond GPT-2's: LibTorch's composite RMSNorm on the CPU (x * rstd kept in fp32),
// the rotated q and k beside c_attn's output, SwiGLU's [gate | up], silu(gate) and product kept
// under selective too. 3%, as (b): autograd's nodes and the allocator's headers.
TEST(ActivationCheckpointing, LlamaFamilyMemoryKeptIsThePlans) {
  const int64_t rng_bytes = at::detail::getDefaultCPUGenerator().get_state().nbytes();
  ASSERT_EQ(rng_bytes, 5056) << "the plan's CPU generator state (plan/memory.cpp kCpuGeneratorState)";
  std::printf("memory kept between forward and backward, tiny-llama (CPU, B %lld), against kiln plan\n",
              static_cast<long long>(kBatch));
  for (const double dropout : {0.0, 0.1}) {
    for (const bool bf16 : {false, true}) {
      if (dropout > 0 && bf16) continue;  // the math path under bf16: not modelled (above)
      for (const auto mode : {ActivationCheckpointing::None, ActivationCheckpointing::Selective, ActivationCheckpointing::Full}) {
        auto c4 = GPTConfig::preset("tiny-llama");
        c4.dropout = dropout;
        auto c2 = c4;
        c4.n_layer = 4;
        c2.n_layer = 2;
        kiln::plan::Layout l;
        l.cpu = true;
        l.dropout = dropout > 0;
        l.attention = dropout > 0 ? kiln::plan::Attention::Math : kiln::plan::Attention::Flash;
        l.compute_bytes = bf16 ? 2 : 4;
        const auto plan_mode = mode == ActivationCheckpointing::None        ? kiln::plan::Recompute::None
                               : mode == ActivationCheckpointing::Selective ? kiln::plan::Recompute::Selective
                                                                            : kiln::plan::Recompute::Full;
        l.recompute = plan_mode;  // cast_copy_bytes: none held under full recomputation
        const double tokens = static_cast<double>(kBatch * c4.seq_len);
        const double predicted = kiln::plan::layer_activation_bytes(c4, l, plan_mode).layer_bytes(tokens, 1) +
                                 static_cast<double>(kiln::plan::cast_copy_bytes(c4, l, 1));
        const int64_t per_layer = (kept_by_forward(c4, mode, bf16) - kept_by_forward(c2, mode, bf16)) / 2;
        std::printf("  %s %-4s %-9s per layer %9lld B, plan %9.0f B (%+.2f%%)\n", dropout > 0 ? "math " : "flash", bf16 ? "bf16" : "fp32",
                    kiln::to_string(mode).c_str(), static_cast<long long>(per_layer), predicted,
                    100.0 * (static_cast<double>(per_layer) - predicted) / predicted);
        EXPECT_NEAR(static_cast<double>(per_layer), predicted, 0.03 * predicted)
            << (dropout > 0 ? "math " : "flash ") << (bf16 ? "bf16 " : "fp32 ") << kiln::to_string(mode);
      }
    }
  }
}

// The generic checkpoint: an input that does not require grad, a parameter used inside, the
// parameter's AccumulateGrad post-hook (what DDP counts on) firing once in the reentrant
// backward, and the plain fallback when no input requires grad.
TEST(Checkpoint, MixedInputsParametersAndPostHooks) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  auto w = at::randn({8, 8}, gen).requires_grad_(true);
  auto a0 = at::randn({3, 8}, gen), b0 = at::randn({3, 8}, gen);
  auto fn = [&w](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{at::tanh(at::matmul(in[0], w) * in[1]), at::dropout(in[0], 0.3, true).sum()};
  };
  // Plain.
  auto a = a0.clone().requires_grad_(true);
  at::manual_seed(9);
  auto out = fn({a, b0});
  (out[0].pow(2).sum() + out[1]).backward();
  const at::Tensor ga = a.grad().clone(), gw = w.grad().clone();
  w.mutable_grad().reset();
  // Checkpointed, with a post-hook on w's AccumulateGrad.
  int fired = 0;
  auto acc = torch::autograd::impl::grad_accumulator(w);
  ASSERT_TRUE(acc);
  const auto key = acc->add_post_hook(std::make_unique<CountingHook>(&fired));
  auto a2 = a0.clone().requires_grad_(true);
  at::manual_seed(9);
  auto out2 = kiln::checkpoint(fn, {a2, b0});
  EXPECT_FALSE(out2[0].grad_fn() == nullptr);
  EXPECT_EQ(fired, 0);
  (out2[0].pow(2).sum() + out2[1]).backward();
  EXPECT_EQ(fired, 1);
  acc->del_post_hook(key);
  EXPECT_TRUE(at::equal(a2.grad(), ga));
  EXPECT_TRUE(at::equal(w.grad(), gw));
  EXPECT_FALSE(b0.grad().defined());
  // No input requires grad: fn runs plainly, so w still gets its gradient.
  w.mutable_grad().reset();
  auto out3 = kiln::checkpoint(fn, {a0, b0});
  out3[0].pow(2).sum().backward();
  EXPECT_TRUE(w.grad().defined());
  // Under no-grad nothing is recorded.
  at::NoGradGuard no_grad;
  EXPECT_FALSE(kiln::checkpoint(fn, {a2, b0})[0].requires_grad());
}

// Eval mode: the hooks stay set but no dropout is drawn and the logits are those of the plain
// model (the checkpoint runs plainly under no-grad).
TEST(ActivationCheckpointing, EvalUnderNoGradMatchesPlainModel) {
  const auto c = config(2, 0.1);
  auto [idx, tgt] = batch(c, 3);
  std::vector<at::Tensor> logits;
  for (auto mode : {ActivationCheckpointing::None, ActivationCheckpointing::Full, ActivationCheckpointing::Selective}) {
    GPT model(c);
    model.init_weights(1);
    kiln::apply_activation_checkpointing(model, mode);
    model.eval();
    at::NoGradGuard no_grad;
    logits.push_back(model.logits(idx));
  }
  EXPECT_TRUE(at::equal(logits[0], logits[1]));
  EXPECT_TRUE(at::equal(logits[0], logits[2]));
}
