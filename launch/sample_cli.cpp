// launch/sample_cli.cpp -- `kiln sample`: flags, the model and its group, the printed sample.
#include "launch/sample_cli.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <type_traits>

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "distributed/backend_choice.h"
#include "distributed/comm_mpi.h"
#include "distributed/device.h"
#include "distributed/error.h"
#include "distributed/host_threads.h"
#include "distributed/strprintf.h"
#include "distributed/watchdog.h"
#include "kernels/kernel_choice.h"
#include "launch/flags.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/inference/inference_model.h"
#if defined(KILN_WITH_CUDA)
#include "distributed/comm_nccl.h"
#endif

namespace kiln {

namespace {

using json = nlohmann::json;

// A flag's value as a number, all of it (not "1.5x"); ConfigError naming the flag otherwise.
template <typename T>
T number(const cxxopts::ParseResult& result, const std::string& flag) {
  const std::string text = result[flag].as<std::string>();
  const char* kind = std::is_floating_point_v<T> ? "a number" : std::is_unsigned_v<T> ? "a non-negative integer" : "an integer";
  size_t used = 0;
  T value{};
  try {
    if constexpr (std::is_floating_point_v<T>) value = static_cast<T>(std::stod(text, &used));
    else if constexpr (std::is_unsigned_v<T>) value = text.rfind('-', 0) == 0 ? T{} : static_cast<T>(std::stoull(text, &used));
    else value = static_cast<T>(std::stoll(text, &used));
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) throw ConfigError("--" + flag + " '" + text + "': not " + kind);
  return value;
}

// The tp group: the world (kiln sample runs one model, split over every rank), on NCCL where
// every rank has a GPU of its own, else on MPI.
std::shared_ptr<Communicator> tp_group(const c10::Device& device) {
  const std::string backend = choose_backend("auto", device, MPI_COMM_WORLD);
  auto watchdog = std::make_shared<Watchdog>(/*timeout_s=*/300.0);
#if defined(KILN_WITH_CUDA)
  if (backend == "nccl") return make_nccl_communicator(MPI_COMM_WORLD, "tp", device.index(), watchdog);
#endif
  return make_mpi_communicator(MPI_COMM_WORLD, "tp", watchdog, device);
}

}  // namespace

SampleArgs parse_sample_args(const std::vector<std::string>& args) {
  cxxopts::Options opts("kiln sample", "Text from a checkpoint: its continuation of a prompt.");
  const GenerateConfig d;
  opts.add_options()("h,help", "show this help")
      ("checkpoint", "a checkpoint directory, or a save dir (its latest)", cxxopts::value<std::string>())
      ("prompt", "text to continue (default: none; the sample starts after end-of-text)", cxxopts::value<std::string>())
      ("temperature", strprintf("softmax temperature; 0 = greedy (default: %g)", d.sampling.temperature), cxxopts::value<std::string>())
      ("top-k", "sample among the k most likely tokens; 0 = all (default: 0)", cxxopts::value<std::string>())
      ("top-p", "sample among the most likely tokens holding this probability, in (0, 1]; 1 = all (default: 1)", cxxopts::value<std::string>())
      ("max-new-tokens", strprintf("tokens to generate at most (default: %lld)", static_cast<long long>(d.max_new_tokens)), cxxopts::value<std::string>())
      ("seed", strprintf("the sampler's random seed (default: %llu)", static_cast<unsigned long long>(d.seed)), cxxopts::value<std::string>())
      ("device", "auto | cpu | cuda | cuda:N (default: auto)", cxxopts::value<std::string>())
      ("tp", "tensor-parallel ranks: mpirun -np N kiln sample --tp N (default: 1)", cxxopts::value<std::string>())
      ("no-kv-cache", "recompute the whole context for every token (the reference the cache is tested against)")
      ("num-samples", "samples of the prompt, with seeds seed, seed + 1, ... (default: 1)", cxxopts::value<std::string>())
      ("repetition-penalty", "divide the logits of ids already in the context by this (multiply the negative ones); 1 = off (default: 1)", cxxopts::value<std::string>())
      ("stop", "end the sample before this text (not printed); repeat for several", cxxopts::value<std::vector<std::string>>())
      ("kernels", "fused | reference: kiln's CUDA kernels for the norms, SwiGLU and the loss's softmax, or the composite LibTorch ops (default: fused; the CPU always runs these; --json's \"kernels\" says what ran)", cxxopts::value<std::string>())
      ("json", "print one JSON object (ids, text, figures) per sample instead of the text");
  const cxxopts::ParseResult result = parse_or_throw(opts, args, "sample", "quote a prompt with spaces");
  SampleArgs out;
  if (result.count("help")) {
    out.help = true;
    out.help_text = opts.help();
    return out;
  }
  if (!result.count("checkpoint")) throw ConfigError("kiln sample: give --checkpoint DIR (a checkpoint, or a save dir)");
  out.checkpoint = result["checkpoint"].as<std::string>();
  if (result.count("prompt")) out.prompt = result["prompt"].as<std::string>();
  if (result.count("device")) out.device = result["device"].as<std::string>();
  if (result.count("temperature")) out.gen.sampling.temperature = number<double>(result, "temperature");
  if (result.count("top-k")) out.gen.sampling.top_k = number<int64_t>(result, "top-k");
  if (result.count("top-p")) out.gen.sampling.top_p = number<double>(result, "top-p");
  if (result.count("max-new-tokens")) out.gen.max_new_tokens = number<int64_t>(result, "max-new-tokens");
  if (result.count("seed")) out.gen.seed = number<uint64_t>(result, "seed");
  if (result.count("tp")) out.tp = number<int64_t>(result, "tp");
  out.gen.kv_cache = !result.count("no-kv-cache");
  out.json = result.count("json") > 0;
  if (result.count("num-samples")) out.num_samples = number<int64_t>(result, "num-samples");
  if (result.count("repetition-penalty")) out.gen.sampling.repetition_penalty = number<double>(result, "repetition-penalty");
  if (result.count("stop")) out.stop = result["stop"].as<std::vector<std::string>>();
  if (result.count("kernels")) out.kernels = result["kernels"].as<std::string>();
  (void)parse_kernels(out.kernels);  // fused | reference, else one line naming the flag
  for (const auto& s : out.stop)
    if (s.empty()) throw ConfigError("--stop: give a non-empty text");
  if (out.num_samples < 1) throw ConfigError("--num-samples " + std::to_string(out.num_samples) + ": must be 1 or more");
  out.gen.validate();
  if (out.tp < 1) throw ConfigError("--tp " + std::to_string(out.tp) + ": must be 1 or more");
  return out;
}

int run_sample(const SampleArgs& args, const ProcessInfo& proc) {
  // One model, split over every rank by tensor parallelism (or on one process).
  if (!proc.mpi && args.tp > 1) {
    throw ConfigError("--tp " + std::to_string(args.tp) + " needs " + std::to_string(args.tp) + " ranks: launch with mpirun -np " +
                      std::to_string(args.tp));
  }
  if (proc.world_size != args.tp) {
    throw ConfigError("kiln sample runs one model over every rank: with " + std::to_string(proc.world_size) +
                      " ranks give --tp " + std::to_string(proc.world_size) + " (no data or pipeline parallelism)");
  }
  divide_host_threads(proc.local_size);
  const DeviceInfo dev = select_device(args.device, proc.local_rank);
  const std::shared_ptr<Communicator> tp = args.tp > 1 ? tp_group(dev.device) : nullptr;
  const std::string dir = resolve_checkpoint_dir(args.checkpoint, "kiln sample");
  if (is_hf_model_dir(dir) && !std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json")) {
    throw ConfigError("kiln sample: " + dir + " is a Hugging Face model directory without tokenizer.json: save the model's tokenizer "
                      "beside it (AutoTokenizer.from_pretrained(...).save_pretrained(DIR))");
  }
  const auto tokenizer = tokenizer_for_checkpoint(dir);
  const CheckpointModel loaded = load_checkpoint_model(dir, dev.device, tp, "kiln sample");
  // kiln train's choice of kernels: fused where they exist (CUDA), the composite ops elsewhere.
  loaded.model->set_kernels(kernels_on(parse_kernels(args.kernels), dev.device.is_cuda()), /*gelu_epilogue=*/false);
  const char* kernels = kernels_name(loaded.model->kernels());
  const GPTConfig& mc = loaded.config;
  GenerateConfig gen = args.gen;
  gen.stop_token = tokenizer->eot();
  gen.stop_tokens = tokenizer->end_tokens();
  gen.candidates = tokenizer->vocab_size();  // the model's other ids decode to nothing (generate() checks they fit)
  std::vector<int64_t> prompt{tokenizer->eot()};
  for (const int64_t id : tokenizer->encode(args.prompt)) prompt.push_back(id);

  const bool rank0 = proc.rank == 0;
  const bool stream = rank0 && !args.json;
  if (rank0 && static_cast<int64_t>(prompt.size()) > mc.seq_len) {
    std::fprintf(stderr, "kiln sample: the prompt is %zu tokens, the model's context %lld: it sees the last %lld\n", prompt.size(),
                 static_cast<long long>(mc.seq_len), static_cast<long long>(mc.seq_len));
  }
  for (int64_t k = 0; k < args.num_samples; ++k) {
    gen.seed = args.gen.seed + static_cast<uint64_t>(k);  // sample k: its own seed, the same on every rank
    if (stream && args.num_samples > 1) {
      std::printf("--- sample %lld/%lld (seed %llu)\n", static_cast<long long>(k + 1), static_cast<long long>(args.num_samples),
                  static_cast<unsigned long long>(gen.seed));
    }
    if (stream) {
      std::fwrite(args.prompt.data(), 1, args.prompt.size(), stdout);
      std::fflush(stdout);
    }
    // Stop strings: the new text so far, decoded whole, is searched after every token; what could
    // still be the start of a stop string is held back from the stream until it is known not to be.
    std::string text, matched;
    size_t printed = 0, end = std::string::npos;  // end: where the first stop string starts
    size_t hold = 0;
    for (const auto& s : args.stop) hold = std::max(hold, s.size() - 1);
    auto emit = [&](size_t upto) {
      if (stream && upto > printed) {
        std::fwrite(text.data() + printed, 1, upto - printed, stdout);
        std::fflush(stdout);
      }
      printed = std::max(printed, upto);
    };
    if (!args.stop.empty()) {
      gen.stop_after = [&](const std::vector<int64_t>& tokens) {
        text = tokenizer->decode(tokens);
        for (const auto& s : args.stop) {
          const size_t at = text.find(s);
          if (at != std::string::npos && (end == std::string::npos || at < end)) end = at, matched = s;
        }
        if (end != std::string::npos) return emit(end), true;
        emit(text.size() > hold ? text.size() - hold : 0);
        return false;
      };
    }
    const Generation g = generate(*loaded.model, prompt, gen, tp, [&](int64_t id) {
      if (!stream || !args.stop.empty()) return;
      const std::string piece = tokenizer->decode({id});
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    });
    if (!args.stop.empty() && !g.stopped_after) emit(text.size());  // no stop string: the rest
    const std::vector<int64_t>& ids = g.tokens;
    const std::string sample_text = args.stop.empty() ? tokenizer->decode(ids) : text.substr(0, std::min(end, text.size()));
    if (!rank0) continue;
    const double tokens_per_s = g.seconds > 0 ? static_cast<double>(g.tokens.size()) / g.seconds : 0.0;
    const char* why = g.stopped ? "end-of-text" : g.stopped_after ? "--stop" : "--max-new-tokens";
    if (args.json) {
      const std::vector<int64_t> prompt_ids(prompt.begin() + 1, prompt.end());
      json rec{{"checkpoint", loaded.dir},
                     {"step", loaded.step},
                     {"prompt", valid_utf8(args.prompt)},
                     {"prompt_ids", prompt_ids},
                     {"ids", g.tokens},
                     {"text", valid_utf8(sample_text)},
                     {"stopped", g.stopped ? "eot" : g.stopped_after ? "stop" : "max_new_tokens"},
                     {"positions", g.positions},
                     {"window_moves", g.window_moves},
                     {"kv_cache", gen.kv_cache},
                     {"kernels", kernels},
                     {"seconds", g.seconds},
                     {"tokens_per_s", tokens_per_s}};
      if (args.num_samples > 1) rec["sample"] = k + 1, rec["seed"] = gen.seed;
      if (g.stopped_after) rec["stop"] = valid_utf8(matched);
      std::printf("%s\n", rec.dump().c_str());
    } else {
      std::printf("\n");
      std::fprintf(stderr, "kiln sample: %s (step %lld): %zu tokens in %.3f s (%.1f tokens/s), stopped by %s; %s, tp %lld, kv cache %s, kernels %s\n",
                   loaded.dir.c_str(), static_cast<long long>(loaded.step), g.tokens.size(), g.seconds, tokens_per_s, why,
                   dev.name.c_str(), static_cast<long long>(args.tp), gen.kv_cache ? "on" : "off", kernels);
    }
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace kiln
