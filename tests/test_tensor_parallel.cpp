// tests/test_tensor_parallel.cpp -- each tensor-parallel layer against the same dense layer, at
// tp = the world size (run at 2 and 4 ranks). Every rank draws the same full tensors from one
// seed, keeps its slice for the parallel layer, and compares outputs and every gradient with the
// dense computation's slice. Tolerance, fp32: max |diff| <= 1e-5 max |dense| + 1e-6 -- the
// parallel layer sums the same products in another order (partial sums over tp), which moves a
// result by about 1e-7 of the size of its summands (so of the tensor's scale, not of the element:
// an element that cancels to near zero keeps its summands' absolute error).
#include <cstdio>
#include <cstdlib>

#include <gtest/gtest.h>
#include <mpi.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "distributed/comm_mpi.h"
#include "distributed/env.h"
#include "models/gpt.h"
#include "parallel/tensor_parallel.h"

namespace {

std::shared_ptr<kiln::Communicator> g_tp;  // set by main(); tests only read it

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double diff = (got - want).abs().max().item<double>(), scale = want.abs().max().item<double>();
  EXPECT_LE(diff, 1e-5 * scale + 1e-6) << what << ": max |diff| " << diff << ", max |want| " << scale;
}

at::Tensor leaf(const at::Tensor& t) { return t.detach().clone().requires_grad_(true); }

struct Slices {
  int t, r;
  at::Tensor rows(const at::Tensor& a) const { return a.chunk(t, 0)[r]; }
  at::Tensor cols(const at::Tensor& a) const { return a.chunk(t, -1)[r]; }
};

Slices slices() { return {g_tp->size(), g_tp->rank()}; }

TEST(TensorParallel, ColumnParallelLinear) {
  const auto s = slices();
  at::manual_seed(1);
  auto x = at::randn({2, 5, 16}), w = at::randn({8 * s.t, 16}), b = at::randn({8 * s.t}), r = at::randn({2, 5, 8 * s.t});
  auto xd = leaf(x), wd = leaf(w), bd = leaf(b);
  auto yd = at::linear(xd, wd, bd);
  (yd * r).sum().backward();

  auto xp = leaf(x), wp = leaf(s.rows(w)), bp = leaf(s.rows(b));
  auto yp = kiln::column_parallel_linear(xp, wp, bp, g_tp);
  (yp * s.cols(r)).sum().backward();  // this rank's part of the same loss
  expect_close(yp, s.cols(yd), "output columns");
  expect_close(xp.grad(), xd.grad(), "input gradient (all-reduced over tp)");
  expect_close(wp.grad(), s.rows(wd.grad()), "weight gradient rows");
  expect_close(bp.grad(), s.rows(bd.grad()), "bias gradient");
}

TEST(TensorParallel, RowParallelLinear) {
  const auto s = slices();
  at::manual_seed(2);
  auto x = at::randn({2, 5, 8 * s.t}), w = at::randn({16, 8 * s.t}), b = at::randn({16}), r = at::randn({2, 5, 16});
  auto xd = leaf(x), wd = leaf(w), bd = leaf(b);
  auto yd = at::linear(xd, wd, bd);
  (yd * r).sum().backward();

  auto xp = leaf(s.cols(x)), wp = leaf(s.cols(w)), bp = leaf(b);
  auto yp = kiln::row_parallel_linear(xp, wp, bp, g_tp);
  (yp * r).sum().backward();
  expect_close(yp, yd, "output (all-reduced, bias once)");
  expect_close(xp.grad(), s.cols(xd.grad()), "input gradient columns");
  expect_close(wp.grad(), s.cols(wd.grad()), "weight gradient columns");
  expect_close(bp.grad(), bd.grad(), "bias gradient (replicated)");
}

TEST(TensorParallel, ColumnThenRowIsTheDenseMlp) {
  const auto s = slices();
  at::manual_seed(3);
  const int64_t d = 16, f = 8 * s.t;
  auto x = at::randn({3, 4, d}), w1 = at::randn({f, d}), b1 = at::randn({f}), w2 = at::randn({d, f}), b2 = at::randn({d});
  auto r = at::randn({3, 4, d});
  auto xd = leaf(x), w1d = leaf(w1), b1d = leaf(b1), w2d = leaf(w2), b2d = leaf(b2);
  auto yd = at::linear(at::gelu(at::linear(xd, w1d, b1d), "tanh"), w2d, b2d);
  (yd * r).sum().backward();

  auto xp = leaf(x), w1p = leaf(s.rows(w1)), b1p = leaf(s.rows(b1)), w2p = leaf(s.cols(w2)), b2p = leaf(b2);
  auto h = at::gelu(kiln::column_parallel_linear(xp, w1p, b1p, g_tp), "tanh");  // GELU local
  auto yp = kiln::row_parallel_linear(h, w2p, b2p, g_tp);
  (yp * r).sum().backward();
  expect_close(yp, yd, "MLP output");
  expect_close(xp.grad(), xd.grad(), "MLP input gradient");
  expect_close(w1p.grad(), s.rows(w1d.grad()), "up-projection gradient");
  expect_close(w2p.grad(), s.cols(w2d.grad()), "down-projection gradient");
  expect_close(b2p.grad(), b2d.grad(), "down bias gradient");
}

TEST(TensorParallel, VocabParallelEmbedding) {
  const auto s = slices();
  at::manual_seed(4);
  const int64_t v = 32 * s.t, d = 12;
  auto table = at::randn({v, d}), ids = at::randint(0, v, {3, 7}, at::kLong), r = at::randn({3, 7, d});
  auto td = leaf(table);
  auto ed = at::embedding(td, ids);
  (ed * r).sum().backward();

  auto tp = leaf(s.rows(table));
  auto ep = kiln::vocab_parallel_embedding(ids, tp, s.r * (v / s.t), g_tp);
  (ep * r).sum().backward();
  expect_close(ep, ed, "embeddings");
  expect_close(tp.grad(), s.rows(td.grad()), "table gradient rows");
}

TEST(TensorParallel, VocabParallelCrossEntropy) {
  const auto s = slices();
  at::manual_seed(5);
  // v columns of which the last 3 are vocabulary padding (they must not enter the softmax).
  const int64_t n = 24, v = 40 * s.t, vocab = v - 3;
  auto logits = at::randn({n, v}) * 3.0, targets = at::randint(0, vocab, {n}, at::kLong);
  targets[0] = vocab - 1;  // a target in the last rank's columns
  auto ld = leaf(logits);
  auto lossd = at::cross_entropy_loss(ld.narrow(1, 0, vocab), targets);
  lossd.backward();

  auto lp = leaf(s.cols(logits));
  auto lossp = kiln::vocab_parallel_cross_entropy(lp, targets, s.r * (v / s.t), vocab, g_tp);
  lossp.backward();
  expect_close(lossp, lossd, "loss");
  expect_close(lp.grad(), s.cols(ld.grad()), "logit gradient columns (zero on the padding)");
}

// The two-pass way (what the model runs with fused kernels on CUDA; here its local passes in
// ATen): each rank's (max, sum) rescaled to the common max, the same loss and logit gradient as
// the whole-vocabulary loss, also when the padding takes every column of the last rank (its
// (-inf, 0) stats count for nothing), and in bf16 logits (the gradient in bf16, within its
// rounding).
TEST(TensorParallel, VocabParallelCrossEntropyTwoPass) {
  const auto s = slices();
  at::manual_seed(6);
  const int64_t n = 24, v = 40 * s.t;
  for (const int64_t vocab : {v - 3, s.t > 1 ? v - 40 - 2 : v - 5}) {
    for (const auto dtype : {at::kFloat, at::kBFloat16}) {
      const std::string what = "vocab " + std::to_string(vocab) + " " + c10::toString(dtype);
      auto logits = (at::randn({n, v}) * 3.0).to(dtype), targets = at::randint(0, vocab, {n}, at::kLong);
      targets[0] = vocab - 1;
      auto ld = leaf(logits.to(at::kFloat));
      auto lossd = at::cross_entropy_loss(ld.narrow(1, 0, vocab), targets);
      lossd.backward();
      auto lp = leaf(s.cols(logits));
      auto lossp = kiln::vocab_parallel_cross_entropy(lp, targets, s.r * (v / s.t), vocab, g_tp, /*two_pass=*/true);
      lossp.backward();
      EXPECT_EQ(lp.grad().scalar_type(), dtype) << what;
      EXPECT_NEAR(lossp.item<double>(), lossd.item<double>(), 1e-5 * lossd.item<double>()) << what;
      const double tol = dtype == at::kFloat ? 1e-6 : 1.0 / 256 / n;  // bf16: a rounding of values below 1 / n
      EXPECT_LE((lp.grad().to(at::kFloat) - s.cols(ld.grad())).abs().max().item<double>(), tol) << what;
    }
  }
}

// The tensor-parallel region's random stream: different on each tp rank (each holds other
// heads), reproducible, and leaving the main stream (replicated dropout) as it found it.
TEST(TensorParallel, RegionRandomStreamIsPerRank) {
  const auto s = slices();
  kiln::GPTConfig cfg = kiln::GPTConfig::preset("tiny");
  cfg.n_head = cfg.n_kv_head = 4 * s.t;
  cfg.d_model = 32 * s.t;
  const auto shard = kiln::make_tensor_parallel_shard(cfg, g_tp);
  const c10::Device cpu(c10::kCPU);
  at::manual_seed(7);
  const at::Tensor a = shard.ops->in_tp_region(cpu, [] { return at::rand({16}); });
  const at::Tensor after = at::rand({4});  // the main stream, as if the region drew nothing
  at::manual_seed(7);
  const at::Tensor again = shard.ops->in_tp_region(cpu, [] { return at::rand({16}); });
  at::manual_seed(7);
  const at::Tensor plain = at::rand({4});
  EXPECT_TRUE(at::equal(a, again)) << "not reproducible";
  EXPECT_TRUE(at::equal(after, plain)) << "the main stream moved";
  at::Tensor all = at::empty({16 * s.t});
  g_tp->all_gather(all, a)->wait();
  for (int i = 0; i < s.t; ++i)
    for (int j = i + 1; j < s.t; ++j)
      EXPECT_FALSE(at::equal(all.narrow(0, 16 * i, 16), all.narrow(0, 16 * j, 16))) << "ranks " << i << " and " << j;
}

// grad_norm_tp on a rank holding no gradients still joins the tp all-reduce (it once
// returned early, leaving its peers waiting in it): rank 0 has a gradient of ones on every
// parameter, the others none. Every rank's norm^2 is the split parameters' squares summed over
// tp (rank 0's alone) plus its own replicated ones, so rank 0's exceeds the others' by its
// replicated parameters' element count (each 1^2).
TEST(TensorParallel, ClipGradNormJoinsTheAllReduceWithoutGradients) {
  const auto s = slices();
  kiln::GPTConfig cfg = kiln::GPTConfig::preset("tiny");
  cfg.n_layer = 1;
  cfg.n_head = cfg.n_kv_head = 4 * s.t;
  cfg.d_model = 32 * s.t;
  kiln::GPT model(cfg, at::TensorOptions(), kiln::make_tensor_parallel_shard(cfg, g_tp));
  double replicated = 0.0;
  for (const auto& item : model.named_parameters()) {
    auto p = item.value();
    if (s.r == 0) p.mutable_grad() = at::ones_like(p);
    if (!kiln::is_tensor_parallel(item.key())) replicated += static_cast<double>(p.numel());
  }
  const double norm = kiln::grad_norm_tp(model, /*grad_scale=*/1.0, g_tp, {}).item<double>();
  at::Tensor first = at::full({1}, s.r == 0 ? norm * norm : 0.0, at::kDouble), other = at::full({1}, s.r == 1 ? norm * norm : 0.0, at::kDouble);
  g_tp->all_reduce(first, kiln::ReduceOp::Sum)->wait();
  g_tp->all_reduce(other, kiln::ReduceOp::Sum)->wait();
  EXPECT_GT(other.item<double>(), 0.0) << "rank 1 must see rank 0's split squares";
  EXPECT_NEAR(first.item<double>() - other.item<double>(), replicated, 1e-6 * first.item<double>());
}

}  // namespace

int main(int argc, char** argv) {
  kiln::Environment env(&argc, &argv);
  if (!env.info().mpi) {
    std::fprintf(stderr, "test_tensor_parallel: run under mpirun (e.g. mpirun -np 2 %s)\n", argv[0]);
    return 2;
  }
  ::testing::InitGoogleTest(&argc, argv);
  if (env.info().rank != 0 && !std::getenv("KILN_TEST_ALL_RANKS")) {  // one rank reports; the verdict is shared below
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  g_tp = kiln::make_mpi_communicator(MPI_COMM_WORLD, "tp");
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (env.info().rank == 0)
    std::printf("test_tensor_parallel: tp %d, %s\n", env.info().world_size, any_failed ? "FAILED on some rank" : "passed on every rank");
  g_tp.reset();
  return any_failed;
}
