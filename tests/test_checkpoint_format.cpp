// tests/test_checkpoint_format.cpp -- the checkpoint file formats: safetensors (round trips, the
// exact bytes of a small file, every kind of corruption refused with its message), CRC-32, and the
// kiln <-> GPT2LMHeadModel weight mapping. Loading by transformers itself is tests/hf/.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "distributed/error.h"
#include "models/gpt.h"
#include "runtime/checkpoint/hf_gpt2.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/observe/tensorboard.h"

using kiln::GPT;
using kiln::GPTConfig;

namespace {

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/kiln-fmt.XXXXXX";
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i));
  return s;
}

// A safetensors file from a header text and a data buffer, both as given (no checks, no padding).
std::string raw_file(const std::string& header, const std::string& data) { return le64(header.size()) + header + data; }

// The DataError message load_safetensors raises for `bytes` ("" when it does not throw).
std::string load_error(const TempDir& dir, const std::string& bytes) {
  const std::string path = dir.file("bad.safetensors");
  write_bytes(path, bytes);
  try {
    kiln::load_safetensors(path);
  } catch (const kiln::DataError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

GPTConfig small_config(int64_t kv_heads = 4) {
  GPTConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = kv_heads;
  c.d_model = 32;
  c.seq_len = 16;
  c.vocab_size = 100;  // padded to 128: exercises the padding rows
  return c;
}

std::map<std::string, at::Tensor> as_map(const kiln::NamedTensors& t) { return {t.begin(), t.end()}; }

// Every parameter (and the padding rows of wte) as one vector, for bit-exact comparisons.
at::Tensor flat_params(const GPT& m) {
  std::vector<at::Tensor> parts;
  for (const auto& p : m.parameters()) parts.push_back(p.detach().reshape(-1));
  return at::cat(parts);
}

std::string config_error(GPT& model, const std::map<std::string, at::Tensor>& tensors) {
  try {
    kiln::load_hf_gpt2(model, tensors);
  } catch (const kiln::ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// ---- safetensors ---------------------------------------------------------------------------

TEST(Safetensors, RoundTripEveryDtypeAndMetadata) {
  TempDir dir;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  auto f32 = at::randn({3, 5}, gen);
  kiln::NamedTensors in = {
      {"f32", f32},
      {"bf16", at::randn({4, 3}, gen).to(at::kBFloat16)},
      {"f16", at::randn({7}, gen).to(at::kHalf)},
      {"f64", at::randn({2, 2, 2}, gen).to(at::kDouble)},
      {"i64", at::randint(-(int64_t{1} << 40), int64_t{1} << 40, {5}, gen, at::kLong)},
      {"i32", at::randint(-1000, 1000, {6}, gen, at::kInt)},
      {"u8", at::randint(0, 256, {9}, gen, at::kByte)},
      {"bool", at::randint(0, 2, {3}, gen, at::kLong).to(at::kBool)},
      {"scalar", at::scalar_tensor(3.5)},                 // shape []
      {"empty", at::empty({0, 4})},                       // zero bytes
      {"strided", f32.t()},                               // not contiguous: written as its values
  };
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"step", "42"}};
  kiln::save_safetensors(dir.file("a.safetensors"), in, meta);
  auto out = kiln::load_safetensors(dir.file("a.safetensors"));
  EXPECT_EQ(out.metadata, meta);
  ASSERT_EQ(out.tensors.size(), in.size());
  for (const auto& [name, t] : in) {
    const at::Tensor& got = out.tensors.at(name);
    EXPECT_EQ(got.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(got.sizes(), t.sizes()) << name;
    EXPECT_TRUE(got.is_contiguous()) << name;
    EXPECT_TRUE(at::equal(got, t)) << name;  // bit-exact: the same bytes
  }
  // Written aligned: with larger elements first, every tensor starts at a multiple of its size.
  const std::string bytes = read_bytes(dir.file("a.safetensors"));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  auto header = nlohmann::json::parse(bytes.substr(8, n));
  for (const auto& [name, t] : in) {
    EXPECT_EQ(header[name]["data_offsets"][0].get<uint64_t>() % t.element_size(), 0u) << name;
  }
  // No metadata: no "__metadata__" key, and an empty map back.
  kiln::save_safetensors(dir.file("b.safetensors"), {{"x", f32}});
  EXPECT_TRUE(kiln::load_safetensors(dir.file("b.safetensors")).metadata.empty());
  EXPECT_FALSE(contains(read_bytes(dir.file("b.safetensors")), "__metadata__"));
}

// The whole file, byte by byte. These are also the bytes Python safetensors 0.8.0 writes for
// save_file({"b": torch.tensor([1., -2.]), "a": torch.tensor([1, 2, 3], dtype=torch.uint8)},
// metadata={"format": "pt"}) (checked once by hand).
TEST(Safetensors, ExactBytesOfATinyFile) {
  TempDir dir;
  const std::string path = dir.file("tiny.safetensors");
  kiln::save_safetensors(path,
                         {{"a", at::tensor({1, 2, 3}, at::kByte)}, {"b", at::tensor({1.0f, -2.0f})}},
                         {{"format", "pt"}});
  const std::string header =
      R"({"__metadata__":{"format":"pt"},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"U8","shape":[3],"data_offsets":[8,11]}})"
      "      ";  // 138 bytes of JSON padded with spaces to 144, a multiple of 8
  ASSERT_EQ(header.size(), 144u);
  const std::string expected = std::string("\x90\0\0\0\0\0\0\0", 8) + header +
                               std::string("\x00\x00\x80\x3f"   // 1.0f, little-endian
                                           "\x00\x00\x00\xc0"   // -2.0f
                                           "\x01\x02\x03",      // u8
                                           11);
  EXPECT_EQ(read_bytes(path), expected);
}

TEST(Safetensors, WriterRefusesWhatTheFormatCannotSay) {
  TempDir dir;
  const auto t = at::zeros({2});
  EXPECT_THROW(kiln::save_safetensors(dir.file("x"), {{"a", t}, {"a", t}}), kiln::Error);
  EXPECT_THROW(kiln::save_safetensors(dir.file("x"), {{"__metadata__", t}}), kiln::Error);
  EXPECT_THROW(kiln::save_safetensors(dir.file("x"), {{"c", at::zeros({2}, at::kComplexFloat)}}), kiln::Error);
  try {
    kiln::save_safetensors(dir.file("no/such/dir/x.safetensors"), {{"a", t}});
    FAIL() << "no error";
  } catch (const kiln::Error& e) {
    EXPECT_TRUE(contains(e.what(), dir.file("no/such/dir/x.safetensors"))) << e.what();
    EXPECT_TRUE(contains(e.what(), "No such file or directory")) << e.what();
  }
  // A full disk: /dev/full takes the open and fails every write with ENOSPC.
  if (::access("/dev/full", W_OK) == 0) {
    try {
      kiln::save_safetensors("/dev/full", {{"a", t}});
      FAIL() << "no error";
    } catch (const kiln::Error& e) {
      EXPECT_EQ(std::string(e.what()), "cannot write /dev/full: No space left on device");
    }
  }
}

TEST(Safetensors, CorruptionIsRefusedWithItsMessage) {
  TempDir dir;
  const std::string good_path = dir.file("good.safetensors");
  kiln::save_safetensors(good_path, {{"w", at::arange(6, at::kFloat).reshape({2, 3})}}, {{"format", "pt"}});
  const std::string good = read_bytes(good_path);
  ASSERT_TRUE(kiln::load_safetensors(good_path).tensors.count("w"));
  uint64_t good_n = 0;  // the good file's header length
  for (int i = 0; i < 8; ++i) good_n |= static_cast<uint64_t>(static_cast<unsigned char>(good[i])) << (8 * i);
  const std::string data8(8, '\0'), data12(12, '\0');
  const std::string path_prefix = dir.file("bad.safetensors") + ": ";

  struct Case {
    const char* what;
    std::string bytes, message;
  };
  const std::vector<Case> cases = {
      {"empty file", "", "file is 0 bytes, too short for a safetensors file"},
      {"shorter than the length", good.substr(0, 5), "file is 5 bytes, too short"},
      {"truncated in the header", good.substr(0, 40),
       "header length " + std::to_string(good_n) + " is beyond the end of the file (40 bytes"},
      {"truncated in the data", good.substr(0, good.size() - 3),
       "tensor 'w' has data_offsets [0, 24] outside the data buffer (21 bytes)"},
      {"header length too large", le64(uint64_t{1} << 40) + good.substr(8),
       "header length 1099511627776 is beyond the end of the file"},
      {"header not JSON", raw_file(R"({"w":{"dtype":"F32",)", data8), "header is not JSON"},
      {"header JSON but not an object", raw_file("[1, 2]", ""), "header is JSON but not an object"},
      {"entry without dtype", raw_file(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", data8),
       "tensor 'w' has no \"dtype\""},
      {"entry without shape", raw_file(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", data8),
       "tensor 'w' has no \"shape\""},
      {"entry without offsets", raw_file(R"({"w":{"dtype":"F32","shape":[2]}})", data8),
       "tensor 'w' has no \"data_offsets\""},
      {"unsupported dtype", raw_file(R"({"w":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})", data8),
       "tensor 'w' has unsupported dtype 'C64' (supported: F64 F32"},
      {"negative dimension", raw_file(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data8),
       "tensor 'w' has a \"shape\" entry that is not a non-negative integer: -2"},
      {"offsets not a pair", raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", data8),
       "tensor 'w' has \"data_offsets\" [0], not [begin, end]"},
      {"offsets reversed", raw_file(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", data8),
       "tensor 'w' has data_offsets [8, 0] that end before they begin"},
      {"offsets out of range", raw_file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data8),
       "tensor 'w' has data_offsets [0, 16] outside the data buffer (8 bytes)"},
      {"offsets not matching the shape", raw_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data8),
       "tensor 'w' has data_offsets [0, 8] holding 8 bytes, but shape [3] of F32 needs 12"},
      {"shape overflowing 64 bits",
       raw_file(R"({"w":{"dtype":"F32","shape":[4611686018427387904, 8],"data_offsets":[0,8]}})", data8),
       "tensor 'w' has a shape [4611686018427387904, 8] too large to address"},
      {"overlapping",
       raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                data12),
       "tensors 'a' [0, 8] and 'b' [4, 12] overlap"},
      {"gap",
       raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                data12),
       "gap of 4 bytes before tensor 'b' [8, 12]"},
      {"trailing bytes", raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data12),
       "4 bytes at the end of the data buffer belong to no tensor"},
      {"metadata not strings", raw_file(R"({"__metadata__":{"step":3}})", ""),
       "\"__metadata__\" value of 'step' is not a string"},
  };
  for (const auto& c : cases) {
    const std::string msg = load_error(dir, c.bytes);
    EXPECT_TRUE(contains(msg, path_prefix + c.message)) << c.what << ": got \"" << msg << "\"";
  }
  // Offsets may come in any order, and a file need not be padded: valid, and read as written.
  auto out_of_order = raw_file(
      R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})",
      std::string("\x00\x00\x80\x3f\x07\x09", 6));
  EXPECT_EQ(load_error(dir, out_of_order), "");
  auto file = kiln::load_safetensors(dir.file("bad.safetensors"));
  EXPECT_EQ(file.tensors.at("b").item<float>(), 1.0f);
  EXPECT_EQ(file.tensors.at("a")[1].item<uint8_t>(), 9);
  // A file that is not there.
  try {
    kiln::load_safetensors(dir.file("missing.safetensors"));
    FAIL() << "no error";
  } catch (const kiln::DataError& e) {
    EXPECT_EQ(std::string(e.what()), dir.file("missing.safetensors") + ": cannot open: No such file or directory");
  }
}

// ---- CRC-32 --------------------------------------------------------------------------------

namespace {
// The definition, one bit at a time (reflected polynomial 0xEDB88320).
uint32_t crc32_bitwise(const std::string& s) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
  }
  return ~c;
}
}  // namespace

TEST(Crc32, KnownValuesAndTheDefinition) {
  EXPECT_EQ(kiln::crc32_update(0, "123456789", 9), 0xCBF43926u);  // the CRC-32 check value
  EXPECT_EQ(kiln::crc32_update(0, "", 0), 0u);
  EXPECT_EQ(kiln::crc32_update(0, "The quick brown fox jumps over the lazy dog", 43), 0x414FA339u);
  // Slicing-by-8 against the bitwise definition, at every length around the 8-byte steps, and
  // chained over two pieces at every split.
  std::mt19937 rng(3);
  std::string s(70, '\0');
  for (auto& ch : s) ch = static_cast<char>(rng());
  for (size_t n = 0; n <= s.size(); ++n) {
    const std::string p = s.substr(0, n);
    ASSERT_EQ(kiln::crc32_update(0, p.data(), p.size()), crc32_bitwise(p)) << n;
    const size_t k = n / 3;
    ASSERT_EQ(kiln::crc32_update(kiln::crc32_update(0, p.data(), k), p.data() + k, n - k), crc32_bitwise(p)) << n;
  }
}

// CRC-32C (Castagnoli), TensorBoard's record checksum (runtime/observe/tensorboard.h): the standard check
// value of "123456789" (0xE3069283) and of nothing (0).
TEST(Crc32c, CheckValues) {
  EXPECT_EQ(kiln::crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(kiln::crc32c("", 0), 0u);
}

TEST(Crc32, WholeFiles) {
  TempDir dir;
  write_bytes(dir.file("check"), "123456789");
  EXPECT_EQ(kiln::crc32_file(dir.file("check")), 0xCBF43926u);
  // Larger than the 1 MiB read buffer, so it is read in pieces; one flipped bit changes the CRC.
  std::string big(3u << 20 | 5, '\0');
  std::mt19937 rng(5);
  for (auto& ch : big) ch = static_cast<char>(rng());
  write_bytes(dir.file("big"), big);
  const uint32_t crc = kiln::crc32_file(dir.file("big"));
  EXPECT_EQ(crc, kiln::crc32_update(0, big.data(), big.size()));
  big[2u << 20] ^= 0x10;
  write_bytes(dir.file("big"), big);
  EXPECT_NE(kiln::crc32_file(dir.file("big")), crc);
  EXPECT_THROW(kiln::crc32_file(dir.file("missing")), kiln::DataError);
}

// ---- kiln <-> GPT2LMHeadModel --------------------------------------------------------------

TEST(HfGpt2, NamesShapesAndLayout) {
  GPT model(small_config());
  model.init_weights(1);
  auto hf = kiln::to_hf_gpt2(model);
  ASSERT_EQ(hf.size(), 2u + 12u * 2u + 2u);  // wte, wpe; 12 per block; ln_f
  const std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"transformer.wte.weight", {100, 32}},  // real vocabulary rows only
      {"transformer.wpe.weight", {16, 32}},
      {"transformer.h.0.ln_1.weight", {32}},
      {"transformer.h.0.ln_1.bias", {32}},
      {"transformer.h.0.attn.c_attn.weight", {32, 96}},  // Conv1D [in, out]
      {"transformer.h.0.attn.c_attn.bias", {96}},
      {"transformer.h.0.attn.c_proj.weight", {32, 32}},
      {"transformer.h.0.attn.c_proj.bias", {32}},
      {"transformer.h.0.ln_2.weight", {32}},
      {"transformer.h.0.ln_2.bias", {32}},
      {"transformer.h.0.mlp.c_fc.weight", {32, 128}},
      {"transformer.h.0.mlp.c_fc.bias", {128}},
      {"transformer.h.0.mlp.c_proj.weight", {128, 32}},
      {"transformer.h.0.mlp.c_proj.bias", {32}},
  };
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(hf[i].first, expected[i].first);
    EXPECT_EQ(hf[i].second.sizes(), at::IntArrayRef(expected[i].second)) << expected[i].first;
  }
  EXPECT_EQ(hf.back().first, "transformer.ln_f.bias");
  auto m = as_map(hf);
  EXPECT_FALSE(m.count("lm_head.weight"));  // tied: transformers re-ties it
  for (const auto& [name, t] : hf) {
    EXPECT_EQ(t.scalar_type(), at::kFloat) << name;
    EXPECT_TRUE(t.is_contiguous()) << name;
  }
  // The values: transposed Linear weights, the first vocab rows, copies (never aliases).
  auto* block = model.h[1]->as<kiln::BlockImpl>();
  EXPECT_TRUE(at::equal(m.at("transformer.h.1.attn.c_attn.weight"), block->attn->c_attn->weight.t()));
  EXPECT_TRUE(at::equal(m.at("transformer.h.1.mlp.c_proj.weight"), block->mlp->c_proj->weight.t()));
  EXPECT_TRUE(at::equal(m.at("transformer.h.1.ln_2.bias"), block->ln_2->bias));
  EXPECT_TRUE(at::equal(m.at("transformer.wte.weight"), model.wte.narrow(0, 0, 100)));
  EXPECT_NE(m.at("transformer.wpe.weight").data_ptr(), model.wpe.data_ptr());
  // From a map of kiln parameters: the same tensors.
  std::map<std::string, at::Tensor> params;
  for (const auto& p : model.named_parameters()) params[p.key()] = p.value();
  auto from_map = kiln::to_hf_gpt2(model.config(), params);
  ASSERT_EQ(from_map.size(), hf.size());
  for (size_t i = 0; i < hf.size(); ++i) {
    EXPECT_EQ(from_map[i].first, hf[i].first);
    EXPECT_TRUE(at::equal(from_map[i].second, hf[i].second)) << hf[i].first;
  }
  params.erase("h.1.ln_1.bias");
  EXPECT_THROW(kiln::to_hf_gpt2(model.config(), params), kiln::ConfigError);
}

TEST(HfGpt2, RoundTripThroughAFileIsBitExact) {
  TempDir dir;
  for (int64_t kv : {4, 2}) {  // multi-head, and grouped-query (same names, narrower c_attn)
    GPT a(small_config(kv));
    a.init_weights(11);
    {
      at::NoGradGuard g;
      a.wte.narrow(0, 100, 28).zero_();  // kiln's convention: padding rows zero
    }
    kiln::save_safetensors(dir.file("m.safetensors"), kiln::to_hf_gpt2(a), kiln::hf_safetensors_metadata());
    auto file = kiln::load_safetensors(dir.file("m.safetensors"));
    EXPECT_EQ(file.metadata.at("format"), "pt");
    GPT b(small_config(kv));
    b.init_weights(12);  // different weights
    {
      at::NoGradGuard g;
      b.wte.narrow(0, 100, 28).fill_(1.0f);  // and padding rows that loading must clear
    }
    ASSERT_FALSE(at::equal(flat_params(a), flat_params(b)));
    kiln::load_hf_gpt2(b, file.tensors);
    EXPECT_TRUE(at::equal(flat_params(a), flat_params(b))) << "kv " << kv;
    auto idx = at::randint(0, 100, {2, 16}, at::kLong), tgt = at::randint(0, 100, {2, 16}, at::kLong);
    EXPECT_EQ(a.loss(idx, tgt).item<float>(), b.loss(idx, tgt).item<float>());
  }
}

TEST(HfGpt2, LoadingSetsPaddingRowsToZero) {
  GPT a(small_config()), b(small_config());
  a.init_weights(1);
  b.init_weights(2);
  {
    at::NoGradGuard g;
    b.wte.narrow(0, 100, 28).fill_(1.0f);
  }
  kiln::load_hf_gpt2(b, as_map(kiln::to_hf_gpt2(a)));
  EXPECT_TRUE(at::equal(b.wte.narrow(0, 100, 28), at::zeros({28, 32})));
  EXPECT_TRUE(at::equal(b.wte.narrow(0, 0, 100), a.wte.narrow(0, 0, 100)));
}

TEST(HfGpt2, MissingExtraAndMisshapenTensorsAreRefused) {
  GPT src(small_config());
  src.init_weights(1);
  const auto good = as_map(kiln::to_hf_gpt2(src));
  GPT model(small_config());
  model.init_weights(2);
  const at::Tensor before = flat_params(model).clone();

  auto missing = good;
  missing.erase("transformer.h.1.mlp.c_fc.bias");
  missing.erase("transformer.ln_f.weight");
  EXPECT_EQ(config_error(model, missing),
            "checkpoint has no tensor 'transformer.h.1.mlp.c_fc.bias' (and 1 more)");

  auto misshapen = good;
  misshapen["transformer.h.1.mlp.c_fc.weight"] = at::zeros({32, 100});
  EXPECT_EQ(config_error(model, misshapen),
            "checkpoint tensor 'transformer.h.1.mlp.c_fc.weight' has shape [32, 100], this model expects [32, 128]");
  // Kiln's own [out, in] layout is not HF's: refused, not silently transposed.
  auto untransposed = good;
  untransposed["transformer.h.0.mlp.c_fc.weight"] = src.h[0]->as<kiln::BlockImpl>()->mlp->c_fc->weight.detach();
  EXPECT_EQ(config_error(model, untransposed),
            "checkpoint tensor 'transformer.h.0.mlp.c_fc.weight' has shape [128, 32], this model expects [32, 128]");
  // The padded vocabulary is not the HF vocabulary.
  auto padded = good;
  padded["transformer.wte.weight"] = src.wte.detach();
  EXPECT_EQ(config_error(model, padded),
            "checkpoint tensor 'transformer.wte.weight' has shape [128, 32], this model expects [100, 32]");

  auto extra = good;
  extra["transformer.h.2.ln_1.weight"] = at::ones({32});
  EXPECT_EQ(config_error(model, extra),
            "checkpoint has tensor 'transformer.h.2.ln_1.weight' that this model does not have (2 layers); "
            "is it from another model?");

  auto integer = good;
  integer["transformer.ln_f.bias"] = at::zeros({32}, at::kLong);
  EXPECT_TRUE(contains(config_error(model, integer), "not a floating-point type"));

  auto untied = good;
  untied["lm_head.weight"] = good.at("transformer.wte.weight") + 1;
  EXPECT_TRUE(contains(config_error(model, untied), "'lm_head.weight' differs from 'transformer.wte.weight'"));

  // Every refusal left the model as it was.
  EXPECT_TRUE(at::equal(flat_params(model), before));
}

TEST(HfGpt2, AcceptsTiedLmHeadUnprefixedNamesAndOldMaskBuffers) {
  GPT src(small_config());
  src.init_weights(1);
  auto good = as_map(kiln::to_hf_gpt2(src));
  // A tied lm_head.weight written out (some exporters do): accepted.
  auto tied = good;
  tied["lm_head.weight"] = good.at("transformer.wte.weight").clone();
  GPT a(small_config());
  kiln::load_hf_gpt2(a, tied);
  EXPECT_TRUE(at::equal(a.wte.narrow(0, 0, 100), src.wte.narrow(0, 0, 100)));
  // GPT2Model names without "transformer.", with the causal-mask buffers of old GPT-2 files.
  std::map<std::string, at::Tensor> bare;
  for (const auto& [name, t] : good) bare[name.substr(std::strlen("transformer."))] = t;
  bare["h.0.attn.bias"] = at::ones({1, 1, 16, 16});
  bare["h.1.attn.masked_bias"] = at::scalar_tensor(-1e4);
  GPT b(small_config());
  kiln::load_hf_gpt2(b, bare);
  EXPECT_TRUE(at::equal(flat_params(a), flat_params(b)));
}

TEST(HfGpt2, ConfigJson) {
  auto c = kiln::hf_gpt2_config(GPTConfig::preset("gpt2-124m"));
  EXPECT_EQ(c["model_type"], "gpt2");
  EXPECT_EQ(c["architectures"], nlohmann::json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(c["vocab_size"], 50257);  // the real vocabulary, not the padded 50304
  EXPECT_EQ(c["n_positions"], 1024);
  EXPECT_EQ(c["n_ctx"], 1024);
  EXPECT_EQ(c["n_embd"], 768);
  EXPECT_EQ(c["n_layer"], 12);
  EXPECT_EQ(c["n_head"], 12);
  EXPECT_EQ(c["n_inner"], 3072);
  EXPECT_EQ(c["activation_function"], "gelu_new");
  EXPECT_EQ(c["layer_norm_epsilon"], 1e-5);
  EXPECT_EQ(c["tie_word_embeddings"], true);
  EXPECT_EQ(c["bos_token_id"], 50256);
  EXPECT_EQ(c["eos_token_id"], 50256);
  EXPECT_EQ(c["torch_dtype"], "float32");
  EXPECT_EQ(c["resid_pdrop"], 0.0);
  EXPECT_TRUE(kiln::hf_gpt2_compatible(GPTConfig::preset("tiny")));
  EXPECT_FALSE(kiln::hf_gpt2_compatible(small_config(2)));
  try {
    kiln::hf_gpt2_config(small_config(2));
    FAIL() << "no error";
  } catch (const kiln::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "GPT2LMHeadModel has no grouped-query attention (n_kv_head 2 != n_head 4): no config.json for this model");
  }
}
