// parallel/group_capsule.h -- a process group carried into an autograd function's backward.
//
// ctx->saved_data holds IValues only; a capsule wraps the group's shared pointer.
#pragma once

#include <memory>
#include <utility>

#include <ATen/core/ivalue.h>

#include "distributed/comm.h"

namespace kiln {

struct GroupHolder : torch::CustomClassHolder {
  explicit GroupHolder(std::shared_ptr<Communicator> c) : comm(std::move(c)) {}
  std::shared_ptr<Communicator> comm;
};

inline at::IValue group_capsule(const std::shared_ptr<Communicator>& group) {
  return at::IValue::make_capsule(c10::make_intrusive<GroupHolder>(group));
}

inline Communicator& group_in(const at::IValue& capsule) {
  return *c10::static_intrusive_pointer_cast<GroupHolder>(capsule.toCapsule())->comm;
}

}  // namespace kiln
