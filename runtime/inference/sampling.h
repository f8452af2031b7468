// runtime/inference/sampling.h -- the next token from a row of logits: greedy, temperature, top-k, top-p.
//
// With z the logits over the candidate ids [0, V) (the padding of the vocabulary cut off):
//   repetition r != 1 first, for every id already in the context (prompt and generated): z /= r
//                     where z > 0, z *= r where not (CTRL, Keskar et al. 2019; Hugging Face's
//                     repetition_penalty): r > 1 makes repeats less likely, greedy or not
//   temperature 0     token = argmax z (the first of equal maxima): greedy, no randomness
//   temperature t > 0 p = softmax(z / t), then, in this order (Hugging Face's warpers' order):
//     top-k k > 0     keep the k largest z (ties at the k-th all kept), the rest -> -inf
//     top-p p < 1     nucleus sampling (Holtzman et al., 2019): sort p descending; keep the
//                     shortest prefix whose mass reaches top_p (at least one token), the rest -> 0
//   token ~ Categorical(p renormalised), drawn from `gen` (a CPU generator: a seed gives the same
//   token on every device and layout, since the logits are brought to the CPU in fp32 first).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

namespace kiln {

struct SamplingConfig {
  double temperature = 1.0;  // softmax temperature; 0 = greedy (argmax)
  int64_t top_k = 0;         // keep the k most likely tokens; 0 = all
  double top_p = 1.0;        // keep the smallest set of tokens whose probability reaches top_p; 1 = all
  double repetition_penalty = 1.0;  // r above; 1 = off
  // Throws ConfigError, one line naming the flag: temperature negative or not finite, top_k
  // negative, top_p outside (0, 1], repetition_penalty not positive and finite.
  void validate() const;
  bool greedy() const { return temperature == 0.0; }
};

// The distribution tokens are drawn from: logits [V] (any device and floating dtype) -> [V] fp32
// CPU probabilities summing to 1, zero outside top-k / top-p. Not for greedy (temperature 0).
at::Tensor sampling_probs(const at::Tensor& logits, const SamplingConfig& cfg);

// The next token: logits [V] -> an id in [0, V). `seen`: the context's ids, for the repetition
// penalty (ids outside [0, V) are ignored).
int64_t sample_token(const at::Tensor& logits, const SamplingConfig& cfg, at::Generator& gen,
                     const std::vector<int64_t>& seen = {});

// The logits with the repetition penalty applied to `seen`'s ids: [V] fp32 on the CPU.
at::Tensor penalized(const at::Tensor& logits, const std::vector<int64_t>& seen, double penalty);

}  // namespace kiln
