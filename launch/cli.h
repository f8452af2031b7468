// launch/cli.h -- command-line and --config parsing for the kiln subcommands.
//
// `kiln train` settings come from, in increasing priority: TrainConfig's defaults, the --model
// preset, a --config FILE.json (an object whose keys are the flag names, with '-' or '_'), a
// --deepspeed FILE.json (DeepSpeed's keys, launch/deepspeed_config.h), and flags. Every value is checked for its type here and the whole config is validated once
// (TrainConfig::validate). Unknown flags, unknown config keys, values of the wrong type and
// malformed files are ConfigErrors with one line naming the culprit -- every unknown flag or key
// at once, each with kiln's name for it where another tool's (the Hugging Face Trainer's,
// nanoGPT's, torchtitan's, a model config's) or a near miss says which.
#pragma once

#include <string>
#include <vector>

#include "data/prep.h"
#include "runtime/trainer/train_config.h"

namespace kiln {

struct TrainArgs {
  TrainConfig config;
  bool help = false;  // --help was given: print help_text and exit 0
  std::string help_text;
};

// args: the arguments after "train"; world_size: the job's ranks (a --deepspeed file's
// train_batch_size is checked against its data-parallel ranks).
TrainArgs parse_train_args(const std::vector<std::string>& args, int world_size = 1);

// `kiln eval --checkpoint PATH [train flags]`: the settings the checkpoint was trained with
// (its trainer_state.json), then the flags given (--val-data, --eval-batches, --micro-batch, the
// layout, the device, the precision...). The result resumes PATH (a checkpoint, or a save dir's
// latest) and evaluates it: no training, no saving, no refusal of changed settings.
TrainArgs parse_eval_args(const std::vector<std::string>& args);

struct PrepArgs {
  PrepConfig config;
  bool help = false;
  std::string help_text;
};

// args: the arguments after "prep".
PrepArgs parse_prep_args(const std::vector<std::string>& args);

}  // namespace kiln
