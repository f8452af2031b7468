// tests/test_moe.cpp -- the Mixture-of-Experts layer (models/moe.h) against a token-by-token
// reference: outputs and every gradient (fp64, tolerance 1e-10: the same products summed in
// another order), the capacity rule (first choices before second ones, token order within a
// choice; dropped slots contribute nothing), the two losses' values, the stats, and the refusals.
#include <cmath>
#include <functional>
#include <vector>

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "models/moe.h"
#include "runtime/error.h"

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
  EXPECT_DOUBLE_EQ(m.stats.max_load, 1.0);  // 4 admitted of a mean 16 / 4 = 4
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
  EXPECT_DOUBLE_EQ(m.stats.max_load, 1.0);
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
