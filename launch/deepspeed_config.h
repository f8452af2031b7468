// launch/deepspeed_config.h -- `kiln train --deepspeed FILE`: a DeepSpeed JSON config as kiln
// settings.
//
// Every key of the file is one of four kinds (the full table is docs/deepspeed.md):
//   mapped     sets a kiln flag: zero_optimization.stage -> --zero, fp16.enabled -> --precision
//              fp16, optimizer.params.lr -> --lr, scheduler WarmupDecayLR -> --lr-schedule
//              warmup-decay, gradient_clipping -> --grad-clip, ...
//   checked    the batch: train_batch_size = train_micro_batch_size_per_gpu x
//              gradient_accumulation_steps x data-parallel ranks, derived and checked as
//              DeepSpeed does (two of the three give the third; all three must agree)
//   notice     tunes performance or logging only (bucket sizes, overlap_comm, pin_memory,
//              wall_clock_breakdown): accepted, with one line saying kiln does not act on it
//   refused    changes the numerics in a way kiln does not implement (another optimizer,
//              consecutive_hysteresis, quantized ZeRO, ...), or is not a key kiln knows: one
//              line naming it, exit 2; the unknown keys all in one line, each with the nearest
//              known key or the one another tool's name stands for (learning_rate:
//              optimizer.params.lr), and named beside a refusal found after them
//
// Values:
//   "auto"         kiln's own flag or default, as Accelerate and the HF Trainer fill it
//                  (warmup_min_lr "auto" is 0, as the HF Trainer fills it); the config record's
//                  "deepspeed.auto" lists each auto key with the value used
//   a number, ...  that value (booleans may be written "true" / "false", as DeepSpeed accepts)
//   absent         inside a section the file has: DeepSpeed's default for it (the optimizer's
//                  betas (0.9, 0.999), a scheduler's warmup_num_steps 1000, log warm-up, ...);
//                  a whole section absent (optimizer, scheduler, fp16): kiln's own settings, as
//                  the HF Trainer supplies its own optimizer and schedule then; gradient_clipping
//                  absent: 0 (DeepSpeed does not clip)
// Precedence: a flag on the command line overrides the file, with one notice line, except the
// flags that pick the parallel layout and precision (--zero, --offload, --precision, --tp): the
// file and such a flag disagreeing is refused, since it usually means the wrong file.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/trainer/train_config.h"

namespace kiln {

struct DeepSpeedSettings {
  std::string path;
  std::map<std::string, nlohmann::json> values;  // kiln flag name -> value (int64, double, string)
  std::map<std::string, std::string> from;       // kiln flag name -> the DeepSpeed key that set it
  std::map<std::string, std::string> auto_keys;  // DeepSpeed key given "auto" -> the kiln setting used
  std::vector<std::string> notices;              // one line each, without a prefix
  // The batch as the file states it (absent or "auto": nullopt; "auto" micro / accumulation take
  // kiln's --micro-batch / --grad-accum, and train_batch_size "auto" is their product).
  std::optional<int64_t> train_batch_size, micro_batch, grad_accum;
  bool micro_auto = false, accum_auto = false;
  // WarmupCosineLR's ratios of the final lr: the warm-up start and the cosine floor.
  std::optional<double> warmup_min_ratio, cos_min_ratio;
};

// Reads and maps the file. Throws ConfigError with one line: unreadable or malformed file, a
// refused key, a value of the wrong type.
DeepSpeedSettings read_deepspeed_config(const std::string& path);

// The flags whose disagreement with the file is refused rather than overridden.
bool deepspeed_structural_flag(const std::string& flag);

// After the flags are applied to `config`: the batch (derived and checked against the world's
// data-parallel ranks), WarmupCosineLR's ratios, and config.deepspeed_used (the record).
// flags_given: the flags given on the command line. Throws ConfigError.
void finish_deepspeed(const DeepSpeedSettings& ds, const std::set<std::string>& flags_given, int world_size,
                      TrainConfig& config);

// What the console says of the record's notices (config.deepspeed_used): the keys accepted that
// change nothing kiln does in one line (each with its reason in the record; a template config
// printed 7 lines on every launch), every other notice on its own line. Without a prefix.
std::vector<std::string> deepspeed_console_lines(const nlohmann::json& deepspeed_used);

}  // namespace kiln
