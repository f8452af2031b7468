// parallel/pipeline_layout.h -- which blocks each pipeline stage holds (torch-free: the config
// validation and `kiln plan` use it too).
//
// Stages hold contiguous blocks: stage s holds [begin_s, begin_s + n_s), sum_s n_s = n_layer,
// every n_s >= 1 (so pp <= n_layer). The first stage also holds the embedding (wte, wpe), the
// last one ln_f and the tied output layer (its own copy of wte).
//
// Default split, balanced by block count: n_s = floor(L / pp), and the L mod pp extra blocks go
// to the middle stages first (1, 2, .., pp-2), then to the first stage, last to the last stage.
// The reason: the last stage's output layer and cross-entropy cost 2 V d FLOP per token forward
// against a block's 24 d^2 + 4 T d (4.5 blocks' worth for GPT-2 small at T 1024), and the first
// stage's embedding lookup is almost free, so an uneven count is best spent away from the
// last stage. For a split that weighs the head exactly, give one: --pp-split 4,4,3.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

// Blocks per stage. `split`: empty for the default, else a comma-separated count per stage
// ("4,4,3"). Throws ConfigError (one line) when pp exceeds the blocks, or an explicit split has
// the wrong length, a count below 1, or does not sum to n_layer.
// With `chunks` > 1 (the interleaved schedule, --pp-virtual: parallel/pipeline_interleaved.h)
// the counts are per virtual stage, pp x chunks of them, by the same rule.
std::vector<int64_t> pipeline_block_counts(int64_t n_layer, int64_t pp, const std::string& split = "", int64_t chunks = 1);

// The first block of each stage (prefix sums of the counts), plus n_layer at the end.
std::vector<int64_t> pipeline_block_starts(const std::vector<int64_t>& counts);

}  // namespace kiln
