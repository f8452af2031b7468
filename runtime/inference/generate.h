// runtime/inference/generate.h -- autoregressive generation: the loop of `kiln sample` and of the samples
// `kiln train --sample-every` prints.
//
// Given the context c_0 .. c_{n-1} (the prompt), each step computes the next token's logits from
// the model's context window, draws a token (runtime/inference/sampling.h) and appends it, until
// max_new_tokens or the stop token (end-of-text; not returned). With the key/value cache
// (runtime/inference/kv_cache.h) a step runs one position through the model; without it (kv_cache false,
// the reference the cache is tested against) the whole window. Both see the same windows and
// return the same tokens (greedy: equal logits up to rounding, ~1e-6).
//
// The window. Positions are learned, so the model sees at most T = seq_len tokens: a prompt
// longer than T is cut to its last T tokens; when the context grows past T, the window moves on
// to the last T - floor(T / 2) tokens (the cache starts anew on them), then grows again. A step
// thus costs one position, plus about one more per token on average after each move (the new
// window's prefill); sliding by one token every step (nanoGPT's sample.py) would cost T.
//
// Tensor parallelism: the model is a tp shard (parallel/tensor_parallel.h) and `tp` its group.
// Every rank of the group calls generate() with the same arguments; the logits, split by
// vocabulary, are all-gathered, every rank draws from the same generator, and rank 0's token is
// broadcast so the ranks cannot drift apart. The result is the same on every rank.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "distributed/comm.h"
#include "models/gpt.h"
#include "runtime/inference/sampling.h"

namespace kiln {

class Tokenizer;

struct GenerateConfig {
  SamplingConfig sampling;       // temperature, top-k, top-p
  int64_t max_new_tokens = 64;   // tokens to generate at most
  uint64_t seed = 1337;          // the sampler's CPU generator (unused when greedy)
  int64_t stop_token = -1;       // generation ends when this id is drawn (not returned); -1: never
  std::vector<int64_t> stop_tokens;  // more such ids (a tokenizer's end tokens)
  int64_t candidates = 0;        // ids [0, candidates) may be drawn (the tokenizer's); 0: the model's vocab_size
  bool kv_cache = true;          // false: the whole window through GPT::hidden for every token
  // Called with the new tokens so far after each one (and on_token): true ends the generation
  // there (a stop string, `kiln sample --stop`). Must decide alike on every tp rank (it sees the
  // same tokens). Empty: never.
  std::function<bool(const std::vector<int64_t>&)> stop_after;
  // ConfigError, one line naming the flag (sampling's checks; max_new_tokens negative).
  void validate() const;
};

struct Generation {
  std::vector<int64_t> tokens;   // the new tokens, without the stop token
  bool stopped = false;          // ended by drawing stop_token
  bool stopped_after = false;    // ended by stop_after
  int64_t positions = 0;         // positions run through the model, the prompt's included
  int64_t window_moves = 0;      // times the context passed seq_len and the window moved on
  int64_t prompt_used = 0;       // the prompt's tokens in the first window (it is cut to seq_len)
  double seconds = 0.0;
};

// Generates from `prompt` (at least one token, all below the model's vocab_size) with `model`
// (a whole model or a tp shard, on any device; put in eval mode for the call and back after).
// on_token(id), when given, sees each new token as it is drawn (streaming). Throws ConfigError for
// a bad config, an empty prompt or candidates above the model's vocabulary.
// With expert parallelism (`ep`: the rank's ep group, whose MoE layers exchange rows in every
// forward) every rank of the group generates alike, each from the same prompt: the group's rank 0
// decides each token (after tp's rank 0 has), so that no rank stops or runs a forward the others
// do not (a token drawn apart on one rank from logits a last bit apart would leave the group's
// all-to-alls unmatched).
Generation generate(GPT& model, const std::vector<int64_t>& prompt, const GenerateConfig& cfg,
                    const std::shared_ptr<Communicator>& tp = nullptr,
                    const std::function<void(int64_t)>& on_token = nullptr,
                    const std::shared_ptr<Communicator>& ep = nullptr);

// `kiln train --sample-every`: a short sample as llm.c prints during training -- from end-of-text
// alone, `tokens` new tokens, greedy when temperature is 0, else drawn with `seed` -- decoded by
// `tokenizer`, invalid UTF-8 replaced (valid_utf8), so it can be printed and logged. Collective
// over tp (the ranks of one model replica call it) and, with expert parallelism, over `ep` (the
// replicas of the first ep group call it); the text is the same on each of them.
std::string training_sample(GPT& model, const Tokenizer& tokenizer, int64_t tokens, const std::shared_ptr<Communicator>& tp,
                            double temperature = 0.0, uint64_t seed = 1337, const std::shared_ptr<Communicator>& ep = nullptr);

}  // namespace kiln
