// tests/test_generate.cpp -- the key/value cache against the full forward, the generation loop's
// windows, and the sampler's rules (runtime/inference/kv_cache.h, runtime/inference/generate.h, runtime/inference/sampling.h).
//
// Tolerance. Cached and full forwards do the same arithmetic on the same fp32 numbers, but
// attention reduces over a differently shaped problem (one query row against P keys, or the
// masked square), so the sums round differently: ~1e-7 relative per operation, ~1e-6 in logits of
// size ~3 after two blocks. 1e-5 absolute leaves a tenfold margin; a cache that is wrong in any
// way that matters (a position off by one, a missing mask) moves logits by 1e-1 or more, which
// the negative control below checks.
#include <cmath>
#include <cstdio>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "data/tokenizer.h"
#include "distributed/error.h"
#include "models/gpt.h"
#include "parallel/activation_checkpoint.h"
#include "runtime/inference/generate.h"
#include "runtime/inference/kv_cache.h"
#include "runtime/inference/sampling.h"

using kiln::GPT;
using kiln::GPTConfig;

namespace {

constexpr double kLogitTolerance = 1e-5;

GPTConfig small_config(int64_t kv_heads) {
  GPTConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = kv_heads;
  c.d_model = 32;
  c.seq_len = 16;
  c.vocab_size = 300;  // padded to 384: the padding columns must never be drawn
  return c;
}

// GPT-2's initialisation, with the embedding scaled up so that logits spread over ~1 (at 0.02
// they are nearly uniform and greedy choices would hang on rounding).
std::shared_ptr<GPT> small_model(const GPTConfig& c) {
  auto m = std::make_shared<GPT>(c);
  m->init_weights(7);
  at::NoGradGuard no_grad;
  m->wte.mul_(5.0);
  m->eval();
  return m;
}

at::Tensor random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(vocab, {1, n}, gen, at::TensorOptions().dtype(at::kLong));
}

// The cached forward's logits for `tokens`, fed in chunks of the given sizes (summing to T).
at::Tensor cached_logits(GPT& m, const at::Tensor& tokens, const std::vector<int64_t>& chunks) {
  kiln::KVCache cache(m, 1, m.config().seq_len);
  std::vector<at::Tensor> out;
  int64_t at_pos = 0;
  for (const int64_t n : chunks) {
    out.push_back(at::linear(kiln::forward_cached(m, tokens.narrow(1, at_pos, n), cache), m.wte));
    at_pos += n;
  }
  EXPECT_EQ(cache.length(), at_pos);
  return at::cat(out, 1);
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

}  // namespace

// Position by position: one token at a time (the decoding path, no mask), a prompt then single
// tokens (is_causal prefill, then no mask), and chunks of 3 after a prefill (the offset mask).
TEST(KVCache, CachedLogitsEqualTheFullForwardAtEveryPosition) {
  for (const int64_t kv : {4, 2, 1}) {  // multi-head, grouped-query, multi-query
    const GPTConfig c = small_config(kv);
    auto m = small_model(c);
    at::NoGradGuard no_grad;
    const auto tokens = random_tokens(c.seq_len, c.vocab_size, 3);
    const auto full = m->logits(tokens);  // [1, T, V']: the training forward
    for (const auto& chunks : std::vector<std::vector<int64_t>>{std::vector<int64_t>(16, 1), {5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
                                                                {4, 3, 3, 3, 3}, {16}}) {
      const auto cached = cached_logits(*m, tokens, chunks);
      ASSERT_EQ(cached.sizes(), full.sizes());
      for (int64_t t = 0; t < c.seq_len; ++t) {
        const double d = max_abs_diff(cached.select(1, t), full.select(1, t));
        ASSERT_LE(d, kLogitTolerance) << "kv heads " << kv << ", position " << t << ", first chunk " << chunks[0];
      }
      std::printf("kv heads %lld, chunks from %lld: max |cached - full| logit = %.3g (logits' max |z| %.2f)\n",
                  static_cast<long long>(kv), static_cast<long long>(chunks[0]), max_abs_diff(cached, full),
                  full.abs().max().item<double>());
    }
  }
}

// Mistral's sliding window (GPTConfig::sliding_window 5 at T 16, rotary positions): the cached
// forward keeps only the last 5 positions of each layer, and its logits equal the full forward's
// (the band mask) at every position, fed one at a time, after a prompt longer than the window, and
// in chunks; the windowed full forward is not the unwindowed one (the window acts).
TEST(KVCache, SlidingWindowKeepsTheLastWPositions) {
  GPTConfig c = small_config(2);
  c.position = "rope";
  c.sliding_window = 5;
  auto m = small_model(c);
  at::NoGradGuard no_grad;
  const auto tokens = random_tokens(c.seq_len, c.vocab_size, 4);
  const auto full = m->logits(tokens);
  for (const auto& chunks : std::vector<std::vector<int64_t>>{std::vector<int64_t>(16, 1), {9, 1, 1, 1, 1, 1, 1, 1},
                                                              {3, 4, 4, 5}, {16}}) {
    kiln::KVCache cache(*m, 1, c.seq_len);
    EXPECT_EQ(cache.window(), 5);
    std::vector<at::Tensor> out;
    int64_t at_pos = 0;
    for (const int64_t n : chunks) {
      out.push_back(at::linear(kiln::forward_cached(*m, tokens.narrow(1, at_pos, n), cache), m->wte));
      at_pos += n;
      EXPECT_EQ(cache.key_start(), std::max<int64_t>(0, at_pos - 5));
    }
    const double d = max_abs_diff(at::cat(out, 1), full);
    EXPECT_LE(d, kLogitTolerance) << "first chunk " << chunks[0];
    std::printf("sliding window 5, chunks from %lld: max |cached - full| logit = %.3g\n", static_cast<long long>(chunks[0]), d);
  }
  GPTConfig wide = c;
  wide.sliding_window = 0;
  GPT unwindowed(wide);
  unwindowed.init_weights(7);
  {
    at::NoGradGuard g;
    unwindowed.wte.mul_(5.0);
  }
  unwindowed.eval();
  EXPECT_GT(max_abs_diff(unwindowed.logits(tokens).narrow(1, 6, 10), full.narrow(1, 6, 10)), 1e-3);
  EXPECT_LE(max_abs_diff(unwindowed.logits(tokens).narrow(1, 0, 5), full.narrow(1, 0, 5)), kLogitTolerance);  // inside the window: the same
}

// The test can fail: a cache whose positions are one off (the first token forgotten) gives logits
// far outside the tolerance.
TEST(KVCache, AWrongCacheIsCaught) {
  const GPTConfig c = small_config(4);
  auto m = small_model(c);
  at::NoGradGuard no_grad;
  const auto tokens = random_tokens(c.seq_len, c.vocab_size, 3);
  const auto full = m->logits(tokens);
  kiln::KVCache cache(*m, 1, c.seq_len);
  kiln::forward_cached(*m, tokens.narrow(1, 0, 8), cache);
  cache.clear();  // forgets positions 0..7: the next tokens land at positions 0.. with no past
  const auto wrong = at::linear(kiln::forward_cached(*m, tokens.narrow(1, 8, 8), cache), m->wte);
  const double d = max_abs_diff(wrong, full.narrow(1, 8, 8));
  std::printf("a cache that lost its first 8 positions: max |wrong - full| logit = %.3g\n", d);
  EXPECT_GT(d, 1e4 * kLogitTolerance);
}

TEST(KVCache, RefusesToPassTheContext) {
  const GPTConfig c = small_config(4);
  auto m = small_model(c);
  at::NoGradGuard no_grad;
  kiln::KVCache cache(*m, 1, c.seq_len);
  kiln::forward_cached(*m, random_tokens(12, c.vocab_size, 1), cache);
  EXPECT_THROW(kiln::forward_cached(*m, random_tokens(5, c.vocab_size, 2), cache), kiln::ConfigError);
  EXPECT_THROW(kiln::KVCache(*m, 1, c.seq_len + 1), kiln::Error);
}

// Greedy generation with and without the cache: the same tokens, through several window moves
// (seq_len 16, 60 new tokens), and a training-mode model left in training mode.
TEST(Generate, CachedAndRecomputedGreedyTokensAreEqual) {
  const GPTConfig c = small_config(2);
  auto m = small_model(c);
  m->train();
  kiln::GenerateConfig g;
  g.sampling.temperature = 0.0;
  g.max_new_tokens = 60;
  const std::vector<int64_t> prompt{1, 2, 3, 4, 5};
  const auto cached = kiln::generate(*m, prompt, g);
  g.kv_cache = false;
  const auto full = kiln::generate(*m, prompt, g);
  EXPECT_TRUE(m->is_training());
  ASSERT_EQ(cached.tokens.size(), 60u);
  EXPECT_EQ(cached.tokens, full.tokens);
  EXPECT_EQ(cached.window_moves, full.window_moves);
  EXPECT_GE(cached.window_moves, 3);
  for (const int64_t t : cached.tokens) EXPECT_LT(t, c.vocab_size);  // never a padding column
  // The cost: the cache runs the prompt, then one position per token (the last token is not run),
  // plus each new window's prefill of T - T/2 = 8 less the one token it replaces.
  EXPECT_EQ(cached.positions, 5 + 59 + cached.window_moves * 7);
  EXPECT_GT(full.positions, 3 * cached.positions);
  std::printf("60 greedy tokens: the same with and without the cache; %lld positions run with it, %lld without, %lld window moves\n",
              static_cast<long long>(cached.positions), static_cast<long long>(full.positions),
              static_cast<long long>(cached.window_moves));
}

TEST(Generate, PromptLongerThanTheContextIsCutAndStopTokenEnds) {
  const GPTConfig c = small_config(4);
  auto m = small_model(c);
  kiln::GenerateConfig g;
  g.sampling.temperature = 0.0;
  g.max_new_tokens = 3;
  std::vector<int64_t> prompt(40, 7);
  const auto out = kiln::generate(*m, prompt, g);
  EXPECT_EQ(out.prompt_used, c.seq_len);
  ASSERT_EQ(out.tokens.size(), 3u);
  // The first greedy token, made the stop token, ends generation before anything is returned.
  g.stop_token = out.tokens[0];
  const auto stopped = kiln::generate(*m, prompt, g);
  EXPECT_TRUE(stopped.stopped);
  EXPECT_TRUE(stopped.tokens.empty());
  EXPECT_THROW(kiln::generate(*m, {}, g), kiln::ConfigError);
  EXPECT_THROW(kiln::generate(*m, {c.vocab_size}, g), kiln::ConfigError);
}

TEST(Generate, SameSeedSameTokensOtherSeedOtherTokens) {
  const GPTConfig c = small_config(4);
  auto m = small_model(c);
  kiln::GenerateConfig g;
  g.sampling.temperature = 1.0;
  g.max_new_tokens = 30;
  g.seed = 11;
  const auto a = kiln::generate(*m, {1}, g);
  const auto b = kiln::generate(*m, {1}, g);
  g.seed = 12;
  const auto other = kiln::generate(*m, {1}, g);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_NE(a.tokens, other.tokens);
  g.candidates = 10;  // only the first 10 ids may be drawn
  for (const int64_t t : kiln::generate(*m, {1}, g).tokens) EXPECT_LT(t, 10);
}

// --sample-every: the trainer samples from its training model (train mode, dropout, activation
// checkpointing hooks) between steps. The sample must leave the run as it was: the model back in
// train mode and the global random stream untouched, so the next step's dropout masks -- and the
// losses -- are those of a run without samples.
TEST(Generate, TrainingSampleLeavesTheRunUnchanged) {
  GPTConfig c = small_config(4);
  c.dropout = 0.1;
  auto m = small_model(c);
  m->train();
  kiln::apply_activation_checkpointing(*m, kiln::ActivationCheckpointing::Selective);
  const auto x = random_tokens(c.seq_len, c.vocab_size, 4), y = random_tokens(c.seq_len, c.vocab_size, 5);
  at::manual_seed(9);
  const double before = m->loss(x, y).item<double>();
  at::manual_seed(9);
  const kiln::ByteTokenizer tok;
  const std::string text = kiln::training_sample(*m, tok, 40, nullptr, 1.0, 3);
  const double after = m->loss(x, y).item<double>();
  EXPECT_TRUE(m->is_training());
  EXPECT_EQ(before, after);  // the same dropout masks: no global random number was drawn
  EXPECT_LE(text.size(), 3u * 40u);  // 40 bytes at most, each invalid one at most 3 bytes of U+FFFD
  EXPECT_EQ(text, kiln::training_sample(*m, tok, 40, nullptr, 1.0, 3));  // seeded: the same text again
}

TEST(Sampling, GreedyTopKTopP) {
  const auto z = at::log(at::tensor({0.05, 0.4, 0.1, 0.3, 0.15}, at::kFloat));  // probabilities at temperature 1
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  kiln::SamplingConfig s;
  s.temperature = 0.0;
  EXPECT_EQ(kiln::sample_token(z, s, gen), 1);
  s.temperature = 1.0;
  auto p = kiln::sampling_probs(z, s);
  EXPECT_NEAR(p[3].item<double>(), 0.3, 1e-6);
  s.top_k = 2;  // ids 1 and 3: 0.4 / 0.7, 0.3 / 0.7
  p = kiln::sampling_probs(z, s);
  EXPECT_NEAR(p[1].item<double>(), 0.4 / 0.7, 1e-6);
  EXPECT_NEAR(p[3].item<double>(), 0.3 / 0.7, 1e-6);
  EXPECT_EQ((p > 0).sum().item<int64_t>(), 2);
  s.top_k = 0;
  s.top_p = 0.8;  // 0.4 + 0.3 = 0.7 < 0.8, + 0.15 = 0.85 reaches it: ids 1, 3, 4
  p = kiln::sampling_probs(z, s);
  EXPECT_EQ((p > 0).sum().item<int64_t>(), 3);
  EXPECT_NEAR(p[4].item<double>(), 0.15 / 0.85, 1e-6);
  s.top_p = 0.1;  // the most likely alone
  EXPECT_EQ(kiln::sample_token(z, s, gen), 1);
  s.top_p = 1.0;
  s.temperature = 1e-3;  // a cold softmax is greedy in effect
  EXPECT_EQ(kiln::sample_token(z, s, gen), 1);
  // Drawn often, the frequencies follow the probabilities (4000 draws: 3 sigma ~ 0.023).
  s.temperature = 1.0;
  std::vector<int> count(5, 0);
  for (int i = 0; i < 4000; ++i) ++count[static_cast<size_t>(kiln::sample_token(z, s, gen))];
  EXPECT_NEAR(count[1] / 4000.0, 0.4, 0.03);
  EXPECT_NEAR(count[0] / 4000.0, 0.05, 0.015);
}

// The repetition penalty (CTRL's, Hugging Face's repetition_penalty): an id already in the
// context has its logit divided by r when positive, multiplied when not; each id once however
// often it was seen; ids outside the candidates ignored; greedy feels it too.
TEST(Sampling, RepetitionPenalty) {
  const auto z = at::tensor({2.0, -1.0, 1.5, 0.5}, at::kFloat);
  const at::Tensor p = kiln::penalized(z, {0, 1, 0, 0, 7}, 2.0);
  EXPECT_TRUE(at::equal(p, at::tensor({1.0, -2.0, 1.5, 0.5}, at::kFloat))) << p;
  EXPECT_TRUE(at::equal(kiln::penalized(z, {0, 1}, 1.0), z));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  kiln::SamplingConfig s;
  s.temperature = 0.0;
  EXPECT_EQ(kiln::sample_token(z, s, gen, {0}), 0);  // off: the largest
  s.repetition_penalty = 2.0;
  EXPECT_EQ(kiln::sample_token(z, s, gen, {0}), 2);  // 2.0 / 2 < 1.5
  EXPECT_EQ(kiln::sample_token(z, s, gen, {}), 0);
  s.repetition_penalty = 0.0;
  EXPECT_THROW(s.validate(), kiln::ConfigError);
}

TEST(Sampling, RefusesBadSettings) {
  kiln::SamplingConfig s;
  s.temperature = -0.5;
  EXPECT_THROW(s.validate(), kiln::ConfigError);
  s.temperature = NAN;
  EXPECT_THROW(s.validate(), kiln::ConfigError);
  s = {};
  s.top_p = 0.0;
  EXPECT_THROW(s.validate(), kiln::ConfigError);
  s.top_p = 1.01;
  EXPECT_THROW(s.validate(), kiln::ConfigError);
  s = {};
  s.top_k = -1;
  EXPECT_THROW(s.validate(), kiln::ConfigError);
}

TEST(Tokenizer, BytesRoundTripAndEndOfText) {
  const kiln::ByteTokenizer tok;
  const std::string text = "kiln \xc3\xa9\n";
  const auto ids = tok.encode(text);
  EXPECT_EQ(ids.size(), text.size());
  EXPECT_EQ(ids[5], 0xc3);
  auto with_eot = ids;
  with_eot.push_back(tok.eot());
  EXPECT_EQ(tok.decode(with_eot), text);
  EXPECT_THROW(tok.decode({300}), kiln::Error);
  EXPECT_EQ(kiln::valid_utf8("a\xc3"), "a\xef\xbf\xbd");  // a cut character -> U+FFFD
}
