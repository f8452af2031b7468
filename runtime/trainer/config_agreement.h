// runtime/trainer/config_agreement.h -- every rank of a job runs the same settings, checked at
// start-up.
//
// mpirun starts each rank with its own command line (an MPMD launch, a node's wrapper script, an
// environment variable expanded differently), and ranks that disagree on the layout or the
// schedule do not fail: they post collectives that never match and wait until the watchdog's
// start-up grace (--comm-init-timeout, 900 s by default) ends the job with a line about a stalled
// collective, not about the flags. So before any other collective each rank hashes its settings
// (TrainConfig::to_json(), less the outputs only rank 0 writes: log_json, tensorboard, and with
// --device replaced by the kind of device the rank resolved it to: a launcher's per-rank
// `--device cuda:$LOCAL_RANK`, or `auto` beside `cuda`, is the same setting; cuda beside cpu is
// not) and the hashes are all-gathered over the host group (8 bytes a rank). Equal everywhere: nothing more.
// Otherwise -- rare, so its cost does not matter -- the settings themselves are all-gathered (a few
// KB a rank) and every rank finds the same first differing setting and throws the same
// ConfigError: one line on rank 0, exit code 2, at once.
#pragma once

#include <string>

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

namespace kiln {

class Communicator;

// "" when every rank of `host` (the host group: MPI, host tensors) was given the same `config`
// (TrainConfig::to_json()) and computes on the same kind of `device` (the one it resolved --device
// to); otherwise one line naming the first differing setting, the value on rank 0 and on the
// first rank that differs, and how many ranks differ. The same on every rank. Collective over `host`.
std::string config_disagreement(const nlohmann::json& config, const c10::Device& device, Communicator& host);

// The settings compared: `config` without the outputs rank 0 alone writes, its "device" the
// resolved kind `device_kind` ("cpu", "cuda") rather than the text given (no index, no "auto").
nlohmann::json compared_settings(const nlohmann::json& config, const std::string& device_kind);

}  // namespace kiln
