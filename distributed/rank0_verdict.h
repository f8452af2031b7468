// distributed/rank0_verdict.h -- a check only rank 0 makes (it alone looks at the save directory or
// the checkpoint), decided on every rank together.
//
// If rank 0 alone threw, it would leave the job (a banner, MPI_Abort) while the others wait for it
// in their next collective. Instead its verdict -- nothing, or the kind and message of the
// kiln::Error it threw -- travels to every rank, and every rank throws the same error: the job
// ends with rank 0's one line and the error's exit code (launch/main.cpp).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace kiln {

class Communicator;

// Runs `check` on rank 0 of `host` (a host group: MPI, no device; nullptr in a world of one) and
// throws what it threw, as the same kind of kiln::Error with the same message, on every rank.
// Collective over `host`.
void decide_on_rank0(Communicator* host, const std::function<void()>& check);

// `s` on rank 0 of `host`, on every rank (a length, then the bytes; host tensors).
std::string broadcast_string(Communicator& host, const std::string& s);

// Every rank's `mine`, in rank order, on every rank (the lengths, then the bytes padded to the
// longest; host tensors). Collective over `host`.
std::vector<std::string> all_gather_strings(Communicator& host, const std::string& mine);

// Every rank's `mine` (the same count on every rank), concatenated in rank order, on every rank.
// Collective over `host` (host tensors: an MPI group without a device, never NCCL); null or a
// group of one: `mine`.
std::vector<double> all_gather_doubles(Communicator* host, const std::vector<double>& mine);

}  // namespace kiln
