// tests/test_config.cpp -- flag and config-file parsing, validation messages, FLOPs, MFU peaks
// and the job's distinct devices (MFU's denominator); the start-up settings check across ranks
// and the replica check's hash and verdict, the loss-spike rule (runtime/trainer/config_agreement.h,
// replica_check.h, spike_guard.h).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <algorithm>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include "data/hf_tokenizer.h"
#include "data/tokenizer.h"
#include "distributed/device_peaks.h"
#include "distributed/error.h"
#include "distributed/job_devices.h"
#include "distributed/mesh.h"
#include "launch/cli.h"
#include "models/flops.h"
#include "runtime/trainer/config_agreement.h"
#include "runtime/trainer/replica_check.h"
#include "runtime/trainer/spike_guard.h"

using kiln::ConfigError;
using kiln::parse_train_args;
using kiln::bit_sum;
using kiln::compared_settings;
using kiln::replica_disagreements;
using kiln::SpikeGuard;

namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  auto path = std::filesystem::temp_directory_path() / ("kiln_test_config_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(path) << text;
  return path.string();
}

// The ConfigError message for these arguments ("" if they parse).
std::string error_of(const std::vector<std::string>& args) {
  try {
    parse_train_args(args);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The settings ranks compare: all but the outputs rank 0 alone writes, and the device by its kind
// (issue 48, item 2: a launcher's `--device cuda:$LOCAL_RANK` was refused as different settings).
TEST(ConfigAgreement, ComparesAllButRankZerosOutputsAndTheDeviceByKind) {
  const nlohmann::json c = {{"lr", 0.001}, {"log_json", "a.jsonl"}, {"tensorboard", "tb"}, {"pp_virtual", 2}, {"device", "cuda:0"}};
  EXPECT_EQ(compared_settings(c, "cuda"), (nlohmann::json{{"lr", 0.001}, {"pp_virtual", 2}, {"device", "cuda"}}));
  nlohmann::json other = c;
  other["device"] = "cuda:3";
  EXPECT_EQ(compared_settings(c, "cuda"), compared_settings(other, "cuda"));
  other["device"] = "auto";  // resolved to a GPU on that rank
  EXPECT_EQ(compared_settings(c, "cuda"), compared_settings(other, "cuda"));
  EXPECT_NE(compared_settings(c, "cuda"), compared_settings(other, "cpu"));  // a real mismatch
}

// The hash: the integer sum of the bit patterns; one flipped bit changes it by 2^k.
TEST(ReplicaCheck, BitSumSeesOneFlippedBit) {
  at::Tensor w = at::randn({64, 32});
  const int64_t before = bit_sum(w).item<int64_t>();
  EXPECT_EQ(before, w.view(at::kInt).to(at::kLong).sum().item<int64_t>());
  w.view({-1}).view(at::kInt).narrow(0, 100, 1).bitwise_xor_(1 << 3);
  EXPECT_EQ(std::llabs(bit_sum(w).item<int64_t>() - before), 8);
  const at::Tensor h = at::randn({16}).to(at::kBFloat16);
  EXPECT_EQ(bit_sum(h).item<int64_t>(), h.view(at::kShort).to(at::kLong).sum().item<int64_t>());
}

// The hash's memory: summed a chunk at a time, the int64 temporary is kBitSumChunk x 8 bytes, not
// 8 bytes an element of the tensor. Every CPU allocation made meanwhile is counted by an allocator
// put in front of LibTorch's for the call.
namespace {
struct CountingCpuAllocator final : c10::Allocator {
  struct Held {
    c10::DataPtr inner;
    size_t bytes;
    CountingCpuAllocator* owner;
  };
  explicit CountingCpuAllocator(c10::Allocator* in) : inner(in) {}
  c10::DataPtr allocate(size_t n) override {
    live += static_cast<int64_t>(n);
    peak = std::max(peak, live);
    auto* held = new Held{inner->allocate(n), n, this};
    void* data = held->inner.get();
    const c10::Device device = held->inner.device();
    return {data, held, &release, device};
  }
  static void release(void* ctx) {
    auto* held = static_cast<Held*>(ctx);
    held->owner->live -= static_cast<int64_t>(held->bytes);
    delete held;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
  c10::Allocator* inner;
  int64_t live = 0, peak = 0;
};
}  // namespace

TEST(ReplicaCheck, BitSumOfALargeTensorAllocatesAChunkNotACopy) {
  const int64_t n = 4 * kiln::kBitSumChunk + 12345;  // 16.8M fp32 elements: 134 MB as int64
  const at::Tensor w = at::randn({n});
  const int64_t expected = w.view(at::kInt).narrow(0, 0, n / 2).to(at::kLong).sum().item<int64_t>() +
                           w.view(at::kInt).narrow(0, n / 2, n - n / 2).to(at::kLong).sum().item<int64_t>();
  c10::Allocator* libtorch = c10::GetCPUAllocator();
  CountingCpuAllocator counting(libtorch);
  c10::SetCPUAllocator(&counting, /*priority=*/255);
  int64_t sum = 0;
  try {
    sum = bit_sum(w).item<int64_t>();
  } catch (...) {
    c10::SetCPUAllocator(libtorch, 255);
    throw;
  }
  c10::SetCPUAllocator(libtorch, 255);
  EXPECT_EQ(sum, expected);
  EXPECT_LE(counting.peak, kiln::kBitSumChunk * 8 + (int64_t{1} << 20)) << "bytes allocated at once while hashing " << n << " elements";
}

// The verdict: per tensor, the ranks outside the majority of its replicas (all of them without
// one); replicas are the ranks with the same key; agreeing lists give nothing.
TEST(ReplicaCheck, NamesTheRanksOutsideTheMajority) {
  auto row = [](const std::string& key, const std::string& a, const std::string& b) {
    return key + "|wte|" + a + "\n" + key + "|h.0.mlp.c_fc.weight|" + b + "\n";
  };
  EXPECT_TRUE(replica_disagreements({row("0/0", "1", "2"), row("0/0", "1", "2"), row("1/0", "7", "9")}).empty());
  const auto four = replica_disagreements({row("0/0", "1", "2"), row("0/0", "1", "3"), row("0/0", "1", "2"), row("0/0", "1", "2")});
  ASSERT_EQ(four.size(), 1u);
  EXPECT_EQ(four[0], "h.0.mlp.c_fc.weight differs on rank(s) 1 among its replicas (ranks 0, 1, 2, 3)");
  const auto two = replica_disagreements({row("0/0", "5", "2"), row("0/0", "6", "2")});
  ASSERT_EQ(two.size(), 1u);
  EXPECT_EQ(two[0], "wte differs on rank(s) 0, 1 among its replicas (ranks 0, 1)");
  // different keys never compare (pipeline stages, tp ranks, ep groups)
  EXPECT_TRUE(replica_disagreements({row("0/0", "1", "2"), row("0/1", "5", "6")}).empty());
}

// The spike rule: nothing judged before 10 losses; a loss above mean + Z std of the last 20 that
// were not spiking is a spiking step; P in a row roll back; a normal step in between resets; after a
// rollback the steps past the checkpoint are forgotten.
TEST(SpikeGuard, PatienceAndTheRunningLevel) {
  SpikeGuard g(3.0, 2, 20, 10);
  for (int64_t s = 1; s <= 9; ++s) EXPECT_FALSE(g.observe(s, s % 2 ? 2.0 : 2.2).spiking);  // too few to judge
  EXPECT_FALSE(g.observe(10, 2.0).spiking);
  SpikeGuard::Verdict v = g.observe(11, 9.0);  // mean (6 x 2.0 + 4 x 2.2) / 10 = 2.08
  EXPECT_TRUE(v.spiking);
  EXPECT_FALSE(v.roll_back);
  EXPECT_NEAR(v.mean, 2.08, 1e-12);
  EXPECT_FALSE(g.observe(12, 2.1).spiking);  // back to normal: the run of spiking steps resets
  EXPECT_TRUE(g.observe(13, 9.0).spiking);
  v = g.observe(14, 8.0);
  EXPECT_TRUE(v.roll_back);
  ASSERT_EQ(g.spike().size(), 2u);
  EXPECT_EQ(g.spike().front().first, 13);
  g.rewind(10);  // back to step 10's checkpoint: steps 11-14 forgotten
  EXPECT_TRUE(g.spike().empty());
  EXPECT_FALSE(g.observe(11, 2.1).spiking);
  EXPECT_FALSE(g.observe(12, std::nan("")).spiking);  // non-finite: the non-finite guard's
}

}  // namespace

TEST(Cli, DefaultsAndFlags) {
  auto cfg = parse_train_args({}).config;
  EXPECT_EQ(cfg.model, "tiny");
  EXPECT_EQ(cfg.gpt.n_layer, 4);
  cfg = parse_train_args({"--model", "gpt2-124m", "--n-layer", "2", "--micro-batch", "3", "--lr", "1e-4",
                          "--data", "a.bin,b*.bin"})
            .config;
  EXPECT_EQ(cfg.gpt.n_layer, 2);       // override of the preset
  EXPECT_EQ(cfg.gpt.d_model, 768);     // the rest of the preset
  EXPECT_EQ(cfg.micro_batch, 3);
  EXPECT_DOUBLE_EQ(cfg.lr, 1e-4);
  EXPECT_DOUBLE_EQ(cfg.resolved_min_lr(), 1e-5);
  EXPECT_EQ(cfg.data, (std::vector<std::string>{"a.bin", "b*.bin"}));
}

// The start-up line names the preset with what was changed in it (issue 48: `--model gpt2-124m
// --n-layer 4` was announced as gpt2-124m).
TEST(Cli, ModelDescriptionNamesTheChangedFields) {
  EXPECT_EQ(parse_train_args({"--model", "gpt2-124m"}).config.model_description(), "gpt2-124m");
  EXPECT_EQ(parse_train_args({"--model", "gpt2-124m", "--n-layer", "4"}).config.model_description(), "gpt2-124m (with n_layer 4)");
  EXPECT_EQ(parse_train_args({"--n-layer", "4"}).config.model_description(), "tiny");  // the preset's own value
  // --n-head carries n_kv_head with it: one change, not two; --n-kv-head given is its own.
  EXPECT_EQ(parse_train_args({"--n-head", "8", "--seq-len", "64", "--dropout", "0.1"}).config.model_description(),
            "tiny (with n_head 8, seq_len 64, dropout 0.1)");
  EXPECT_EQ(parse_train_args({"--n-kv-head", "2", "--norm", "rmsnorm"}).config.model_description(),
            "tiny (with n_kv_head 2, norm rmsnorm)");
}

// --vocab-size left out: the data's tokenizer's size where the preset's cannot hold its ids (issue
// 48: the default model refused BPE shards); given, it is kept, and a tokenizer too large for it
// is refused with one line.
TEST(Cli, VocabSizeFromTheDataTokenizerWhenNotGiven) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("kiln_test_config_vocab_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  nlohmann::json vocab = nlohmann::json::object();  // a byte-level BPE of 600 ids: 256 bytes, 343 merges' tokens, end-of-text
  for (int b = 0; b < 256; ++b) vocab[kiln::byte_char(static_cast<unsigned char>(b))] = b;
  for (int i = 256; i < 599; ++i) vocab["t" + std::to_string(i)] = i;
  const nlohmann::json tok = {{"version", "1.0"},
                              {"added_tokens", nlohmann::json::array({{{"id", 599}, {"content", "<|endoftext|>"}, {"special", true}}})},
                              {"pre_tokenizer", {{"type", "ByteLevel"}}},
                              {"decoder", {{"type", "ByteLevel"}}},
                              {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  std::ofstream(dir / "tokenizer.json") << tok.dump();
  std::ofstream(dir / "train_000000.bin") << "x";  // read by the trainer, not here
  const std::string data = (dir / "train_*.bin").string();
  auto cfg = parse_train_args({"--data", data}).config;
  EXPECT_EQ(cfg.gpt.vocab_size, 600);
  EXPECT_EQ(cfg.gpt.padded_vocab_size(), 640);
  EXPECT_EQ(cfg.vocab_from, (dir / "tokenizer.json").string());
  EXPECT_EQ(cfg.model_description(), "tiny (with vocab_size 600)");
  // A preset that holds it keeps its own; so does a --vocab-size given (flag or config key)...
  EXPECT_EQ(parse_train_args({"--data", data, "--model", "gpt2-124m"}).config.gpt.vocab_size, 50257);
  cfg = parse_train_args({"--data", data, "--vocab-size", "512"}).config;
  EXPECT_EQ(cfg.gpt.vocab_size, 512);
  EXPECT_TRUE(cfg.vocab_from.empty());
  // ... and is refused where it is too small, saying what to do.
  try {
    kiln::tokenizer_for_data("", {(dir / "train_000000.bin").string()}, 512);
    ADD_FAILURE() << "a tokenizer of 600 ids passed --vocab-size 512";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "has 600 ids: --vocab-size 512 cannot hold them (give --vocab-size 600 or more, or leave "
                                   "--vocab-size out to take the tokenizer's)")) << e.what();
  }
  // Data that is missing: left to the trainer to name.
  EXPECT_EQ(parse_train_args({"--data", (dir / "nothing_*.bin").string()}).config.gpt.vocab_size, 512);
  std::filesystem::remove_all(dir);
}

TEST(Cli, KvHeadsFollowHeadsUnlessGiven) {
  auto cfg = parse_train_args({"--n-head", "8", "--d-model", "256"}).config;
  EXPECT_EQ(cfg.gpt.n_kv_head, 8);
  cfg = parse_train_args({"--n-head", "8", "--n-kv-head", "2", "--d-model", "256"}).config;
  EXPECT_EQ(cfg.gpt.n_kv_head, 2);
}

TEST(Cli, ConfigFileThenFlags) {
  auto path = write_temp("ok.json", R"({"model": "gpt2-124m", "micro_batch": 2, "grad-accum": 4, "lr": 3, "data": ["x.bin"]})");
  auto cfg = parse_train_args({"--config", path, "--grad-accum", "8"}).config;
  EXPECT_EQ(cfg.gpt.d_model, 768);
  EXPECT_EQ(cfg.micro_batch, 2);
  EXPECT_EQ(cfg.grad_accum, 8);  // the flag wins over the file
  EXPECT_DOUBLE_EQ(cfg.lr, 3.0);  // an integer is a valid number
  EXPECT_EQ(cfg.data, std::vector<std::string>{"x.bin"});
  std::remove(path.c_str());
}

TEST(Cli, BadInputIsOneClearMessage) {
  EXPECT_TRUE(contains(error_of({"--bogus", "1"}), "unknown flag '--bogus'"));
  EXPECT_TRUE(contains(error_of({"stray"}), "unexpected argument 'stray'"));
  EXPECT_TRUE(contains(error_of({"--micro-batch", "four"}), "--micro-batch: 'four' is not an integer"));
  EXPECT_TRUE(contains(error_of({"--micro-batch", "0"}), "--micro-batch must be at least 1"));
  EXPECT_TRUE(contains(error_of({"--model", "gpt5"}), "unknown model 'gpt5'"));
  EXPECT_TRUE(contains(error_of({"--n-head", "5"}), "--n-head 5 does not divide --d-model 128"));
  EXPECT_TRUE(contains(error_of({"--n-kv-head", "3"}), "--n-kv-head 3 does not divide --n-head 4"));
  EXPECT_TRUE(contains(error_of({"--precision", "fp4"}), "--precision must be one of"));
  EXPECT_TRUE(contains(error_of({"--config", "/nonexistent/kiln.json"}), "cannot open"));
  auto bad = write_temp("bad.json", "{\"steps\": 10,");
  EXPECT_TRUE(contains(error_of({"--config", bad}), "malformed JSON"));
  auto unknown = write_temp("unknown.json", R"({"stepz": 10})");
  EXPECT_TRUE(contains(error_of({"--config", unknown}), "unknown key 'stepz'"));
  // Every unknown key in one line (issue 48: one per run), each with kiln's name for what another
  // tool calls it (the HF Trainer's learning_rate, nanoGPT's batch_size) or the nearest name.
  auto many = write_temp("many.json", R"({"learning_rate": 3e-4, "batch_size": 4, "max_steps": 10, "warmup_steps": 2,
      "weight_decay": 0.1, "micro_batc": 2, "colour": "blue"})");
  EXPECT_EQ(error_of({"--config", many}), "--config " + many + ": 6 unknown keys: 'batch_size' (did you mean 'micro_batch'?), "
                                          "'colour', 'learning_rate' (did you mean 'lr'?), 'max_steps' (did you mean 'steps'?), "
                                          "'micro_batc' (did you mean 'micro_batch'?), 'warmup_steps' (did you mean 'warmup'?)");
  EXPECT_EQ(error_of({"--learning-rate", "1e-3", "--max-iters", "5", "--stepz", "3"}),
            "3 unknown flags: '--learning-rate' (did you mean '--lr'?), '--max-iters' (did you mean '--steps'?), '--stepz' "
            "(did you mean '--steps'?) (see kiln train --help)");
  auto typed = write_temp("typed.json", R"({"steps": "ten"})");
  EXPECT_TRUE(contains(error_of({"--config", typed}), "key 'steps' must be an integer"));
  auto array = write_temp("array.json", "[1, 2]");
  EXPECT_TRUE(contains(error_of({"--config", array}), "must hold a JSON object"));
  for (const auto& p : {bad, unknown, many, typed, array}) std::remove(p.c_str());
}

TEST(Cli, PipelineFlagsAreValidated) {
  // A layout the schedule cannot run is refused, never ignored; ZeRO-3 with pp is built (issue 36).
  EXPECT_TRUE(contains(error_of({"--pp", "2", "--pp-virtual", "2", "--grad-accum", "3"}), "a multiple of --pp 2 (got 3; 4 works)"));
  EXPECT_EQ(error_of({"--pp", "2", "--zero", "3"}), "");
  EXPECT_TRUE(contains(error_of({"--pp", "64"}), "--pp 64 is larger than the model's"));
  EXPECT_TRUE(contains(error_of({"--pp", "2", "--pp-split", "1,1"}), "--pp-split '1,1' gives 2 stage(s) holding 2 block(s)"));
  EXPECT_TRUE(contains(error_of({"--pp", "2", "--pp-split", "0,12"}), "must be a whole number >= 1"));
}

TEST(Cli, ZeroFlagsAreValidated) {
  EXPECT_TRUE(contains(error_of({"--zero", "4"}), "--zero must be 0, 1, 2 or 3"));
  EXPECT_TRUE(contains(error_of({"--offload", "optimizer"}), "--offload optimizer needs ZeRO"));
  EXPECT_TRUE(contains(error_of({"--zero", "2", "--offload", "all"}), "--offload all needs --zero 3"));
  EXPECT_TRUE(contains(error_of({"--zero", "3", "--offload", "gpu"}), "--offload must be one of"));
  EXPECT_TRUE(contains(error_of({"--zero", "2", "--zero-accum", "never"}), "--zero-accum must be one of"));
  EXPECT_FALSE(parse_train_args({"--zero", "3", "--offload", "all", "--zero-accum", "local"}).help);
}

TEST(Cli, PrecisionAndCheckpointFlagsAreValidated) {
  EXPECT_TRUE(contains(error_of({"--precision", "fp16", "--loss-scale-window", "0"}), "--loss-scale-window must be at least 1"));
  EXPECT_TRUE(contains(error_of({"--precision", "fp16", "--hysteresis", "0"}), "--hysteresis must be at least 1"));
  EXPECT_TRUE(contains(error_of({"--precision", "fp16", "--min-loss-scale", "0"}), "--min-loss-scale must be positive"));
  EXPECT_TRUE(contains(error_of({"--precision", "fp16", "--initial-scale-power", "-1"}), "--initial-scale-power must be in"));
  EXPECT_TRUE(contains(error_of({"--on-nonfinite", "ignore"}), "--on-nonfinite must be one of"));
  EXPECT_TRUE(contains(error_of({"--keep-last", "-1"}), "--keep-last must be at least 0"));
  EXPECT_TRUE(contains(error_of({"--save-every", "-5"}), "--save-every must be at least 0"));
}

TEST(Cli, Help) {
  auto args = parse_train_args({"--help"});
  EXPECT_TRUE(args.help);
  EXPECT_TRUE(contains(args.help_text, "--micro-batch"));
}

// The help says what the code does (issue 48): --pp-schedule's default is auto (its record, the
// resolved 1f1b, was shown as the default), and --init-from takes the Llama family's directories.
TEST(Cli, HelpStatesTheDefaultsAndInputsTheCodeHas) {
  std::string text;  // the help with its line wrapping undone
  for (const char c : parse_train_args({"--help"}).help_text)
    if (!std::isspace(static_cast<unsigned char>(c)) || (!text.empty() && text.back() != ' ')) text += std::isspace(static_cast<unsigned char>(c)) ? ' ' : c;
  const auto entry = [&](const std::string& flag) { return text.substr(text.find(flag + " arg"), 400); };
  EXPECT_EQ(kiln::TrainConfig().pp_schedule, "auto");
  EXPECT_TRUE(contains(entry("--pp-schedule"), "default auto")) << entry("--pp-schedule");
  EXPECT_FALSE(contains(entry("--pp-schedule"), "(default: 1f1b)")) << entry("--pp-schedule");
  EXPECT_TRUE(contains(entry("--init-from"), "Llama, Mistral, Qwen2 or Mixtral")) << entry("--init-from");
}

TEST(Metrics, FlopsPerTokenFollowsPaLMConvention) {
  // gpt2-124m: N = 124,475,904 - 1024*768 = 123,689,472; 6N + 12*12*768*1024 = 855,383,040.
  EXPECT_DOUBLE_EQ(kiln::flops_per_token(kiln::GPTConfig::preset("gpt2-124m")), 855383040.0);
  // gpt2-1.5b: N = 1,557,686,400 - 1024*1600; 6N + 12*48*1600*1024.
  EXPECT_DOUBLE_EQ(kiln::flops_per_token(kiln::GPTConfig::preset("gpt2-1.5b")),
                   6.0 * (1557686400.0 - 1024.0 * 1600.0) + 12.0 * 48 * 1600 * 1024);
}

TEST(Metrics, PeakTable) {
  EXPECT_EQ(kiln::peak_tflops_for("NVIDIA H100 80GB HBM3"), 989.0);
  EXPECT_EQ(kiln::peak_tflops_for("NVIDIA H200"), 989.0);
  EXPECT_EQ(kiln::peak_tflops_for("NVIDIA H100 PCIe"), 756.0);
  EXPECT_EQ(kiln::peak_tflops_for("NVIDIA H100 NVL"), 835.0);
  EXPECT_EQ(kiln::peak_tflops_for("NVIDIA A100-SXM4-80GB"), 312.0);
  EXPECT_FALSE(kiln::peak_tflops_for("cpu").has_value());
  EXPECT_FALSE(kiln::peak_tflops_for("Some Future GPU").has_value());
}

TEST(Metrics, DistinctDevicesCountSharedGpusOnce) {
  // Four ranks, two hosts: ranks 0 and 2 share a GPU, rank 3 is on another host at the same bus id.
  const std::vector<std::string> ids{"a/0000:3B:00.0", "a/0000:5E:00.0", "a/0000:3B:00.0", "b/0000:3B:00.0"};
  EXPECT_EQ(kiln::device_roles(ids, 0).count, 3);
  EXPECT_TRUE(kiln::device_roles(ids, 0).reads_energy);
  EXPECT_TRUE(kiln::device_roles(ids, 1).reads_energy);
  EXPECT_FALSE(kiln::device_roles(ids, 2).reads_energy);  // rank 0 reads the GPU they share
  EXPECT_TRUE(kiln::device_roles(ids, 3).reads_energy);
  EXPECT_EQ(kiln::device_roles({"a/cpu/rank 0", "a/cpu/rank 1"}, 1).count, 2);  // CPU: a device per rank
  // Identities on the CPU name the rank, so G = W there.
  const c10::Device cpu(c10::kCPU);
  EXPECT_NE(kiln::device_identity(cpu, 0), kiln::device_identity(cpu, 1));
}

TEST(Metrics, WorldOfOneIsOneDevice) {
  kiln::JobDevices one(c10::Device(c10::kCPU), /*meter_available=*/false, nullptr);
  EXPECT_EQ(one.count(), 1);
  EXPECT_FALSE(one.energy_known());
  EXPECT_FALSE(one.job_joules(1.0, 2.0).has_value());  // no meter: unknown, whatever was read
  kiln::JobDevices metered(c10::Device(c10::kCPU), /*meter_available=*/true, nullptr);
  EXPECT_EQ(metered.job_joules(1.0, 3.5), 2.5);
  EXPECT_FALSE(metered.job_joules(std::nullopt, 3.5).has_value());  // a failed read
}

TEST(Mesh, ResolveAndCoordinates) {
  auto s = kiln::MeshShape::resolve(8, 2, 2);
  EXPECT_EQ(s.dp, 2);
  // rank = (pp * dp + dp_index) * tp + tp_index
  auto c = kiln::coord_of(5, s);  // 5 = (1 * 2 + 0) * 2 + 1
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(c.dp, 0);
  EXPECT_EQ(c.tp, 1);
  try {
    kiln::MeshShape::resolve(6, 4, 1);
    FAIL() << "4 does not divide 6";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "world 6 ranks, tp 4 x pp 1 = 4")) << e.what();
  }
}
