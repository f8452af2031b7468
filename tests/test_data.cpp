// tests/test_data.cpp -- token files, datasets, sample order, loader, synthetic corpus and prep.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "data/hf_tokenizer.h"
#include "data/loader.h"
#include "data/paths.h"
#include "data/prefetch.h"
#include "data/prep.h"
#include "data/synthetic.h"
#include "data/target_mask.h"
#include "distributed/error.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<unsigned char>;
using Tokens = std::vector<int64_t>;

// fs::remove_all on purpose: it crashes if the wheel's libtorch std::filesystem symbols win over
// libstdc++'s (see cmake/KilnDependencies.cmake), so these tests also guard that link order.
void remove_tree(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
}

// Each test gets its own directory, removed afterwards, so test runs never collide.
class DataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("kiln_test_data_" + std::to_string(::getpid()) + "_" +
                                        info->test_suite_name() + "_" + info->name());
    remove_tree(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { remove_tree(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

void write_bytes(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

void put_le(Bytes& bytes, uint32_t v, int width) {
  for (int b = 0; b < width; ++b) bytes.push_back(static_cast<unsigned char>(v >> (8 * b)));
}

// An llm.c header followed by `payload` zero bytes.
Bytes shard_bytes(int32_t magic, int32_t version, int32_t count, size_t payload) {
  Bytes bytes;
  for (int32_t v : {magic, version, count}) put_le(bytes, static_cast<uint32_t>(v), 4);
  bytes.resize(1024 + payload, 0);
  return bytes;
}

Tokens read_all(const TokenSource& src) {
  Tokens out(static_cast<size_t>(src.size()));
  src.read(0, src.size(), out.data());
  return out;
}

std::vector<int32_t> iota_tokens(int n, int32_t first) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

// fn must throw DataError whose message contains every one of `parts`.
void expect_data_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected kiln::DataError containing '" << parts.front() << "'";
  } catch (const DataError& e) {
    for (const auto& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message '" << e.what() << "' lacks '" << part << "'";
  }
}

class VectorSource final : public TokenSource {
 public:
  explicit VectorSource(Tokens tokens) : tokens_(std::move(tokens)) {}
  int64_t size() const override { return static_cast<int64_t>(tokens_.size()); }
  void read(int64_t offset, int64_t n, int64_t* out) const override {
    std::copy(tokens_.begin() + offset, tokens_.begin() + offset + n, out);
  }
  const std::string& name() const override { return name_; }

 private:
  Tokens tokens_;
  std::string name_ = "vector";
};

// ---- TokenFile ----------------------------------------------------------------------------

TEST_F(DataTest, ShardRoundTripsUint16AndUint32) {
  const std::vector<int32_t> narrow = {0, 1, 255, 256, 50256, 65535};
  const std::vector<int32_t> wide = {7, 65536, 100000, 2147483647, 0};
  for (const auto& [tokens, bytes_per_token] : {std::pair{narrow, 2}, std::pair{wide, 4}}) {
    write_token_shard(path("a.bin"), tokens);
    EXPECT_FALSE(fs::exists(path("a.bin.tmp")));
    EXPECT_EQ(fs::file_size(path("a.bin")), 1024u + bytes_per_token * tokens.size());
    for (TokenFormat f : {TokenFormat::Auto, TokenFormat::Shard}) {
      TokenFile file(path("a.bin"), f);
      EXPECT_EQ(file.bytes_per_token(), bytes_per_token);
      EXPECT_EQ(file.name(), path("a.bin"));
      EXPECT_EQ(read_all(file), Tokens(tokens.begin(), tokens.end()));
      int64_t mid[2];
      file.read(2, 2, mid);
      EXPECT_EQ(Tokens(mid, mid + 2), Tokens(tokens.begin() + 2, tokens.begin() + 4));
    }
  }
  write_token_shard(path("empty.bin"), {});
  EXPECT_EQ(TokenFile(path("empty.bin"), TokenFormat::Shard).size(), 0);
  expect_data_error([&] { write_token_shard(path("neg.bin"), {1, -2}); },
                    {path("neg.bin"), "negative token -2"});
  EXPECT_FALSE(fs::exists(path("neg.bin")));
}

TEST_F(DataTest, RawUint16File) {
  Bytes bytes;
  for (uint32_t t : {1u, 513u, 65535u, 0u}) put_le(bytes, t, 2);
  write_bytes(path("raw.bin"), bytes);
  TokenFile file(path("raw.bin"), TokenFormat::Raw);
  EXPECT_EQ(file.bytes_per_token(), 2);
  EXPECT_EQ(read_all(file), (Tokens{1, 513, 65535, 0}));
}

// An llm.c shard named with --data-format raw is refused: read as raw it trained on its header's
// 1024 bytes as 512 tokens (issue 38).
TEST_F(DataTest, RawFormatRefusesAnLlmcShard) {
  write_token_shard(path("shard.bin"), iota_tokens(10, 0));
  expect_data_error([&] { TokenFile f(path("shard.bin"), TokenFormat::Raw); },
                    {path("shard.bin"), "is an llm.c shard (magic 20240520, version 1, 10 tokens)", "leave out --data-format raw"});
  EXPECT_EQ(TokenFile(path("shard.bin"), TokenFormat::Auto).size(), 10);
}

TEST_F(DataTest, MalformedFilesNameThePathAndTheReason) {
  Bytes raw;  // a raw uint16 file of token 1234, whose first int32 is not the magic
  for (int i = 0; i < 1024; ++i) put_le(raw, 1234, 2);
  Bytes tiny = shard_bytes(kShardMagic, 1, 0, 0);
  tiny.resize(100);
  const std::string text = "The quick brown fox\tjumps over the lazy dog; caf\xc3\xa9.\r\n{\"text\": \"a document\"}\n";
  struct Case { std::string name; Bytes bytes; TokenFormat format; std::string reason; };
  const std::vector<Case> cases = {
      {"raw.bin", raw, TokenFormat::Auto,
       ": bad magic 80872658 (expected 20240520 for an llm.c shard; for a raw uint16 token file "
       "pass --data-format raw)"},
      {"raw.bin", raw, TokenFormat::Shard, ": bad magic 80872658"},
      {"v3.bin", shard_bytes(kShardMagic, 3, 2, 8), TokenFormat::Auto, ": unknown shard version 3"},
      {"short.bin", shard_bytes(kShardMagic, 1, 100, 100), TokenFormat::Auto,
       ": size 1124 bytes disagrees with the header: 100 tokens of 2 bytes need 1224 bytes"},
      {"long.bin", shard_bytes(kShardMagic, 2, 10, 80), TokenFormat::Auto,
       ": size 1104 bytes disagrees with the header: 10 tokens of 4 bytes need 1064 bytes"},
      {"negcount.bin", shard_bytes(kShardMagic, 1, -1, 0), TokenFormat::Auto,
       ": negative token count -1"},
      {"tiny.bin", tiny, TokenFormat::Shard, ": size 100 bytes is smaller than the 1024-byte"},
      {"odd.bin", {1, 2, 3}, TokenFormat::Raw, ": size 3 bytes is odd"},
      {"zero.bin", {}, TokenFormat::Raw, ": empty raw token file"},
      // Text where tokens are read: kiln prep's command (issue 48: it said "bad magic" alone),
      // by its first bytes or by its name.
      {"corpus", Bytes(text.begin(), text.end()), TokenFormat::Auto,
       ": holds text, not tokens (an llm.c shard starts with the magic 20240520): make token shards of it first, kiln prep "
       "--input " + path("corpus") + " --out " + path("corpus_shards") + ", then train with --data '" + path("corpus_shards") +
       "/train_*.bin'"},
      {"notes.jsonl", shard_bytes(7, 1, 0, 0), TokenFormat::Shard, ": holds text, not tokens"},
      {"hi.txt", {'h', 'i'}, TokenFormat::Auto, ": holds text, not tokens"},
  };
  for (const Case& c : cases) {
    write_bytes(path(c.name), c.bytes);
    expect_data_error([&] { TokenFile(path(c.name), c.format); }, {path(c.name) + c.reason});
  }
  expect_data_error([&] { TokenFile(path("nope.bin"), TokenFormat::Auto); },
                    {path("nope.bin") + ": cannot open: No such file or directory"});
}

// A target mask beside a shard (data/target_mask.h): written and read back byte for byte; the
// dataset turns the untrained targets into kIgnoreTarget (target j is token j + 1, so the mask's
// byte of the token after the input) and counts the trained ones; the loader's step_targets is the
// sum over every dp rank's sequences, the same on each rank, and the prefetcher's batches carry it.
// Bad masks name the file and the fault.
TEST_F(DataTest, TargetMaskBesideAShard) {
  const int n = 49;  // 6 samples of 8 + 1
  write_token_shard(path("train_000000.bin"), iota_tokens(n, 0));
  EXPECT_EQ(mask_path_for(path("train_000000.bin")), path("train_000000.mask"));
  EXPECT_EQ(mask_path_for("data/raw"), "data/raw.mask");
  std::vector<uint8_t> mask(n);
  for (int i = 0; i < n; ++i) mask[static_cast<size_t>(i)] = (i % 5 == 1 || i % 7 == 0) ? 1 : 0;
  {
    const TokenFile plain(path("train_000000.bin"), TokenFormat::Auto);
    EXPECT_FALSE(plain.masked());
  }
  write_target_mask(path("train_000000.mask"), mask);
  auto file = std::make_shared<const TokenFile>(path("train_000000.bin"), TokenFormat::Auto);
  ASSERT_TRUE(file->masked());
  for (int i = 0; i < n; ++i) EXPECT_EQ(file->trained_at(i), mask[static_cast<size_t>(i)] == 1) << i;
  const int64_t T = 8;
  auto ds = std::make_shared<const TokenDataset>(std::vector<std::shared_ptr<const TokenSource>>{file}, T, 64);
  ASSERT_TRUE(ds->masked());
  int64_t all = 0;
  for (int64_t i = 0; i < ds->num_samples(); ++i) {
    Tokens x(T), y(T);
    ds->sample(i, x.data(), y.data());
    int64_t trained = 0;
    for (int64_t j = 0; j < T; ++j) {
      const int64_t token = i * T + j + 1;
      if (mask[static_cast<size_t>(token)]) {
        EXPECT_EQ(y[static_cast<size_t>(j)], token);
        ++trained;
      } else {
        EXPECT_EQ(y[static_cast<size_t>(j)], kIgnoreTarget);
      }
      EXPECT_EQ(x[static_cast<size_t>(j)], token - 1);  // inputs are never masked
    }
    EXPECT_EQ(ds->trained_targets(i), trained);
    all += trained;
  }
  const DataLoader single(ds, 3, true, BatchLayout{1, 2, 1, 0}), rank0(ds, 3, true, BatchLayout{1, 1, 2, 0}),
      rank1(ds, 3, true, BatchLayout{1, 1, 2, 1});
  int64_t per_step_sum = 0;
  for (int64_t step = 0; step < 3; ++step) {  // one epoch: 6 samples, 2 a step
    const int64_t want = (single.get(step, 0).targets.ge(0).sum() + single.get(step, 1).targets.ge(0).sum()).item<int64_t>();
    EXPECT_EQ(single.step_targets(step), want);
    EXPECT_EQ(rank0.step_targets(step), want);
    BatchPrefetcher prefetch(rank1, 1, /*pinned=*/false, /*last_step=*/3);
    EXPECT_EQ(prefetch.take(step).front().step_targets, want);  // counted once for the step's micro-batches
    per_step_sum += want;
  }
  EXPECT_EQ(per_step_sum, all);
}

TEST_F(DataTest, BadTargetMasksNameTheFile) {
  write_token_shard(path("a.bin"), iota_tokens(10, 0));
  write_target_mask(path("a.mask"), std::vector<uint8_t>(9, 1));
  expect_data_error([&] { TokenFile f(path("a.bin"), TokenFormat::Auto); }, {"a.mask", "1033 bytes beside a shard of 10 tokens"});
  Bytes bad = shard_bytes(kMaskMagic, 1, 10, 10);
  bad[1024 + 4] = 2;
  write_bytes(path("a.mask"), bad);
  expect_data_error([&] { TokenFile f(path("a.bin"), TokenFormat::Auto); }, {"a.mask", "byte 2 at token 4"});
  write_bytes(path("a.mask"), shard_bytes(kShardMagic, 1, 10, 10));
  expect_data_error([&] { TokenFile f(path("a.bin"), TokenFormat::Auto); }, {"a.mask", "bad magic"});
  write_bytes(path("a.mask"), shard_bytes(kMaskMagic, 1, 11, 10));
  expect_data_error([&] { TokenFile f(path("a.bin"), TokenFormat::Auto); }, {"a.mask", "counts 11 tokens"});
  EXPECT_THROW(write_target_mask(path("b.mask"), {0, 1, 3}), DataError);
}

TEST(TokenFormatTest, Parse) {
  EXPECT_EQ(parse_token_format("auto"), TokenFormat::Auto);
  EXPECT_EQ(parse_token_format("shard"), TokenFormat::Shard);
  EXPECT_EQ(parse_token_format("raw"), TokenFormat::Raw);
  try {
    parse_token_format("bin");
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("auto, shard, raw"), std::string::npos) << e.what();
  }
}

// ---- TokenDataset -------------------------------------------------------------------------

TEST_F(DataTest, DatasetCutsEachFileIntoShiftedSamples) {
  write_token_shard(path("a.bin"), iota_tokens(10, 0));   // (10 - 1) / 3 = 3 samples
  write_token_shard(path("b.bin"), iota_tokens(7, 100));  // (7 - 1) / 3 = 2 samples
  auto ds = TokenDataset::from_paths({path("a.bin"), path("b.bin")}, TokenFormat::Auto, 3, 200);
  EXPECT_EQ(ds.num_samples(), 5);
  EXPECT_EQ(ds.num_tokens(), 17);
  const std::vector<Tokens> want_x = {{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {100, 101, 102},
                                      {103, 104, 105}};
  for (int64_t i = 0; i < ds.num_samples(); ++i) {
    Tokens x(3), y(3);
    ds.sample(i, x.data(), y.data());
    EXPECT_EQ(x, want_x[static_cast<size_t>(i)]) << "sample " << i;
    // Consecutive integers within a file: a sample crossing 9 -> 100 would break this.
    EXPECT_EQ(y, (Tokens{x[0] + 1, x[1] + 1, x[2] + 1})) << "sample " << i;
  }
  write_token_shard(path("c.bin"), iota_tokens(3, 0));
  expect_data_error([&] { TokenDataset::from_paths({path("c.bin")}, TokenFormat::Auto, 3, 200); },
                    {path("c.bin") + ": fewer than seq_len+1 = 4 tokens, no training sample"});
}

TEST_F(DataTest, TokenOutsideVocabularyFails) {
  std::vector<int32_t> tokens = iota_tokens(9, 0);
  tokens[5] = 500;
  write_token_shard(path("oov.bin"), tokens);
  auto ds = TokenDataset::from_paths({path("oov.bin")}, TokenFormat::Auto, 2, 257);
  int64_t x[2], y[2];
  ds.sample(0, x, y);  // tokens 0..2 are fine
  expect_data_error([&] { ds.sample(2, x, y); },
                    {path("oov.bin") + ": token 500 at position 5 is outside the vocabulary "
                                       "(vocab-size 257)"});
}

TEST_F(DataTest, GlobPatternsAndCommaLists) {
  for (const char* name : {"train_000001.bin", "train_000000.bin", "val_000000.bin"})
    write_token_shard(path(name), iota_tokens(5, 0));
  auto names = [](const TokenDataset& ds) {
    std::vector<std::string> out;
    for (const auto& s : ds.sources()) out.push_back(s->name());
    return out;
  };
  auto globbed = TokenDataset::from_paths({path("train_*.bin")}, TokenFormat::Auto, 2, 10);
  EXPECT_EQ(names(globbed),
            (std::vector<std::string>{path("train_000000.bin"), path("train_000001.bin")}));
  EXPECT_EQ(globbed.num_samples(), 4);
  auto listed = TokenDataset::from_paths({path("val_*.bin") + "," + path("train_000001.bin")},
                                         TokenFormat::Auto, 2, 10);
  EXPECT_EQ(names(listed),
            (std::vector<std::string>{path("val_000000.bin"), path("train_000001.bin")}));
  const std::string none = path("nothing_*.bin");
  expect_data_error(
      [&] { TokenDataset::from_paths({path("val_*.bin") + "," + none}, TokenFormat::Auto, 2, 10); },
      {"--data: no file matches '" + none + "'"});
}

// ---- SampleOrder --------------------------------------------------------------------------

Tokens epoch_order(const SampleOrder& order, int64_t epoch) {
  Tokens out;
  for (int64_t i = 0, n = order.num_samples(); i < n; ++i) out.push_back(order(epoch * n + i));
  return out;
}

TEST(SampleOrderTest, IsABijectionEveryEpoch) {
  for (int64_t n : {1, 2, 7, 1000, 4097})
    for (uint64_t seed : {0ull, 1ull, 1337ull})
      for (int64_t epoch : {0, 1, 2, 5}) {
        Tokens got = epoch_order(SampleOrder(n, seed, true), epoch), want(got.size());
        std::sort(got.begin(), got.end());
        std::iota(want.begin(), want.end(), 0);
        EXPECT_EQ(got, want) << "n " << n << " seed " << seed << " epoch " << epoch;
      }
}

TEST(SampleOrderTest, DependsOnSeedAndEpochOnly) {
  const SampleOrder a(1000, 1, true), b(1000, 2, true);
  Tokens identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(epoch_order(a, 0), epoch_order(SampleOrder(1000, 1, true), 0));
  EXPECT_NE(epoch_order(a, 0), epoch_order(b, 0));
  EXPECT_NE(epoch_order(a, 0), epoch_order(a, 1));
  EXPECT_NE(epoch_order(a, 0), identity);
  EXPECT_EQ(epoch_order(SampleOrder(1000, 1, false), 3), identity);
}

TEST(SampleOrderTest, HugeAndInvalidCounts) {
  const int64_t n = (int64_t{1} << 40) + 3;
  const SampleOrder order(n, 9, true);
  for (int64_t p : {int64_t{0}, n - 1, n, 3 * n + 17}) EXPECT_TRUE(order(p) >= 0 && order(p) < n);
  EXPECT_THROW(SampleOrder(0, 1, true), DataError);
  EXPECT_THROW(SampleOrder(-5, 1, false), DataError);
}

// ---- DataLoader ---------------------------------------------------------------------------

std::shared_ptr<const TokenDataset> counting_dataset(int64_t n_tokens, int64_t T) {
  Tokens tokens(static_cast<size_t>(n_tokens));
  std::iota(tokens.begin(), tokens.end(), 0);
  std::vector<std::shared_ptr<const TokenSource>> sources = {
      std::make_shared<VectorSource>(std::move(tokens))};
  return std::make_shared<const TokenDataset>(std::move(sources), T, n_tokens);
}

TEST(DataLoaderTest, RanksTogetherEqualTheSingleRankBatch) {
  const int64_t T = 4;
  auto ds = counting_dataset(401, T);  // 100 samples: 16 steps of 8 cross an epoch boundary
  const DataLoader single(ds, 7, true, BatchLayout{2, 4, 1, 0});
  const DataLoader rank0(ds, 7, true, BatchLayout{2, 2, 2, 0});
  const DataLoader rank1(ds, 7, true, BatchLayout{2, 2, 2, 1});
  for (int64_t step = 0; step < 16; ++step) {
    std::vector<at::Tensor> want_x, want_y, got_x, got_y;
    for (int64_t m = 0; m < 4; ++m) {
      Batch b = single.get(step, m);
      want_x.push_back(b.inputs);
      want_y.push_back(b.targets);
    }
    for (const DataLoader* rank : {&rank0, &rank1})  // rank-major, then micro-batch order
      for (int64_t m = 0; m < 2; ++m) {
        Batch b = rank->get(step, m);
        ASSERT_EQ(b.inputs.sizes(), at::IntArrayRef({2, T}));
        ASSERT_EQ(b.targets.scalar_type(), at::kLong);
        ASSERT_TRUE(b.inputs.device().is_cpu());
        got_x.push_back(b.inputs);
        got_y.push_back(b.targets);
      }
    EXPECT_TRUE(at::equal(at::cat(got_x), at::cat(want_x))) << "step " << step;
    EXPECT_TRUE(at::equal(at::cat(got_y), at::cat(want_y))) << "step " << step;
    EXPECT_TRUE(at::equal(at::cat(got_y).narrow(1, 0, T - 1), at::cat(got_x).narrow(1, 1, T - 1)));
  }
  EXPECT_EQ(rank1.position(3, 1, 1), 3 * 8 + 4 + 2 + 1);
}

// The prefetcher hands out exactly DataLoader::get()'s batches: in order, after a jump (a resume
// starts elsewhere), and nothing past the last step.
// Skipped windows (a spike rollback's): the k-th consumed sequence is the stream's k-th position
// outside them, so a loader that skips [8, 12) reads what a loader without it reads, minus those.
TEST(DataLoaderTest, SkippedWindowsAreNeverRead) {
  auto ds = counting_dataset(401, 4);
  const DataLoader plain(ds, 7, true, BatchLayout{2, 2, 1, 0});  // 4 sequences a step
  DataLoader skipping(ds, 7, true, BatchLayout{2, 2, 1, 0});
  skipping.skip({{8, 12}, {20, 22}});
  EXPECT_EQ(skipping.past_skipped(7), 7);
  EXPECT_EQ(skipping.past_skipped(8), 12);
  EXPECT_EQ(skipping.past_skipped(15), 19);
  EXPECT_EQ(skipping.past_skipped(16), 22);
  // step 2 of the skipping loader reads positions 12-15: step 3 of the plain one
  for (int64_t m = 0; m < 2; ++m) EXPECT_TRUE(at::equal(skipping.get(2, m).inputs, plain.get(3, m).inputs));
  EXPECT_EQ(skipping.samples_before(3), 12);  // consumed sequences, not positions
  // the positions of consumed [6, 18): 6-7, then 12-19, then 22-23
  EXPECT_EQ(skipping.stream_ranges(6, 18), (std::vector<std::pair<int64_t, int64_t>>{{6, 8}, {12, 20}, {22, 24}}));
  EXPECT_EQ(skipping.with_skipped({{12, 20}, {30, 31}}),
            (std::vector<std::pair<int64_t, int64_t>>{{8, 22}, {30, 31}}));  // touching windows joined
  DataLoader bad(ds, 7, true, BatchLayout{2, 2, 1, 0});
  EXPECT_THROW(bad.skip({{4, 8}, {6, 10}}), DataError);  // overlapping
  EXPECT_THROW(bad.skip({{5, 5}}), DataError);           // empty
}

TEST(DataLoaderTest, PrefetcherGivesTheLoadersBatches) {
  auto ds = counting_dataset(401, 4);
  const DataLoader loader(ds, 7, true, BatchLayout{2, 3, 1, 0});
  BatchPrefetcher prefetch(loader, 3, /*pinned=*/false, /*last_step=*/12);
  for (int64_t step : {0, 1, 2, 3, 7, 8, 11, 5}) {
    const std::vector<Batch> got = prefetch.take(step);
    ASSERT_EQ(got.size(), 3u);
    for (int64_t m = 0; m < 3; ++m) {
      const Batch want = loader.get(step, m);
      EXPECT_TRUE(at::equal(got[static_cast<size_t>(m)].inputs, want.inputs)) << step << " " << m;
      EXPECT_TRUE(at::equal(got[static_cast<size_t>(m)].targets, want.targets)) << step << " " << m;
    }
  }
}

TEST(DataLoaderTest, RejectsBadLayouts) {
  auto ds = counting_dataset(101, 4);
  for (BatchLayout bad : {BatchLayout{0, 1, 1, 0}, BatchLayout{1, 0, 1, 0}, BatchLayout{1, 1, 0, 0},
                          BatchLayout{1, 1, 2, 2}, BatchLayout{1, 1, 2, -1}})
    EXPECT_THROW(DataLoader(ds, 1, true, bad), ConfigError);
}

// ---- SyntheticCorpus ----------------------------------------------------------------------

TEST(SyntheticTest, DeterministicAndInTheAlphabet) {
  const SyntheticCorpus a(5000, 512, 3);
  EXPECT_EQ(read_all(a), read_all(SyntheticCorpus(5000, 512, 3)));
  EXPECT_NE(read_all(a), read_all(SyntheticCorpus(5000, 512, 4)));
  EXPECT_EQ(a.name(), "synthetic");
  EXPECT_EQ(a.size(), 5000);
  for (int64_t vocab : {50, 50257}) {
    const SyntheticCorpus c(20000, vocab, 1);
    EXPECT_EQ(c.alphabet(), std::min<int64_t>(vocab, 256));
    for (int64_t t : read_all(c)) ASSERT_TRUE(t >= 0 && t < c.alphabet()) << t;
  }
  EXPECT_THROW(SyntheticCorpus(1, 512), ConfigError);
  EXPECT_THROW(SyntheticCorpus(100, 0), ConfigError);
}

TEST(SyntheticTest, SuccessorCarriesNinetyPercent) {
  const SyntheticCorpus corpus(200000, 512);
  const Tokens tokens = read_all(corpus);
  std::vector<std::vector<int64_t>> counts(256, std::vector<int64_t>(256, 0));
  for (size_t i = 1; i < tokens.size(); ++i) ++counts[tokens[i - 1]][tokens[i]];
  int64_t top = 0;
  for (const auto& row : counts) top += *std::max_element(row.begin(), row.end());
  EXPECT_NEAR(static_cast<double>(top) / static_cast<double>(tokens.size() - 1), 0.9, 0.03);
  // -p ln p - 255 q ln q with q = 0.1/256, p = 0.9 + q.
  EXPECT_NEAR(corpus.entropy_per_token(), 0.8762, 0.0001);
}

// ---- prep ---------------------------------------------------------------------------------

PrepConfig prep_config(std::vector<std::string> inputs, std::string out_dir, int64_t shard_tokens, int64_t val_tokens) {
  PrepConfig cfg;
  cfg.inputs = std::move(inputs);
  cfg.out_dir = std::move(out_dir);
  cfg.shard_tokens = shard_tokens;
  cfg.val_tokens = val_tokens;
  return cfg;
}

TEST(PrepTest, TokenizeBytes) {
  EXPECT_EQ(tokenize_bytes("ab"), (std::vector<int32_t>{256, 97, 98}));
  EXPECT_EQ(tokenize_bytes(std::string("\xff\0", 2)), (std::vector<int32_t>{256, 255, 0}));
  EXPECT_EQ(tokenize_bytes(""), (std::vector<int32_t>{kByteEot}));
}

TEST_F(DataTest, PrepWritesValThenTrainShards) {
  std::ofstream(path("one.txt")) << "hello";    // 6 tokens with EOT
  std::ofstream(path("two.txt")) << "world!!";  // 8 tokens
  PrepConfig cfg = prep_config({path("one.txt"), path("two.txt")}, path("out/nested"), 4, 3);
  const PrepResult result = run_prep(cfg);
  EXPECT_EQ(result.total_tokens, 14);
  const std::string out = cfg.out_dir + "/";
  EXPECT_EQ(result.files,
            (std::vector<std::string>{out + "val_000000.bin", out + "train_000000.bin",
                                      out + "train_000001.bin", out + "train_000002.bin"}));
  Tokens back;
  for (const auto& f : result.files) {
    const Tokens tokens = read_all(TokenFile(f, TokenFormat::Auto));
    back.insert(back.end(), tokens.begin(), tokens.end());
  }
  std::vector<int32_t> want = tokenize_bytes("hello"), two = tokenize_bytes("world!!");
  want.insert(want.end(), two.begin(), two.end());
  EXPECT_EQ(back, Tokens(want.begin(), want.end()));
  auto ds = TokenDataset::from_paths({out + "train_*.bin"}, TokenFormat::Auto, 2, kByteVocab);
  EXPECT_EQ(ds.num_tokens(), 11);
  // The byte-level tokenizer beside the shards, where kiln train finds it (data/hf_tokenizer.h).
  EXPECT_EQ(result.tokenizer_file, out + "tokenizer.json");
  EXPECT_EQ(result.tokenizer, "byte");
  EXPECT_EQ(result.vocab_size, kByteVocab);
  EXPECT_EQ(load_tokenizer(result.tokenizer_file)->name(), "byte");

  for (const auto& e : fs::directory_iterator(cfg.out_dir))  // the staging directory is gone
    EXPECT_EQ(e.path().filename().string().rfind(".prep-staging", 0), std::string::npos) << e.path();

  cfg.val_tokens = 0;
  cfg.out_dir = path("noval");
  EXPECT_EQ(run_prep(cfg).files.size(), 4u);  // 14 tokens in shards of 4
  EXPECT_FALSE(fs::exists(path("noval/val_000000.bin")));
  // A second run into a directory that already holds shards is refused, nothing overwritten.
  expect_data_error([&] { run_prep(cfg); }, {"already holds shards"});
}

// kiln prep --input DIR: the pattern of what the folder holds, and what that is (issue 48: it
// suggested '*.txt' for a folder of .jsonl files under folders, and for an empty one).
TEST_F(DataTest, PrepInputDirectorySuggestsWhatItHolds) {
  const auto said = [&](const std::string& dir) -> std::string {
    try {
      kiln::expand_paths({path(dir)}, "--input");
    } catch (const DataError& e) {
      return e.what();
    }
    return "";
  };
  fs::create_directories(path("flat"));
  for (const char* f : {"a.jsonl", "b.jsonl", "README.txt", "LICENSE"}) std::ofstream(path(std::string("flat/") + f)) << "{}";
  std::ofstream(path("flat/.DS_Store")) << "x";  // hidden: not counted
  EXPECT_EQ(said("flat"), "--input " + path("flat") + " is a directory; pass the files in it, e.g. --input '" + path("flat") +
                              "/*.jsonl' (quoted, so the shell leaves the pattern to kiln; it holds 2 .jsonl, 1 without an "
                              "extension, 1 .txt file(s))");
  fs::create_directories(path("nested/train"));
  fs::create_directories(path("nested/test"));
  for (const char* f : {"train/0.jsonl", "train/1.jsonl", "test/0.jsonl"}) std::ofstream(path(std::string("nested/") + f)) << "{}";
  EXPECT_EQ(said("nested"), "--input " + path("nested") + " is a directory; pass the files in it, e.g. --input '" + path("nested") +
                                "/*/*.jsonl' (quoted, so the shell leaves the pattern to kiln; it holds no files but folders, "
                                "which hold 3 .jsonl file(s))");
  fs::create_directories(path("empty"));
  EXPECT_EQ(said("empty"), "--input " + path("empty") + " is a directory; it is empty: there is nothing in it to prepare");
}

TEST_F(DataTest, PrepRejectsBadSettings) {
  std::ofstream(path("one.txt")) << "hi";
  EXPECT_THROW(run_prep(prep_config({}, path("out"), 10, 0)), ConfigError);
  EXPECT_THROW(run_prep(prep_config({path("one.txt")}, path("out"), 0, 0)), ConfigError);
  EXPECT_THROW(run_prep(prep_config({path("one.txt")}, path("out"), 10, -1)), ConfigError);
  // All 3 tokens would go to validation, none left to train on.
  expect_data_error([&] { run_prep(prep_config({path("one.txt")}, path("out"), 10, 3)); },
                    {"no training tokens"});
  expect_data_error(
      [&] { run_prep(prep_config({path("one.txt"), path("missing.txt")}, path("out"), 10, 0)); },
      {"--input: no file matches '" + path("missing.txt") + "'"});  // inputs are expanded like --data's
  // A BPE tokenizer: a file or vocab + merges, not both; the pair together; files that exist.
  PrepConfig bpe = prep_config({path("one.txt")}, path("out"), 10, 0);
  bpe.vocab = path("one.txt");
  EXPECT_THROW(run_prep(bpe), ConfigError);  // --vocab without --merges
  bpe.merges = path("one.txt");
  bpe.tokenizer = path("one.txt");
  EXPECT_THROW(run_prep(bpe), ConfigError);  // both ways at once
  bpe.vocab = bpe.merges = "";
  bpe.tokenizer = path("missing.json");
  EXPECT_THROW(run_prep(bpe), ConfigError);
  EXPECT_FALSE(fs::exists(path("out")));
}

}  // namespace
}  // namespace kiln
