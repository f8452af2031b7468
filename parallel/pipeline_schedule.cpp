// parallel/pipeline_schedule.cpp -- the 1F1B and forward-only schedules as lists of actions,
// built phase by phase as parallel/pipeline_schedule.h describes.
#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <initializer_list>
#include <stdexcept>
#include <utility>

namespace kiln {

namespace {

using Kind = PipeTransfer::Kind;

void check_args(const char* fn, int pp, int stage, int micros) {
  if (pp < 1 || stage < 0 || stage >= pp || micros < 1)
    throw std::invalid_argument(std::string(fn) + ": need pp >= 1, 0 <= stage < pp and micros >= 1 (got pp " +
                                std::to_string(pp) + ", stage " + std::to_string(stage) + ", micros " +
                                std::to_string(micros) + ")");
}

// Appends a stage's actions, dropping the transfers the stage does not do: the first stage
// receives no activation and sends no gradient, the last sends no activation and receives no
// gradient. An Exchange left with no transfer is not added.
class Builder {
 public:
  Builder(int pp, int stage) : first_(stage == 0), last_(stage == pp - 1) {}

  void forward(int m) { out_.push_back({PipeAction::Type::Forward, m, {}}); }
  void backward(int m) { out_.push_back({PipeAction::Type::Backward, m, {}}); }
  void exchange(std::initializer_list<PipeTransfer> transfers) {
    PipeAction a{PipeAction::Type::Exchange, -1, {}};
    for (const PipeTransfer& t : transfers)
      if (does(t.kind)) a.transfers.push_back(t);
    if (!a.transfers.empty()) out_.push_back(std::move(a));
  }
  std::vector<PipeAction> take() { return std::move(out_); }

 private:
  bool does(Kind k) const {
    switch (k) {
      case Kind::RecvActivation:
      case Kind::SendGrad:
        return !first_;
      case Kind::SendActivation:
      case Kind::RecvGrad:
        return !last_;
    }
    return false;
  }

  bool first_, last_;
  std::vector<PipeAction> out_;
};

}  // namespace

int warmup_forwards(int pp, int stage, int micros) {
  check_args("warmup_forwards", pp, stage, micros);
  return std::min(pp - stage - 1, micros);
}

double bubble_fraction(int pp, int micros) {
  check_args("bubble_fraction", pp, 0, micros);
  return double(pp - 1) / double(micros + pp - 1);
}

std::vector<PipeAction> one_f_one_b(int pp, int stage, int micros) {
  check_args("one_f_one_b", pp, stage, micros);
  const int warmup = warmup_forwards(pp, stage, micros);
  const int remaining = micros - warmup;
  Builder b(pp, stage);

  // Warm-up: forwards 0 .. warmup-1, each received from the stage before and sent on at once.
  for (int i = 0; i < warmup; ++i) {
    b.exchange({{Kind::RecvActivation, i}});
    b.forward(i);
    b.exchange({{Kind::SendActivation, i}});
  }

  // Steady: one forward, one backward. The input of the first steady forward is received here;
  // each later one together with the previous backward's gradient send.
  if (remaining > 0) b.exchange({{Kind::RecvActivation, warmup}});
  for (int i = 0; i < remaining; ++i) {
    const int f = warmup + i, bw = i;
    b.forward(f);
    b.exchange({{Kind::SendActivation, f}, {Kind::RecvGrad, bw}});
    b.backward(bw);
    if (i == remaining - 1)
      b.exchange({{Kind::SendGrad, bw}});
    else
      b.exchange({{Kind::SendGrad, bw}, {Kind::RecvActivation, f + 1}});
  }

  // Cool-down: the warm-up's micro-batches, backwarded in order.
  for (int bw = remaining; bw < micros; ++bw) {
    b.exchange({{Kind::RecvGrad, bw}});
    b.backward(bw);
    b.exchange({{Kind::SendGrad, bw}});
  }
  return b.take();
}

std::vector<PipeAction> forward_only(int pp, int stage, int micros) {
  check_args("forward_only", pp, stage, micros);
  Builder b(pp, stage);
  for (int i = 0; i < micros; ++i) {
    b.exchange({{Kind::RecvActivation, i}});
    b.forward(i);
    b.exchange({{Kind::SendActivation, i}});
  }
  return b.take();
}

std::string to_string(const std::vector<PipeAction>& actions) {
  std::string s;
  for (const PipeAction& a : actions) {
    if (!s.empty()) s += ' ';
    switch (a.type) {
      case PipeAction::Type::Forward:
        s += 'F' + std::to_string(a.micro);
        if (a.chunk) s += ':' + std::to_string(a.chunk);
        break;
      case PipeAction::Type::Backward:
      case PipeAction::Type::BackwardInput:
      case PipeAction::Type::BackwardWeight:
        s += a.type == PipeAction::Type::Backward ? 'B' : a.type == PipeAction::Type::BackwardInput ? 'I' : 'W';
        s += std::to_string(a.micro);
        if (a.chunk) s += ':' + std::to_string(a.chunk);
        break;
      case PipeAction::Type::Exchange:
        s += '[';
        for (size_t i = 0; i < a.transfers.size(); ++i) {
          const PipeTransfer& t = a.transfers[i];
          if (i) s += ' ';
          const bool send = t.kind == Kind::SendActivation || t.kind == Kind::SendGrad;
          const bool act = t.kind == Kind::SendActivation || t.kind == Kind::RecvActivation;
          s += send ? '>' : '<';
          s += act ? 'A' : 'G';
          s += std::to_string(t.micro);
          if (t.chunk) s += ':' + std::to_string(t.chunk);
        }
        s += ']';
        break;
    }
  }
  return s;
}

}  // namespace kiln
