// tests/test_moe.cpp -- the Mixture-of-Experts layer (models/moe.h) against a token-by-token
// reference: outputs and every gradient (fp64, tolerance 1e-10: the same products summed in
// another order), the capacity rule (first choices before second ones, token order within a
// choice; dropped slots contribute nothing; per sequence), the two losses' values and their way
// into the gradient, the stats, and the refusals; then the layer in GPT (which blocks, the
// parameter count, initialisation, activation checkpointing).
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "distributed/error.h"
#include "models/gpt.h"
#include "models/moe.h"
#include "optim/precision.h"
#include "parallel/activation_checkpoint.h"

namespace {

kiln::MoEImpl make_layer(int64_t d, int64_t F, kiln::MoEConfig cfg, uint64_t seed) {
  kiln::MoEImpl m(d, F, cfg, at::TensorOptions().dtype(at::kDouble));
  at::manual_seed(seed);
  at::NoGradGuard g;
  for (auto& p : m.parameters()) p.normal_(0.0, 0.5);
  return m;
}

// y_n = sum over n's top-k choices j (those `keep`(n, j) admits) of g_j MLP_{e_j}(x_n), one
// token and choice at a time.
at::Tensor reference(const kiln::MoEImpl& m, const at::Tensor& x, const std::function<bool(int64_t, int64_t)>& keep = nullptr) {
  const int64_t k = m.config().top_k;
  std::vector<at::Tensor> rows;
  for (int64_t n = 0; n < x.size(0); ++n) {
    const at::Tensor p = at::softmax(at::mv(m.router, x[n]), 0);
    auto [tp, te] = at::topk(p, k);
    const at::Tensor g = k > 1 ? tp / tp.sum() : tp;
    at::Tensor y = at::zeros_like(x[n]);
    for (int64_t j = 0; j < k; ++j) {
      if (keep && !keep(n, j)) continue;
      const int64_t e = te[j].item<int64_t>();
      const at::Tensor h = at::gelu(at::mv(m.fc_w[e], x[n]) + m.fc_b[e], "tanh");
      y = y + g[j] * (at::mv(m.proj_w[e], h) + m.proj_b[e]);
    }
    rows.push_back(y);
  }
  return at::stack(rows);
}

void expect_close(const at::Tensor& a, const at::Tensor& b, const char* what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  EXPECT_LE((a - b).abs().max().item<double>(), 1e-10) << what;
}

}  // namespace

TEST(MoE, DroplessMatchesTheTokenByTokenReferenceWithGradients) {
  for (int64_t k : {1, 2}) {
    kiln::MoEConfig cfg;
    cfg.n_experts = 4;
    cfg.top_k = k;
    cfg.capacity_factor = 0.0;
    auto m = make_layer(6, 10, cfg, 3);
    at::manual_seed(4);
    const at::Tensor x0 = at::randn({2, 7, 6}, at::kDouble), w = at::randn({2, 7, 6}, at::kDouble);
    auto x = x0.clone().requires_grad_(true);
    (m.forward(x) * w).sum().backward();
    std::vector<at::Tensor> grads;
    for (auto& p : m.parameters()) grads.push_back(p.grad().clone()), p.mutable_grad().reset();
    auto xr = x0.clone().requires_grad_(true);
    const at::Tensor yr = reference(m, xr.reshape({-1, 6})).view({2, 7, 6});
    (yr * w).sum().backward();
    expect_close(x.grad(), xr.grad(), "input gradient");
    const auto params = m.parameters();  // router (through the gates), fc_w, fc_b, proj_w, proj_b
    for (size_t i = 0; i < params.size(); ++i) expect_close(grads[i], params[i].grad(), "parameter gradient");
    EXPECT_DOUBLE_EQ(m.stats.dropped_fraction, 0.0);
  }
}

// Every token prefers expert 0, then expert 1 (a router that scores expert e by -e x 10).
// N 8, k 2, E 4, capacity factor 1: C = ceil(1 x 2 x 8 / 4) = 4. First choices: the 8 tokens all
// to expert 0, of which tokens 0-3 are admitted; second choices: all to expert 1, tokens 0-3
// admitted. Tokens 4-7 have every slot dropped: their output is 0 (the residual carries them).
TEST(MoE, CapacityAdmitsFirstChoicesFirstAndDropsTheRest) {
  kiln::MoEConfig cfg;
  cfg.n_experts = 4;
  cfg.top_k = 2;
  cfg.capacity_factor = 1.0;
  auto m = make_layer(3, 5, cfg, 5);
  EXPECT_EQ(kiln::moe_capacity(cfg, 8), 4);
  {
    at::NoGradGuard g;
    m.router.zero_();
    for (int64_t e = 0; e < 4; ++e) m.router[e][0] = -10.0 * static_cast<double>(e);
  }
  at::manual_seed(6);
  at::Tensor x = at::rand({8, 3}, at::kDouble) + 1.0;  // x[:, 0] > 0: scores fall with e
  const at::Tensor y = m.forward(x);
  const at::Tensor want = reference(m, x);
  expect_close(y.narrow(0, 0, 4), want.narrow(0, 0, 4), "admitted tokens");
  EXPECT_TRUE(at::equal(y.narrow(0, 4, 4), at::zeros({4, 3}, at::kDouble))) << "dropped tokens pass nothing";
  EXPECT_DOUBLE_EQ(m.stats.dropped_fraction, 0.5);
  EXPECT_DOUBLE_EQ(m.stats.max_load, 2.0);  // the router sent 8 to expert 0, of a mean 16 / 4 = 4
  EXPECT_DOUBLE_EQ(m.stats.min_load, 0.0);  // experts 2 and 3 got nothing
  // The balance loss sees the choices before dropping: f = (1/2, 1/2, 0, 0).
  const at::Tensor P = at::softmax(at::linear(x, m.router), -1).mean(0);
  EXPECT_NEAR(m.aux_loss.item<double>(), 4.0 * (0.5 * P[0] + 0.5 * P[1]).item<double>(), 1e-6);
}

// Choice-major priority: tokens 0-3 prefer (0, 1), tokens 4-7 (1, 0); C = 4. First choices fill
// experts 0 and 1 (4 each), so every second choice is dropped and each token keeps exactly its
// first (a token-major rule would give tokens 0-3 both and tokens 4-7 nothing).
TEST(MoE, FirstChoicesOfEveryTokenComeBeforeAnySecondChoice) {
  kiln::MoEConfig cfg;
  cfg.n_experts = 4;
  cfg.top_k = 2;
  cfg.capacity_factor = 1.0;
  auto m = make_layer(3, 5, cfg, 8);
  {
    at::NoGradGuard g;
    m.router.zero_();
    m.router[0][0] = 10.0;
    m.router[1][1] = 10.0;
    m.router[2][2] = -100.0;
    m.router[3][2] = -100.0;
  }
  at::Tensor x = at::zeros({8, 3}, at::kDouble);
  for (int64_t n = 0; n < 8; ++n) {
    x[n][n < 4 ? 0 : 1] = 0.5 + 0.01 * static_cast<double>(n);
    x[n][n < 4 ? 1 : 0] = 0.3;
    x[n][2] = 1.0;
  }
  const at::Tensor y = m.forward(x);
  expect_close(y, reference(m, x, [](int64_t, int64_t j) { return j == 0; }), "first choices only");
  EXPECT_DOUBLE_EQ(m.stats.dropped_fraction, 0.5);
  EXPECT_DOUBLE_EQ(m.stats.max_load, 2.0);  // experts 0 and 1 were each chosen 8 times (4 first, 4 second)
}

// A zero router: p uniform, so L_aux = E sum_e f_e / E = 1 whatever top-k's tie-breaking picks,
// and L_z = (log E)^2.
TEST(MoE, LossesOfAUniformRouter) {
  kiln::MoEConfig cfg;
  cfg.n_experts = 8;
  cfg.top_k = 2;
  auto m = make_layer(4, 4, cfg, 7);
  {
    at::NoGradGuard g;
    m.router.zero_();
  }
  m.forward(at::randn({16, 4}, at::kDouble));
  EXPECT_NEAR(m.aux_loss.item<double>(), 1.0, 1e-6);
  EXPECT_NEAR(m.z_loss.item<double>(), std::log(8.0) * std::log(8.0), 1e-5);
}

// Capacity and the balance loss are per group (a sequence of GPT's): a [G, S, d] input routes
// exactly as G calls on [S, d] would, whatever else is in the batch. Tokens of sequence 0 all
// prefer expert 0; sequence 1's are spread, so a batch-wide capacity would drop some of sequence
// 1's tokens to make room for sequence 0's, and a per-group one does not.
TEST(MoE, CapacityAndBalanceLossArePerSequence) {
  kiln::MoEConfig cfg;
  cfg.n_experts = 4;
  cfg.top_k = 2;
  cfg.capacity_factor = 1.0;  // C = ceil(2 x 6 / 4) = 3 per sequence
  auto m = make_layer(5, 7, cfg, 11);
  at::manual_seed(12);
  at::Tensor x = at::randn({2, 6, 5}, at::kDouble);
  {
    at::NoGradGuard g;
    x[0].select(1, 0).fill_(4.0);  // sequence 0: a large first feature ...
    m.router.select(1, 0).copy_(at::tensor({3.0, 1.0, -1.0, -3.0}, at::kDouble));  // ... favours expert 0
  }
  const at::Tensor w = at::randn({2, 6, 5}, at::kDouble);
  auto xb = x.clone().requires_grad_(true);
  const at::Tensor yb = m.forward(xb);
  const at::Tensor aux_b = m.aux_loss.detach().clone(), z_b = m.z_loss.detach().clone();
  const double dropped_b = m.stats.dropped_fraction;
  (yb * w).sum().backward();
  std::vector<at::Tensor> grads_b;
  for (auto& p : m.parameters()) grads_b.push_back(p.grad().clone()), p.mutable_grad().reset();

  std::vector<at::Tensor> ys, auxes, zs;
  double dropped = 0.0;
  auto xs = x.clone().requires_grad_(true);
  for (int64_t s = 0; s < 2; ++s) {
    ys.push_back(m.forward(xs[s]));
    auxes.push_back(m.aux_loss.detach().clone());
    zs.push_back(m.z_loss.detach().clone());
    dropped += m.stats.dropped_fraction / 2.0;
  }
  (at::stack(ys) * w).sum().backward();
  expect_close(yb, at::stack(ys), "outputs");
  expect_close(xb.grad(), xs.grad(), "input gradient");
  const auto params = m.parameters();
  for (size_t i = 0; i < params.size(); ++i) expect_close(grads_b[i], params[i].grad(), "parameter gradient");
  EXPECT_NEAR(aux_b.item<double>(), (auxes[0] + auxes[1]).item<double>() / 2.0, 1e-12) << "L_aux: the mean over sequences";
  EXPECT_NEAR(z_b.item<double>(), (zs[0] + zs[1]).item<double>() / 2.0, 1e-12);
  EXPECT_NEAR(dropped_b, dropped, 1e-12);
  EXPECT_GT(dropped_b, 0.0) << "sequence 0 overflows expert 0: the test needs some dropping";
  // And a batch-wide capacity would have routed otherwise: the whole batch as one group differs.
  const at::Tensor one_group = m.forward(x.reshape({12, 5})).view({2, 6, 5});
  EXPECT_GT((one_group - yb).abs().max().item<double>(), 1e-6) << "the groups must matter in this example";
}

// The losses reach the gradient through the output (models/moe.h, AttachAuxLoss): with weights
// ca, cz and loss_backward_scale s, backward(s sum(y w)) gives every parameter the gradient of
// s (sum(y w) + ca L_aux + cz L_z), the losses added by hand to a layer that attaches nothing.
TEST(MoE, AuxiliaryLossesJoinTheGradientWithTheLossScale) {
  kiln::MoEConfig cfg;
  cfg.n_experts = 4;
  cfg.top_k = 2;
  cfg.capacity_factor = 1.25;
  cfg.aux_loss_coef = 0.3;
  cfg.z_loss_coef = 0.05;
  auto m = make_layer(6, 8, cfg, 21);
  at::manual_seed(22);
  const at::Tensor x = at::randn({3, 5, 6}, at::kDouble), w = at::randn({3, 5, 6}, at::kDouble);
  const double s = 8.0;
  m.loss_backward_scale = s;
  (m.forward(x) * w).sum().mul(s).backward();
  std::vector<at::Tensor> attached;
  for (auto& p : m.parameters()) attached.push_back(p.grad().clone()), p.mutable_grad().reset();

  kiln::MoEConfig none = cfg;
  none.aux_loss_coef = none.z_loss_coef = 0.0;
  kiln::MoEImpl ref(6, 8, none, at::TensorOptions().dtype(at::kDouble));
  {
    at::NoGradGuard g;
    const auto src = m.parameters();
    auto dst = ref.parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
  (ref.forward(x) * w).sum().mul(s).backward();
  const at::Tensor router_without = ref.parameters()[0].grad().clone();
  for (auto& p : ref.parameters()) p.mutable_grad().reset();
  const at::Tensor y = ref.forward(x);
  ((y * w).sum() + 0.3 * ref.aux_loss + 0.05 * ref.z_loss).mul(s).backward();
  const auto want = ref.parameters();
  for (size_t i = 0; i < want.size(); ++i) expect_close(attached[i], want[i].grad(), "parameter gradient");
  EXPECT_GT((router_without - attached[0]).abs().max().item<double>(), 1e-6) << "the losses must move the router's gradient";
}

// step_stats: summed over calls with grad on, untouched by calls without (evaluation, and the
// no-grad first pass of a checkpointed block, whose recomputation counts instead).
TEST(MoE, StepStatsCountGradModeCallsOnly) {
  kiln::MoEConfig cfg;
  cfg.n_experts = 4;
  cfg.top_k = 2;
  cfg.capacity_factor = 0.0;
  auto m = make_layer(4, 4, cfg, 31);
  const at::Tensor x = at::randn({2, 8, 4}, at::kDouble);
  {
    at::NoGradGuard g;
    m.forward(x);
  }
  EXPECT_FALSE(m.step_stats.defined());
  m.forward(x);
  m.forward(x);
  ASSERT_TRUE(m.step_stats.defined());
  ASSERT_EQ(m.step_stats.numel(), kiln::moe_stats_width(4));
  EXPECT_DOUBLE_EQ(m.step_stats.narrow(0, 0, 4).sum().item<double>(), 2.0 * 16 * 2) << "k x tokens per call, two calls";
  EXPECT_DOUBLE_EQ(m.step_stats[4].item<double>(), 2.0 * 16 * 2) << "dropless: every assignment admitted";
  EXPECT_NEAR(m.step_stats[5].item<double>(), 2.0 * m.aux_loss.item<double>(), 1e-5);
}

TEST(MoE, BadSettingsAreOneLineErrors) {
  auto refused = [](int64_t E, int64_t k, double cf) {
    kiln::MoEConfig c;
    c.n_experts = E, c.top_k = k, c.capacity_factor = cf;
    try {
      c.validate();
    } catch (const kiln::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(refused(4, 5, 1.0).find("--top-k must be in [1, --n-experts 4]"), std::string::npos);
  EXPECT_NE(refused(0, 1, 1.0).find("--n-experts must be at least 1"), std::string::npos);
  EXPECT_NE(refused(4, 2, -1.0).find("--moe-capacity-factor"), std::string::npos);
  EXPECT_EQ(refused(4, 2, 0.0), "");
}

// ---- the MoE layer in GPT (models/gpt.h) ---------------------------------------------------

namespace {

kiln::GPTConfig small_moe(int64_t every) {
  kiln::GPTConfig c = kiln::GPTConfig::preset("tiny-moe");
  c.n_layer = 4;
  c.d_model = 32;
  c.n_head = c.n_kv_head = 2;
  c.seq_len = 16;
  c.vocab_size = 64;
  c.moe_every = every;
  return c;
}

}  // namespace

// Blocks i with i % moe_every == 0 hold an MoE layer, the others the dense MLP; the module's
// parameters are the count GPTConfig gives; the experts' biases start at zero and their c_proj
// at the residual projections' N(0, 0.02 / sqrt(2L)).
TEST(MoEGPT, BlocksParametersAndInitialisation) {
  for (int64_t every : {1, 2}) {
    const kiln::GPTConfig cfg = small_moe(every);
    kiln::GPT model(cfg);
    model.init_weights(7);
    EXPECT_EQ(model.num_params(), cfg.num_params());
    ASSERT_EQ(static_cast<int64_t>(model.moe_layers().size()), cfg.n_moe_layers());
    for (int64_t i = 0; i < cfg.n_layer; ++i) {
      const auto block = model.blocks()[static_cast<size_t>(i)];
      EXPECT_EQ(block->moe != nullptr, i % every == 0) << "block " << i;
      EXPECT_EQ(block->mlp != nullptr, i % every != 0) << "block " << i;
    }
    const auto moe = model.moe_layers().front().second;
    EXPECT_EQ(moe->fc_b.abs().max().item<double>(), 0.0);
    EXPECT_EQ(moe->proj_b.abs().max().item<double>(), 0.0);
    EXPECT_NEAR(moe->proj_w.std().item<double>(), 0.02 / std::sqrt(8.0), 2e-3);
    EXPECT_NEAR(moe->fc_w.std().item<double>(), 0.02, 2e-3);
  }
  // The presets: the module's count, and the figures gpt_config.cpp quotes.
  for (const auto& [name, total, active] : std::vector<std::tuple<std::string, int64_t, int64_t>>{
           {"tiny-moe", 4'567'296, 1'406'208}, {"gpt2-124m-moe", 322'854'912, 152'847'360}}) {
    const auto cfg = kiln::GPTConfig::preset(name);
    EXPECT_EQ(kiln::GPT(cfg, at::TensorOptions().device(at::kMeta)).num_params(), total) << name;
    EXPECT_EQ(cfg.num_params(), total) << name;
    EXPECT_EQ(cfg.num_active_params(), active) << name;
  }
  // Active parameters: k of E experts' MLPs per MoE layer.
  const kiln::GPTConfig c = small_moe(1);
  const int64_t mlp = 2 * 32 * 128 + 128 + 32;
  EXPECT_EQ(c.num_params() - c.num_active_params(), 4 * (8 - 2) * mlp);
}

// Full activation checkpointing recomputes the MoE blocks: the same gradients, bit for bit (the
// same routing, the same kernels), and the routing stats counted once (the recomputation runs
// with grad on, the first pass without).
TEST(MoEGPT, FullCheckpointingGivesTheSameGradientsAndCountsOnce) {
  const kiln::GPTConfig cfg = small_moe(1);
  auto run = [&](kiln::ActivationCheckpointing mode) {
    kiln::GPT model(cfg);
    model.init_weights(3);
    kiln::apply_activation_checkpointing(model, mode);
    model.set_moe_loss_backward_scale(1.0);
    at::manual_seed(5);
    const at::Tensor idx = at::randint(0, cfg.vocab_size, {3, cfg.seq_len}, at::kLong);
    const at::Tensor tgt = at::randint(0, cfg.vocab_size, {3, cfg.seq_len}, at::kLong);
    model.loss(idx, tgt).backward();
    std::vector<at::Tensor> grads;
    for (const auto& p : model.parameters()) grads.push_back(p.grad().clone());
    return std::make_pair(grads, model.take_moe_stats(at::kCPU));
  };
  const auto [plain, plain_stats] = run(kiln::ActivationCheckpointing::None);
  const auto [full, full_stats] = run(kiln::ActivationCheckpointing::Full);
  ASSERT_EQ(plain.size(), full.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(at::equal(plain[i], full[i])) << "parameter " << i;
  EXPECT_TRUE(at::equal(plain_stats, full_stats));
  // Per layer: k x tokens assignments routed.
  const auto rows = plain_stats.view({cfg.n_moe_layers(), kiln::moe_stats_width(cfg.n_experts)});
  for (int64_t l = 0; l < cfg.n_moe_layers(); ++l)
    EXPECT_EQ(rows[l].narrow(0, 0, cfg.n_experts).sum().item<double>(), 2.0 * 3 * cfg.seq_len);
  const auto [selective, selective_stats] = run(kiln::ActivationCheckpointing::Selective);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(at::equal(plain[i], selective[i])) << "parameter " << i;
}

// A split sequence is refused where the model is built (TrainConfig refuses the flags first).
// An MoE block keeps the residual stream's dtype when its normed input is fp32 -- as CUDA's
// autocast runs layer_norm (LayerNormImpl::fp32_under_autocast emulates it on the CPU, whose
// autocast keeps 16 bits). The block once returned fp32 there: every later block ran an fp32
// residual, and with pp the stages' exchange refused the first step (issue 34, defect 1). The
// dense block, whose MLP answers in autocast's dtype, is the control.
TEST(MoEGPT, BlockKeepsTheResidualDtypeWhenItsNormIsFp32) {
  const kiln::GPTConfig cfg = small_moe(2);  // block 0 MoE, block 1 dense
  for (int64_t index : {0, 1}) {
    kiln::BlockImpl block(cfg, at::TensorOptions().dtype(at::kBFloat16), {}, index);
    ASSERT_EQ(block.moe != nullptr, index == 0);
    block.ln_1->fp32_under_autocast = block.ln_2->fp32_under_autocast = true;
    at::manual_seed(5);
    const at::Tensor x = at::randn({2, cfg.seq_len, cfg.d_model}).to(at::kBFloat16);
    kiln::AutocastScope autocast(kiln::Precision::BF16, at::kCPU);
    at::NoGradGuard no_grad;
    EXPECT_EQ(block.ln_2->forward(x).scalar_type(), at::kFloat) << "the emulation: layer_norm in fp32";
    EXPECT_EQ(block.forward(x).scalar_type(), at::kBFloat16) << (index == 0 ? "the MoE block" : "the dense block");
  }
}

// Under autocast the rows travel to the experts in its dtype, whatever ln_2 gave (fp32 on CUDA):
// half the all-to-all's bytes, and the same outputs, as the experts' products cast them anyway
// (issue 34's list). A one-rank dispatch records what it is handed.
TEST(MoE, DispatchedRowsAreInTheComputeDtype) {
  kiln::MoEConfig mc;
  mc.n_experts = 4;
  mc.top_k = 2;
  auto ops = std::make_shared<kiln::LayerOps>();
  at::ScalarType sent = at::ScalarType::Undefined;
  ops->exchange_counts = [](const at::Tensor& counts) { return counts.to(at::kLong); };
  ops->dispatch_experts = [&sent](const at::Tensor& rows, const std::vector<int64_t>& counts, const std::vector<int64_t>&,
                                  const at::Tensor&, const kiln::LayerOps::ExpertRunner& run_local) {
    sent = rows.scalar_type();
    return run_local(rows, counts);
  };
  kiln::MoEImpl plain(16, 32, mc, at::TensorOptions()), split(16, 32, mc, at::TensorOptions(), ops);
  at::manual_seed(3);
  for (size_t i = 0; i < plain.parameters().size(); ++i) {
    plain.parameters()[i].data().normal_(0.0, 0.5);
    split.parameters()[i].data().copy_(plain.parameters()[i].data());
  }
  const at::Tensor x = at::randn({2, 8, 16});  // fp32, as CUDA's autocast leaves ln_2's output
  kiln::AutocastScope autocast(kiln::Precision::BF16, at::kCPU);
  at::NoGradGuard no_grad;
  const at::Tensor want = plain.forward(x), got = split.forward(x);
  EXPECT_EQ(sent, at::kBFloat16);
  EXPECT_TRUE(at::equal(want, got)) << "the cast before the dispatch changes no product";
}

// A split sequence (--sp, --cp; models/moe.h): each rank routes its rows, the ranks share the
// sequence's choices (LayerOps::gather_sequence), and each keeps its rows' admissions. Two
// "ranks" in one process, holding the cp-like positions {chunks 0, 3} and {chunks 1, 2} of 4: each
// one's outputs are the whole layer's at its rows (capacity tight enough to drop), the two
// parts of the balance and z losses add up to the whole's, and so do their gradients.
TEST(MoEGPT, SplitSequenceRoutesAsTheWholeSequence) {
  kiln::MoEConfig cfg;
  cfg.n_experts = 4;
  cfg.top_k = 2;
  cfg.capacity_factor = 0.75;  // drops: admission depends on the whole sequence's order
  const int64_t B = 2, T = 16, d = 8, C = T / 4;
  kiln::MoEImpl m = make_layer(d, 16, cfg, 11);
  at::manual_seed(12);
  const at::Tensor x = at::randn({B, T, d}, at::TensorOptions().dtype(at::kDouble));
  const at::Tensor w = at::randn({B, T, d}, x.options());
  const at::Tensor y = m.forward(x);
  const at::Tensor aux = m.aux_loss.detach().clone(), z = m.z_loss.detach().clone();
  ASSERT_GT(m.stats.dropped_fraction, 0.0);
  ((y * w).sum() + 0.3 * m.aux_loss + 0.05 * m.z_loss).backward();
  std::map<std::string, at::Tensor> want, got_grads;
  for (const auto& item : m.named_parameters()) want[item.key()] = item.value().grad().clone();
  at::Tensor whole_e;  // the choices of every position, as the router makes them row by row
  {
    at::NoGradGuard g;
    whole_e = std::get<1>(at::topk(at::softmax(at::linear(x, m.router), -1), cfg.top_k, -1));  // [B, T, k]
  }
  const auto opts = at::TensorOptions().dtype(at::kLong);
  const std::vector<at::Tensor> rows = {at::cat({at::arange(0, C, opts), at::arange(3 * C, 4 * C, opts)}),
                                        at::cat({at::arange(C, 2 * C, opts), at::arange(2 * C, 3 * C, opts)})};
  double aux_sum = 0, z_sum = 0;
  for (const at::Tensor& mine : rows) {
    auto ops = std::make_shared<kiln::LayerOps>();
    ops->seq_split = 2;
    ops->seq_rows = [mine](int64_t, c10::Device) { return mine; };
    ops->gather_sequence = [whole_e, mine](const at::Tensor& local) {
      EXPECT_TRUE(at::equal(local, whole_e.index_select(1, mine))) << "the rank's own choices";
      return whole_e;
    };
    kiln::MoEImpl part(d, 16, cfg, at::TensorOptions().dtype(at::kDouble), ops);
    {
      at::NoGradGuard g;
      for (const auto& item : m.named_parameters()) part.named_parameters()[item.key()].copy_(item.value());
    }
    const at::Tensor got = part.forward(x.index_select(1, mine));
    expect_close(got, y.index_select(1, mine), "the rank's rows");
    aux_sum += part.aux_loss.item<double>();
    z_sum += part.z_loss.item<double>();
    ((got * w.index_select(1, mine)).sum() + 0.3 * part.aux_loss + 0.05 * part.z_loss).backward();
    for (const auto& item : part.named_parameters()) {
      at::Tensor& sum = got_grads[item.key()];
      sum = sum.defined() ? sum + item.value().grad() : item.value().grad().clone();
    }
  }
  EXPECT_NEAR(aux_sum, aux.item<double>(), 1e-12);
  EXPECT_NEAR(z_sum, z.item<double>(), 1e-12);
  for (const auto& [name, g] : want) expect_close(got_grads.at(name), g, name.c_str());  // summed over the ranks, as tp sums them
}
