// launch/sample_cli.h -- `kiln sample`: text from a checkpoint.
//
//   kiln sample --checkpoint DIR [--prompt TEXT] [--temperature 1] [--top-k 0] [--top-p 1]
//               [--max-new-tokens 64] [--seed 1337] [--device auto] [--tp 1] [--no-kv-cache] [--json]
//
// DIR is a checkpoint or a save dir (its `latest`), as for kiln eval. The prompt is encoded with
// the checkpoint's tokenizer (data/tokenizer.h; today the byte-level one) after end-of-text, the
// token every training document starts with (kiln prep), so a prompt starts a document and an
// empty prompt samples one from nothing, as llm.c's samples do. Generation (runtime/inference/generate.h)
// stops at end-of-text or after --max-new-tokens. Output: the prompt and its continuation on
// stdout, streamed as drawn; one line of figures on stderr (tokens, seconds, why it stopped).
// --json prints one JSON object instead: {"checkpoint", "step", "prompt", "prompt_ids", "ids",
// "text", "stopped", "positions", "window_moves", "kv_cache", "seconds", "tokens_per_s"}: ids the
// generated ones, positions those run through the model (runtime/inference/generate.h's Generation).
// Tensor parallelism: `mpirun -np T kiln sample --tp T ...` splits the model over T ranks
// (world = tp: no data or pipeline parallelism); rank 0 prints.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distributed/env.h"
#include "runtime/inference/generate.h"

namespace kiln {

struct SampleArgs {
  std::string checkpoint;      // a checkpoint directory, or a save dir (its latest)
  std::string prompt;          // text the sample continues ("" = from end-of-text alone)
  std::string device = "auto"; // auto | cpu | cuda | cuda:N
  int64_t tp = 1;              // tensor-parallel ranks (= the world under mpirun)
  bool json = false;           // one JSON object on stdout instead of the text (one per sample)
  int64_t num_samples = 1;     // samples of the prompt, seeds seed, seed + 1, ... (nanoGPT's num_samples)
  std::vector<std::string> stop;  // --stop: the sample ends before the first of these texts (not printed)
  GenerateConfig gen;          // sampling, max new tokens, seed, cache (stop token and candidates: the tokenizer's)
  std::string kernels = "fused";  // fused | reference: kiln's CUDA kernels (kernels/) or the composite ops, as kiln train's
  bool help = false;
  std::string help_text;
};

// args: the arguments after "sample". Every value is checked here (ConfigError, one line).
SampleArgs parse_sample_args(const std::vector<std::string>& args);

// Loads the checkpoint and prints the sample (rank 0). Returns the exit code (0).
int run_sample(const SampleArgs& args, const ProcessInfo& proc);

}  // namespace kiln
