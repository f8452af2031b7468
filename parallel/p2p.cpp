// parallel/p2p.cpp -- one schedule step's sends and receives, posted together.
#include "parallel/p2p.h"

#include <ATen/ATen.h>

#include "distributed/error.h"

namespace kiln {

StageTransfers exchange(Communicator& pp, int stage, const std::vector<PipeTransfer>& transfers,
                        const std::function<at::Tensor(const PipeTransfer&)>& outgoing, at::IntArrayRef shape,
                        const at::TensorOptions& options) {
  StageTransfers in;
  std::vector<P2POp> ops;
  const int n = pp.size(), next = (stage + 1) % n, prev = (stage + n - 1) % n;
  for (const auto& t : transfers) {
    switch (t.kind) {
      case PipeTransfer::Kind::SendActivation:
      case PipeTransfer::Kind::SendGrad: {
        at::Tensor x = outgoing(t);
        if (x.scalar_type() != options.dtype().toScalarType() || x.sizes() != shape || !x.is_contiguous()) {
          throw Error("pipeline stage " + std::to_string(stage) + ": micro-batch " + std::to_string(t.micro) + " chunk " +
                      std::to_string(t.chunk) + "'s " +
                      (t.kind == PipeTransfer::Kind::SendActivation ? "activation" : "gradient") + " is " +
                      std::string(c10::toString(x.scalar_type())) + " " + c10::str(x.sizes()) +
                      "; the stages exchange contiguous " + std::string(c10::toString(options.dtype().toScalarType())) + " " +
                      c10::str(shape));
        }
        ops.push_back({P2POp::Kind::Send, x, t.kind == PipeTransfer::Kind::SendActivation ? next : prev});
        break;
      }
      case PipeTransfer::Kind::RecvActivation:
      case PipeTransfer::Kind::RecvGrad: {
        const bool act = t.kind == PipeTransfer::Kind::RecvActivation;
        at::Tensor buf = at::empty(shape, options);
        (act ? in.activations : in.grads)[{t.micro, t.chunk}] = buf;
        ops.push_back({P2POp::Kind::Recv, buf, act ? prev : next});
        break;
      }
    }
  }
  pp.send_recv(ops)->wait();
  return in;
}

}  // namespace kiln
