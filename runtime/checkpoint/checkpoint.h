// runtime/checkpoint/checkpoint.h -- consolidated checkpoints: written by rank 0 one tensor at a time,
// committed atomically, read by rank 0 one tensor at a time and scattered, so a run resumes
// exactly on its own layout and on any other, whatever the model's size.
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
// Streaming. Every rank runs the save (collective): the tensors are gathered onto rank 0 one at a
// time, in the order the files lay them out (runtime/checkpoint/consolidate.h), and rank 0 writes each into
// files whose headers it wrote first (runtime/checkpoint/safetensors.h: SafetensorsWriter), keeping the
// CRC-32 as it goes. A resume is the reverse: rank 0 checks the files (state, shapes, CRC-32s),
// then reads one tensor at a time and scatters it; each rank keeps its part. Rank 0's extra host
// memory is one whole tensor plus its layout conversion, whatever the model's size; no rank ever
// holds the whole model or optimizer state. The files are those a whole-model writer makes, byte
// for byte.
//
// Commit protocol (a crash at any point leaves the previous checkpoint intact and `latest`
// naming a complete one, or a state the next resume repairs):
//   1. write every file into .tmp-step_N-<pid>/, fsync each file and the directory
//   2. rename it to step_N (an existing step_N is first renamed to .old-step_N-<pid>, and deleted
//      only after the new one is in place), fsync the save directory
//   3. write latest.tmp, fsync, rename over latest, fsync the save directory
//   4. delete checkpoints older than the newest keep_last (never the one latest names)
// A crash between the two renames of 2 leaves `latest` naming a step_N that is gone: the next
// resume moves the complete .old-step_N-* back (or, failing that, takes the newest complete
// checkpoint) and says so; a save clears .old-* directories whose step is in place again. A
// step_N that is there without its trainer_state.json (written last) is incomplete: the resume
// falls back the same way, with a warning naming the missing file.
// Dropout needs no saved RNG state: its generator is reseeded every step from (seed, step, dp
// rank), so the step number is the RNG state. The data order is a pure function of (seed, sample
// position), so the sample count is the data position.
//
// Test hooks (never set in a real run): KILN_TEST_CRASH_IN_SAVE=k kills rank 0 (SIGKILL) in its
// k-th save, at KILN_TEST_CRASH_POINT: "weights" (default: after model.safetensors, before the
// commit) or "aside" (after the old step_N is moved aside, before the new one moves in);
// KILN_TEST_SLOW_SAVE_S=x makes rank 0 sleep x seconds in each save, before the commit.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln {

class Communicator;
class WholeModel;
struct GPTConfig;

// Where a run stands: what a checkpoint restores besides the tensors.
struct TrainProgress {
  int64_t step = 0;     // optimizer steps done; training continues with step + 1
  int64_t updates = 0;  // steps applied (skipped ones excluded): LR-schedule position, AdamW t
  int64_t samples = 0;  // sequences of the training stream consumed
  nlohmann::json loss_scaler = nlohmann::json::object();  // LossScaler::state()
  // Stream positions [start, end) never trained on (spike rollbacks' windows; data/loader.h)
  std::vector<std::pair<int64_t, int64_t>> skipped_samples;
  int64_t rollbacks = 0;  // spike rollbacks made so far (--max-rollbacks)
};

// What a save or a load moved, measured on rank 0.
struct CheckpointIo {
  int64_t bytes = 0;              // of the checkpoint's files
  double seconds = 0.0;           // wall time of the whole save / load
  double peak_extra_bytes = 0.0;  // rank 0's resident memory above its level at the start,
                                  // highest of the samples taken after each tensor
  nlohmann::json to_json() const;
};

// Writes checkpoints into one save directory. Every rank makes one and calls save() together;
// world rank 0 (WholeModel::writer) writes.
class Checkpointer {
 public:
  // keep_last: how many checkpoints to keep (0 = all). The writer creates the directory if needed.
  // The checkpoint save_dir/best names (mark_best) is never deleted by retention.
  Checkpointer(std::string save_dir, int64_t keep_last, bool writer);
  // The writer points save_dir/best at step's checkpoint (written as `latest` is: a temporary
  // file, fsync, rename), which retention then keeps. Called after that step's save.
  void mark_best(int64_t step);
  // A spike rollback (runtime/trainer/spike_guard.h): the newest complete checkpoint of a step below
  // `step` ("" when there is none; read on the writer, "" elsewhere), and `latest` pointed back at
  // a step's checkpoint (written as `latest` always is: a temporary file, fsync, rename).
  std::string newest_before(int64_t step) const;
  void point_latest(int64_t step);
  // Collective over the world. Saves and commits; returns the checkpoint's directory on the
  // writer ("" elsewhere). `run` is recorded as the run's config and layout. Throws kiln::Error on
  // any I/O failure, leaving earlier checkpoints as they were.
  std::string save(WholeModel& state, const TrainProgress& progress, const nlohmann::json& run, CheckpointIo* io = nullptr);
  // The run's tokenizer, saved with every checkpoint: `files` (name -> contents: tokenizer.json
  // and tokenizer_config.json, data/hf_tokenizer.h's tokenizer_files, what AutoTokenizer loads)
  // and its end-of-text id `eot`, config.json's bos/eos; `ends`, the ids a sample ends at where
  // they are not eot (Llama 3's: <|end_of_text|>, <|eot_id|>, after documents opened by
  // <|begin_of_text|>), the Llama family's eos. Not called: no such files, and bos = eos =
  // vocab_size - 1. `eot_text`: eot's token as text (Tokenizer::eot_text), config.json's "prefix".
  void set_tokenizer(std::map<std::string, std::string> files, int64_t eot, std::vector<int64_t> ends = {},
                     std::string eot_text = "") {
    tokenizer_files_ = std::move(files);
    eot_ = eot;
    ends_ = std::move(ends);
    eot_text_ = std::move(eot_text);
  }

 private:
  std::map<std::string, std::string> tokenizer_files_;
  int64_t eot_ = -1;
  std::vector<int64_t> ends_;  // empty: eot
  std::string eot_text_;       // empty: no prefix
  std::string dir_;
  int64_t keep_last_;
  int64_t best_step_ = -1;  // kept by retention
  bool writer_;
  int saves_ = 0;
};

// The directory `latest` names in save_dir, or "" when there is none (it is not checked).
std::string latest_checkpoint(const std::string& save_dir);

// A checkpoint given on the command line (kiln eval, kiln sample): `path` itself, or the checkpoint
// a save dir's `latest` names, or a Hugging Face model directory (is_hf_model_dir) as it is.
// ConfigError, one line prefixed with `command`, when it is none of these.
std::string resolve_checkpoint_dir(const std::string& path, const std::string& command);

// The files a kiln checkpoint's trainer_state.json records ("files": name -> the CRC-32 written
// with it) that `check(name)` selects, read through against it: DataError "<where>: NAME is
// corrupt (CRC-32 got, recorded want)<hint>", or "<where>: NAME is missing" when `missing_ok(name)`
// is false (a missing file it allows is passed over). Returns the bytes of the files read. The one
// check of resume, --init-from and kiln sample.
int64_t check_recorded_files(const std::string& dir, const nlohmann::json& files, const std::string& where,
                             const std::function<bool(const std::string&)>& check,
                             const std::function<bool(const std::string&)>& missing_ok, const std::string& hint = "");

// Whether `path` is a Hugging Face model directory rather than a kiln checkpoint or save dir:
// save_pretrained's config.json and model.safetensors, no trainer_state.json, no `latest`.
bool is_hf_model_dir(const std::string& path);

// The checkpoint --resume asks for: "" for a fresh start. auto: the latest in save_dir if any;
// none: a fresh start, refused when save_dir already holds checkpoints (they would be
// overwritten); PATH: a checkpoint directory, or a save directory with a `latest`. When `latest`
// names a checkpoint that is gone (a save interrupted between its renames), the save directory is
// repaired as the commit protocol says and `notice` (when given) says how.
std::string resolve_resume(const std::string& resume, const std::string& save_dir, std::string* notice = nullptr);

struct Resumed {
  std::string dir;         // the checkpoint loaded
  TrainProgress progress;  // where the run stands
  CheckpointIo io;         // what the load moved (rank 0's figures)
  std::string notice;      // a repair of the save directory, or ""
  nlohmann::json run;      // what the saving run recorded of itself: {"config", "world", "dp"}
};

// Collective over the world. Resolves `resume` (resolve_resume) on rank 0 and, when it names a
// checkpoint, checks it there (its state, every tensor's name and shape, every file's CRC-32) and
// streams its tensors into every rank's part of the model and AdamW state (WholeModel::scatter).
// Returns nothing for a fresh start. A checkpoint of another model shape, a file whose CRC-32
// differs from the recorded one, a missing or misshapen tensor: ConfigError or DataError naming
// the checkpoint and the problem, thrown on every rank together. host_world: the world's host
// group (nullptr for a world of one). weights_only (`kiln eval`): optimizer.safetensors is neither
// needed nor read, and the AdamW state stays as built; the rest as above. A tensor that holds NaN
// or infinity (weights or AdamW state) refuses the checkpoint, naming it (runtime/checkpoint/
// finite_check.h). `flag`: the command's flag for a checkpoint, which the hints name (--resume;
// kiln eval's --checkpoint).
std::optional<Resumed> resume_training(const std::string& resume, const std::string& save_dir, WholeModel& state,
                                       Communicator* host_world, bool weights_only = false,
                                       const std::string& flag = "--resume");

// Collective over the world. The weights of `dir` only (its model.safetensors in Hugging Face
// GPT2LMHeadModel's layout: a kiln checkpoint's, or transformers' save_pretrained's) into every
// rank's part of the model, through resume_training's own path (rank 0 checks every tensor's name
// and shape first, then reads one tensor at a time and scatters it); AdamW's state is not touched
// (a fresh optimizer: fine-tuning, --init-from, runtime/checkpoint/init_from.h). The file's position table
// may be longer than the model's context: its first seq_len rows are taken (nanoGPT's
// crop_block_size). A kiln checkpoint's model.safetensors is checked against its recorded CRC-32,
// and every tensor for NaN and infinity (runtime/checkpoint/finite_check.h). Problems are a
// ConfigError or DataError "<flag> <dir>: ..." (the command's flag for the directory: --init-from,
// kiln eval's --checkpoint), thrown on every rank together.
CheckpointIo load_weights(const std::string& dir, WholeModel& state, Communicator* host_world,
                          const std::string& flag = "--init-from");

}  // namespace kiln
