// runtime/checkpoint.h -- consolidated checkpoints: written by rank 0, committed atomically,
// read by rank 0 and broadcast, so a run resumes exactly on its own layout and on any other.
//
// A save directory holds
//   step_00000020/                 one checkpoint per saved step
//     model.safetensors            weights, fp32, in Hugging Face GPT2LMHeadModel's names and
//                                  layout (Conv1D [in, out], real vocabulary rows only)
//     config.json                  transformers' GPT2Config (absent for GQA models, which
//                                  GPT2LMHeadModel cannot express)
//     optimizer.safetensors        AdamW's exp_avg/<name>, exp_avg_sq/<name>, step/<name> in
//                                  kiln's own names and layout (padded vocabulary rows included)
//     trainer_state.json           step, applied updates (the LR schedule's position and AdamW's
//                                  t), the data position, the loss scaler, the model shape, the
//                                  config and the layout it was saved with, and the CRC-32 of
//                                  every file above
//   latest                         the name of the newest complete checkpoint
//
// Commit protocol (a crash at any point leaves the previous checkpoint intact and `latest`
// naming a complete one):
//   1. write every file into .tmp-step_N-<pid>/, fsync each file and the directory
//   2. rename it to step_N (an existing step_N is first renamed aside, and deleted only after
//      the new one is in place), fsync the save directory
//   3. write latest.tmp, fsync, rename over latest, fsync the save directory
//   4. delete checkpoints older than the newest keep_last (never the one latest names)
// Dropout needs no saved RNG state: its generator is reseeded every step from (seed, step, dp
// rank), so the step number is the RNG state. The data order is a pure function of (seed, sample
// position), so the sample count is the data position.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace kiln {

class AdamW;
class Communicator;
class GPT;

// Where a run stands: what a checkpoint restores besides the tensors.
struct TrainProgress {
  int64_t step = 0;     // optimizer steps done; training continues with step + 1
  int64_t updates = 0;  // steps applied (skipped ones excluded): LR-schedule position, AdamW t
  int64_t samples = 0;  // sequences of the training stream consumed
  nlohmann::json loss_scaler = nlohmann::json::object();  // LossScaler::state()
};

// Writes checkpoints into one save directory. Used on rank 0 only.
class Checkpointer {
 public:
  // keep_last: how many checkpoints to keep (0 = all). Creates the directory if needed.
  Checkpointer(std::string save_dir, int64_t keep_last);
  // Saves and commits; returns the checkpoint's directory. `run` is recorded as the run's
  // config and layout. Throws kiln::Error on any I/O failure, leaving earlier checkpoints as
  // they were.
  std::string save(const GPT& model, const AdamW& optimizer, const TrainProgress& progress,
                   const nlohmann::json& run);

 private:
  std::string dir_;
  int64_t keep_last_;
  int saves_ = 0;
};

// The directory `latest` names in save_dir, or "" when there is none.
std::string latest_checkpoint(const std::string& save_dir);

// The checkpoint --resume asks for: "" for a fresh start. auto: the latest in save_dir if any;
// none: a fresh start, refused when save_dir already holds checkpoints (they would be
// overwritten); PATH: a checkpoint directory, or a save directory with a `latest`.
std::string resolve_resume(const std::string& resume, const std::string& save_dir);

struct Resumed {
  std::string dir;         // the checkpoint loaded
  TrainProgress progress;  // where the run stands
};

// Resolves `resume` (resolve_resume) on rank 0 and, when it names a checkpoint, loads it into
// the model's parameters and the optimizer's state on every rank: rank 0 reads and checks it,
// then broadcasts over `world` (nullptr for a world of one). Returns nothing for a fresh start.
// `optimizer` gives the AdamW to load the state into; it is called only when a checkpoint is
// loaded, so a caller that needs one for nothing else (ZeRO: 8 B per parameter of whole-model
// moments on the host) makes it only then.
// A checkpoint of another model shape, a file whose CRC-32 differs from the recorded one, a
// missing or misshapen tensor: ConfigError or DataError naming the checkpoint and the problem,
// thrown on every rank together.
std::optional<Resumed> resume_training(const std::string& resume, const std::string& save_dir, GPT& model,
                                       const std::function<AdamW&()>& optimizer, Communicator* world);

}  // namespace kiln
