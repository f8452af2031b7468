// runtime/inference/generate.cpp -- the generation loop (windows, cache, tp logits; see the header).
#include "runtime/inference/generate.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "data/tokenizer.h"
#include "distributed/device_check.h"
#include "distributed/error.h"
#include "runtime/inference/kv_cache.h"

namespace kiln {

void GenerateConfig::validate() const {
  sampling.validate();
  if (max_new_tokens < 0) throw ConfigError("--max-new-tokens " + std::to_string(max_new_tokens) + ": must be 0 or more");
  if (candidates < 0) throw ConfigError("generate: candidates " + std::to_string(candidates) + " is negative");
}

namespace {

// The logits over the whole padded vocabulary of hidden [B, d]: [B, V'/t] on each tp rank,
// gathered into [B, V'] (all_gather concatenates the ranks' [B, V'/t] flat, rank-major).
at::Tensor vocabulary_logits(const GPT& model, const at::Tensor& hidden, const std::shared_ptr<Communicator>& tp) {
  auto local = at::linear(hidden, model.output_weight()).contiguous();  // [B, V'/t]
  if (!tp || tp->size() == 1) return local;
  const int64_t t = tp->size(), B = local.size(0), Vt = local.size(1);
  auto all = at::empty({t * B * Vt}, local.options());
  tp->all_gather(all, local.reshape({-1}))->wait();
  return all.view({t, B, Vt}).permute({1, 0, 2}).reshape({B, t * Vt});
}

// The group's rank 0's token on every rank of it (they drew the same one, or one from logits a
// last bit apart; this keeps them from drifting).
int64_t agree(int64_t token, const std::shared_ptr<Communicator>& group, c10::Device device) {
  if (!group || group->size() == 1) return token;
  auto t = at::full({1}, token, at::TensorOptions().dtype(at::kLong).device(device));
  group->broadcast(t, 0)->wait();
  return t.item<int64_t>();
}

}  // namespace

Generation generate(GPT& model, const std::vector<int64_t>& prompt, const GenerateConfig& cfg,
                    const std::shared_ptr<Communicator>& tp, const std::function<void(int64_t)>& on_token,
                    const std::shared_ptr<Communicator>& ep) {
  cfg.validate();
  const GPTConfig& mc = model.config();
  if (prompt.empty()) throw ConfigError("generate: the prompt holds no token (start it with end-of-text)");
  const int64_t candidates = cfg.candidates > 0 ? cfg.candidates : mc.vocab_size;
  if (candidates > mc.vocab_size) {
    throw ConfigError("the tokenizer's " + std::to_string(candidates) + " ids do not fit the model's vocabulary of " +
                      std::to_string(mc.vocab_size));
  }
  for (const int64_t id : prompt) {
    if (id < 0 || id >= mc.vocab_size) throw ConfigError("prompt token " + std::to_string(id) + " is outside the model's vocabulary");
  }
  const auto started = std::chrono::steady_clock::now();
  const int64_t T = mc.seq_len;
  const c10::Device device = model.output_weight().device();
  const bool was_training = model.is_training();
  model.eval();
  at::NoGradGuard no_grad;

  Generation out;
  std::vector<int64_t> context = prompt;
  int64_t start = std::max<int64_t>(0, static_cast<int64_t>(context.size()) - T);  // the window: [start, size)
  out.prompt_used = static_cast<int64_t>(context.size()) - start;
  std::optional<KVCache> cache;
  if (cfg.kv_cache) cache.emplace(model, /*batch=*/1, /*capacity=*/T);
  int64_t cache_start = start;  // the cache holds the tokens [cache_start, cache_start + length)
  auto gen = at::make_generator<at::CPUGeneratorImpl>(cfg.seed);

  for (int64_t step = 0; step < cfg.max_new_tokens; ++step) {
    const int64_t len = static_cast<int64_t>(context.size());
    if (len - start > T) {
      start = len - (T - T / 2);
      ++out.window_moves;
    }
    // The tokens to run: the window's not yet cached (with the cache), or all of it.
    if (cache && cache_start != start) {
      cache->clear();
      cache_start = start;
    }
    const int64_t first = cache ? start + cache->length() : start;
    std::vector<int64_t> run(context.begin() + first, context.end());
    // Host ids to the device (in the device-check mode a host tensor must be copied over, as a GPU
    // run must copy it).
    const auto idx = to_device(at::tensor(run, at::TensorOptions().dtype(at::kLong)), device).view({1, -1});
    const auto hidden = cache ? forward_cached(model, idx, *cache) : model.hidden(idx);  // [1, n, d]
    out.positions += static_cast<int64_t>(run.size());
    const auto logits = vocabulary_logits(model, hidden.select(1, hidden.size(1) - 1), tp);  // [1, V']
    // tp's rank 0 decides, then the ep group's (each of its ranks holds tp's rank-0 token by then)
    const int64_t drawn = sample_token(logits[0].narrow(0, 0, candidates), cfg.sampling, gen, context);
    const int64_t token = agree(agree(drawn, tp, device), ep, device);
    if (token == cfg.stop_token || std::find(cfg.stop_tokens.begin(), cfg.stop_tokens.end(), token) != cfg.stop_tokens.end()) {
      out.stopped = true;
      break;
    }
    context.push_back(token);
    out.tokens.push_back(token);
    if (on_token) on_token(token);
    if (cfg.stop_after && cfg.stop_after(out.tokens)) {
      out.stopped_after = true;
      break;
    }
  }
  if (was_training) model.train();
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return out;
}

std::string training_sample(GPT& model, const Tokenizer& tokenizer, int64_t tokens, const std::shared_ptr<Communicator>& tp,
                            double temperature, uint64_t seed, const std::shared_ptr<Communicator>& ep) {
  GenerateConfig cfg;
  cfg.sampling.temperature = temperature;
  cfg.max_new_tokens = tokens;
  cfg.seed = seed;
  cfg.stop_token = tokenizer.eot();
  cfg.stop_tokens = tokenizer.end_tokens();
  cfg.candidates = std::min(tokenizer.vocab_size(), model.config().vocab_size);
  return valid_utf8(tokenizer.decode(generate(model, {tokenizer.eot()}, cfg, tp, nullptr, ep).tokens));
}

}  // namespace kiln
