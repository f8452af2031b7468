// tests/test_sequence_parallel.cpp -- the row collectives, the gathered column-parallel layer and
// the context-parallel positions against their dense definitions (at 2 and 4 ranks), and the
// activation memory sequence and context parallelism keep between forward and backward (at 2).
//
// Tolerance of the layer checks, fp32: max |diff| <= 1e-5 max |dense| + 1e-6, as
// test_tensor_parallel.cpp (the sums over ranks reorder additions). The collectives alone move
// data and sum n addends: exact for the gather, the same tolerance for the reduce-scatter.
// Memory: the bytes glibc reports in use after the forward minus before it (mallinfo2, as
// test_activation_checkpoint.cpp), 4 layers minus 2 layers, halved: per layer, against the
// formulas in the comment of that test, within 3% (autograd's nodes and malloc's headers).
#include <malloc.h>

#include <cstdio>
#include <cstdlib>

#include <gtest/gtest.h>
#include <mpi.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/autograd.h>

#include "distributed/comm_mpi.h"
#include "distributed/env.h"
#include "models/gpt.h"
#include "parallel/context_parallel.h"
#include "parallel/sequence_parallel.h"
#include "parallel/tensor_parallel.h"

namespace {

std::shared_ptr<kiln::Communicator> g_world;  // set by main(); tests only read it

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double diff = (got - want).abs().max().item<double>(), scale = want.abs().max().item<double>();
  EXPECT_LE(diff, 1e-5 * scale + 1e-6) << what << ": max |diff| " << diff << ", max |want| " << scale;
}

at::Tensor leaf(const at::Tensor& t) { return t.detach().clone().requires_grad_(true); }

// Every rank holds a different partial x_r (drawn from seed + r); the dense sum is the sum of all.
at::Tensor partial_of(int64_t r, at::IntArrayRef shape) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + r);
  return at::randn(shape, gen);
}

}  // namespace

TEST(SequenceParallel, RowCollectivesAlongAnyDim) {
  const int64_t n = g_world->size(), r = g_world->rank();
  for (int64_t dim : {1, 3}) {
    std::vector<int64_t> shape{2, 3, 4, 5};
    shape[dim] = 2 * n;  // rows along dim: 2 per rank
    // all_gather_rows: rank r contributes the block of rows [2r, 2r + 2) of one whole tensor.
    at::manual_seed(3);
    const at::Tensor whole = at::randn(shape), w = at::randn(shape);
    auto mine = leaf(whole.narrow(dim, 2 * r, 2));
    const at::Tensor gathered = kiln::all_gather_rows(mine, dim, g_world);
    EXPECT_TRUE(at::equal(gathered, whole)) << "all-gather along dim " << dim;
    (gathered * w).sum().backward();  // every rank the same loss: the gradient of its rows is n w
    expect_close(mine.grad(), w.narrow(dim, 2 * r, 2) * static_cast<double>(n), "all-gather backward");
    // reduce_scatter_rows: the sum of every rank's partial, this rank's rows.
    auto part = leaf(partial_of(r, shape));
    at::Tensor sum = at::zeros(shape);
    for (int64_t i = 0; i < n; ++i) sum += partial_of(i, shape);
    const at::Tensor out = kiln::reduce_scatter_rows(part, dim, g_world);
    expect_close(out, sum.narrow(dim, 2 * r, 2), "reduce-scatter along dim " + std::to_string(dim));
    (out * w.narrow(dim, 2 * r, 2)).sum().backward();  // rank r's loss on its rows: dL/dpart = w everywhere
    expect_close(part.grad(), w, "reduce-scatter backward (the gradient gathered)");
  }
}

// gathered_linear against at::linear of the gathered input, under one loss summed over ranks:
// output, the input rows' gradient (summed over ranks: every rank's columns use every row), W's
// and b's; and without a bias (the tied output layer).
TEST(SequenceParallel, GatheredLinearMatchesTheDenseLayer) {
  const int64_t n = g_world->size(), r = g_world->rank();
  at::manual_seed(4);
  const at::Tensor x = at::randn({2, 3 * n, 16}), w = at::randn({8 * n, 16}), b = at::randn({8 * n}),
                   g = at::randn({2, 3 * n, 8 * n});
  for (bool bias : {true, false}) {
    auto xd = leaf(x), wd = leaf(w), bd = leaf(b);
    auto yd = bias ? at::linear(xd, wd, bd) : at::linear(xd, wd);
    (yd * g).sum().backward();
    auto xr = leaf(x.narrow(1, 3 * r, 3)), wr = leaf(w.chunk(n, 0)[r]), br = leaf(b.chunk(n, 0)[r]);
    auto yr = kiln::gathered_linear(xr, wr, bias ? br : at::Tensor(), g_world);
    (yr * g.chunk(n, -1)[r]).sum().backward();  // this rank's columns of the same loss
    expect_close(yr, yd.chunk(n, -1)[r], "output columns");
    expect_close(xr.grad(), xd.grad().narrow(1, 3 * r, 3), "input rows' gradient");
    expect_close(wr.grad(), wd.grad().chunk(n, 0)[r], "weight gradient rows");
    if (bias) expect_close(br.grad(), bd.grad().chunk(n, 0)[r], "bias gradient");
    else EXPECT_FALSE(br.grad().defined());
  }
}

// The backward computes what is asked for, and moves only its bytes: the gradient of the input
// alone (ZB-H1's input pass) is one reduce-scatter and no gather; the weight's and bias's alone
// (its weight pass) one gather and no reduce-scatter; both together, one of each.
TEST(SequenceParallel, GatheredLinearBackwardMovesOnlyWhatIsAskedFor) {
  const int64_t n = g_world->size(), r = g_world->rank();
  at::manual_seed(5);
  const at::Tensor x = at::randn({2, 3 * n, 16}), w = at::randn({8 * n, 16}), b = at::randn({8 * n});
  auto run = [&](int which, int64_t* calls) {  // 0: x alone, 1: w and b alone, 2: all three
    auto xr = leaf(x.narrow(1, 3 * r, 3)), wr = leaf(w.chunk(n, 0)[r]), br = leaf(b.chunk(n, 0)[r]);
    const at::Tensor loss = kiln::gathered_linear(xr, wr, br, g_world).square().sum();
    std::vector<at::Tensor> inputs = which == 0 ? std::vector<at::Tensor>{xr}
                                   : which == 1 ? std::vector<at::Tensor>{wr, br}
                                                : std::vector<at::Tensor>{xr, wr, br};
    const int64_t before = g_world->stats().calls;
    std::vector<at::Tensor> grads = torch::autograd::grad({loss}, inputs);
    *calls = g_world->stats().calls - before;
    return grads;
  };
  int64_t input_calls = 0, weight_calls = 0, both_calls = 0;
  const auto gi = run(0, &input_calls), gw = run(1, &weight_calls), all = run(2, &both_calls);
  EXPECT_EQ(input_calls, 1) << "the input pass: one reduce-scatter";
  EXPECT_EQ(weight_calls, 1) << "the weight pass: one gather";
  EXPECT_EQ(both_calls, 2);
  expect_close(gi[0], all[0], "the input's gradient, alone");
  expect_close(gw[0], all[1], "the weight's gradient, alone");
  expect_close(gw[1], all[2], "the bias's gradient, alone");
}

// Chunks i and 2n-1-i: every position held once, and the causal attention work (position p
// attends p + 1 keys) the same on every rank.
TEST(ContextParallel, PositionsCoverTheSequenceAndBalanceTheWork) {
  for (int64_t n = 1; n <= 4; ++n) {
    const int64_t T = 16 * n;
    std::vector<int> seen(static_cast<size_t>(T), 0);
    int64_t first_work = -1;
    for (int64_t r = 0; r < n; ++r) {
      const at::Tensor pos = kiln::context_positions(T, n, r);
      ASSERT_EQ(pos.numel(), T / n);
      int64_t work = 0;
      for (int64_t i = 0; i < pos.numel(); ++i) {
        const int64_t p = pos[i].item<int64_t>();
        ++seen[static_cast<size_t>(p)];
        work += p + 1;
      }
      if (first_work < 0) first_work = work;
      EXPECT_EQ(work, first_work) << "cp " << n << " rank " << r;
    }
    for (int s : seen) EXPECT_EQ(s, 1);
  }
}

// The causal mask reaches every layer as one tensor: SDPA's fused kernels keep their mask for
// backward, so one per layer would cost a [2C, T] per layer (51 GB for gpt2-1.5b at T 32k, cp 2).
TEST(ContextParallel, OneMaskForEveryLayer) {
  auto c = kiln::GPTConfig::preset("tiny");
  const int64_t n = g_world->size();
  c.seq_len = 32 * n;
  const auto shard = kiln::make_context_parallel(kiln::ModelShard{}, c, g_world);
  const int64_t local = c.seq_len / n, h = c.head_dim();
  at::manual_seed(6);
  const at::Tensor k = at::randn({2, c.n_kv_head, local, h}), v = at::randn({2, c.n_kv_head, local, h});
  const auto [k1, v1, m1] = shard.ops->gather_kv(k, v);
  const auto [k2, v2, m2] = shard.ops->gather_kv(k, v);
  ASSERT_EQ(m1.sizes(), (std::vector<int64_t>{local, c.seq_len}));
  EXPECT_TRUE(m1.is_same(m2)) << "a new mask per call";
  // Additive: 0 where query position pos(j) may see key k (its position key_pos(k) <= pos(j)),
  // -inf elsewhere. The keys come in the order they arrive, rank-major (rank i's 2C rows: its
  // positions), not sorted: no permutation copies K and V (issue 34's cost list).
  const at::Tensor pos = kiln::context_positions(c.seq_len, n, g_world->rank());
  std::vector<at::Tensor> held;
  for (int64_t i = 0; i < n; ++i) held.push_back(kiln::context_positions(c.seq_len, n, i));
  const at::Tensor key_pos = at::cat(held);
  const at::Tensor allowed = key_pos.unsqueeze(0) <= pos.unsqueeze(1);
  // The gathered keys are every rank's, in that order: rank i's block is its own k.
  std::vector<at::Tensor> blocks;
  for (int64_t i = 0; i < n; ++i) {
    at::Tensor b = k.clone();
    g_world->broadcast(b, static_cast<int>(i))->wait();
    blocks.push_back(b);
  }
  EXPECT_TRUE(at::equal(k1, at::cat(blocks, 2))) << "K in arrival order";
  EXPECT_TRUE(at::equal(m1.eq(0), allowed));
  EXPECT_TRUE(at::isinf(m1).eq(allowed.logical_not()).all().item<bool>());
  EXPECT_EQ(k1.size(2), c.seq_len);
}

namespace {

kiln::GPTConfig config(int64_t layers, double dropout) {
  auto c = kiln::GPTConfig::preset("tiny");  // d 128, 4 heads, T 128, vocabulary 512
  c.n_layer = layers;
  c.dropout = dropout;
  return c;
}

int64_t heap_in_use() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
}

enum class Split { Tp, TpSp, Cp };

// Bytes the forward allocates and still holds when it returns (after a warm-up step).
int64_t kept_by_forward(const kiln::GPTConfig& c, Split split, int64_t batch) {
  kiln::ModelShard shard;
  if (split == Split::Cp) shard = kiln::make_context_parallel(kiln::ModelShard{}, c, g_world);
  else shard = kiln::make_tensor_parallel_shard(c, g_world, split == Split::TpSp);
  kiln::GPT model(c, at::TensorOptions(), shard);
  model.init_weights(1, split == Split::Cp ? nullptr : kiln::tp_slicer(c, g_world->size(), g_world->rank()));
  if (split == Split::TpSp) kiln::sum_replicated_gradients_over_tp(model, g_world);
  model.train();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor idx = at::randint(c.vocab_size, {batch, c.seq_len}, gen, at::kLong);
  const at::Tensor tgt = at::randint(c.vocab_size, {batch, c.seq_len}, gen, at::kLong);
  model.loss(idx, tgt).backward();
  const int64_t before = heap_in_use();
  auto loss = model.loss(idx, tgt);
  const int64_t kept = heap_in_use() - before;
  loss.backward();
  return kept;
}

struct MemoryRow {
  const char* name;
  Split split;
  int64_t predicted;  // bytes per layer
};

// Each row's bytes per layer (4 layers minus 2, halved) within 3% of its prediction.
void expect_per_layer(double dropout, int64_t batch, const std::vector<MemoryRow>& rows, int64_t unsplit) {
  const auto c4 = config(4, dropout), c2 = config(2, dropout);
  for (const auto& r : rows) {
    const int64_t per_layer = (kept_by_forward(c4, r.split, batch) - kept_by_forward(c2, r.split, batch)) / 2;
    if (g_world->rank() == 0) {
      std::printf("  dropout %.1f, B %lld: %-10s per layer %9lld B, predicted %9lld B (%+.2f%%); unsplit %lld B\n", dropout,
                  static_cast<long long>(batch), r.name, static_cast<long long>(per_layer), static_cast<long long>(r.predicted),
                  100.0 * static_cast<double>(per_layer - r.predicted) / static_cast<double>(r.predicted),
                  static_cast<long long>(unsplit));
    }
    EXPECT_NEAR(static_cast<double>(per_layer), static_cast<double>(r.predicted), 0.03 * static_cast<double>(r.predicted))
        << r.name << ", dropout " << dropout;
  }
}

}  // namespace

// Per layer, fp32 on the CPU math path with dropout (test_activation_checkpoint.cpp: 72d + 12HT
// + 16 bytes per token unsplit, of which 24d + 16 in the regions tp replicates -- the block input,
// the residual after attention, the two LayerNorms' outputs and statistics, the two residual
// dropout masks -- and 48d + 12HT in the split ones), t = n ranks:
//   tp       (24d + 16) + (48d + 12HT) / t           per token of the sequence
//   tp + sp  (72d + 12HT + 16) / t                   the replicated regions split too
//   cp       72d + 12HT + 16 + 8d (n - 1)            per token the rank holds (T / n of them):
//            the scores stay [T/n, T] per head, and the gathered K and V (4d bytes each per
//            position) are the whole sequence's
// Without dropout the CPU runs the flash kernel, which keeps q, k, v as views of c_attn's output
// (12d), the output and a 4H logsumexp: 64d + 4H + 16 per token unsplit, 16d + 16 of it
// replicated; cp keeps the whole K and V (8d n per local token) and one additive mask bias for
// the run, shared by the layers (ContextParallel.OneMaskForEveryLayer).
TEST(SequenceParallel, ActivationMemoryFallsAsThePlanSays) {
  if (g_world->size() != 2) GTEST_SKIP() << "measured at 2 ranks";
  const auto c = config(4, 0.0);
  const int64_t d = c.d_model, H = c.n_head, T = c.seq_len, n = 2;
  {
    const int64_t tokens = 4 * T;
    expect_per_layer(0.1, 4,
                     {{"tp 2", Split::Tp, ((24 * d + 16) + (48 * d + 12 * H * T) / n) * tokens},
                      {"tp 2 + sp", Split::TpSp, (72 * d + 12 * H * T + 16) * tokens / n},
                      {"cp 2", Split::Cp, (72 * d + 12 * H * T + 16 + 8 * d * (n - 1)) * tokens / n}},
                     (72 * d + 12 * H * T + 16) * tokens);
  }
  {
    const int64_t tokens = 4 * T;
    expect_per_layer(0.0, 4,
                     {{"tp 2", Split::Tp, ((16 * d + 16) + (48 * d + 4 * H) / n) * tokens},
                      {"tp 2 + sp", Split::TpSp, (64 * d + 4 * H + 16) * tokens / n},
                      {"cp 2", Split::Cp, (64 * d + 4 * H + 16 + 8 * d * n) * tokens / n}},
                     (64 * d + 4 * H + 16) * tokens);
  }
}

int main(int argc, char** argv) {
  kiln::Environment env(&argc, &argv);
  if (!env.info().mpi) {
    std::fprintf(stderr, "test_sequence_parallel: run under mpirun (e.g. mpirun -np 2 %s)\n", argv[0]);
    return 2;
  }
  ::testing::InitGoogleTest(&argc, argv);
  if (env.info().rank != 0 && !std::getenv("KILN_TEST_ALL_RANKS")) {  // one rank reports; the verdict is shared below
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  g_world = kiln::make_mpi_communicator(MPI_COMM_WORLD, "world");
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (env.info().rank == 0)
    std::printf("test_sequence_parallel: %d ranks, %s\n", env.info().world_size, any_failed ? "FAILED on some rank" : "passed on every rank");
  g_world.reset();
  return any_failed;
}
