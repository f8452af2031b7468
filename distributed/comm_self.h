// distributed/comm_self.h -- the group of one rank: every collective is local, and nothing is made.
//
// A mesh axis of size 1 (tp 1, pp 1, the cp group at cp 1, ...) is still a group that code may hand
// a tensor to. Backed by NCCL it was a communicator of its own -- buffers, a proxy thread, a
// stream -- for a group that never sends a byte (issue 34, defect 7); by MPI an MPI_Comm_split.
// Here, over one rank:
//   all_reduce (any op), broadcast    the tensor as it is
//   reduce_scatter, all_gather        out = in (the one chunk is the whole)
//   all_to_all                        out = in (the one block; splits empty or {rows})
//   send_recv                         no peer: any op is an error; none is a no-op
//   barrier                           returns
//   split                             another group of one
// The copies run on the caller's current stream, so they are ordered after its work as a backend's
// collective is. Tensors must be defined and contiguous; host memory is taken (no backend sees it,
// on a GPU either: the device check's rule is for the groups that reach one). Traffic is counted
// in comm.h's unit, as a backend counts a group of one: comm_bytes does not depend on which of the
// two a group of one is.
#pragma once

#include <memory>
#include <string>

#include "distributed/comm.h"

namespace kiln {

// A group of one named `name` ("tp", ...), reporting `backend` (the run's, for messages).
std::shared_ptr<Communicator> make_self_communicator(const std::string& name, const char* backend);

}  // namespace kiln
