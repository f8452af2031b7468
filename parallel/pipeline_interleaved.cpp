// parallel/pipeline_interleaved.cpp -- the interleaved 1F1B schedule: Megatron's compute order,
// then the transfers placed between the computes (parallel/pipeline_interleaved.h).
#include "parallel/pipeline_interleaved.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace kiln {

namespace {

using Kind = PipeTransfer::Kind;
using Type = PipeAction::Type;

void check_args(const char* fn, int pp, int rank, int chunks, int micros, bool whole_groups) {
  if (pp < 1 || rank < 0 || rank >= pp || chunks < 1 || micros < 1 || (whole_groups && micros % pp != 0)) {
    throw std::invalid_argument(std::string(fn) + ": need pp >= 1, 0 <= rank < pp, chunks >= 1 and micros >= 1" +
                                (whole_groups ? " a multiple of pp" : "") + " (got pp " + std::to_string(pp) + ", rank " +
                                std::to_string(rank) + ", chunks " + std::to_string(chunks) + ", micros " +
                                std::to_string(micros) + ")");
  }
}

struct Compute {
  Type type;
  int micro, chunk;
};

// The k-th forward or backward of a rank (the header's rule).
Compute kth(int pp, int chunks, int k, bool forward) {
  const int i = k % (pp * chunks), group = k / (pp * chunks);
  const int chunk = forward ? i / pp : chunks - 1 - i / pp;
  return {forward ? Type::Forward : Type::Backward, group * pp + i % pp, chunk};
}

// What a compute receives before it runs and sends after, on rank `rank`: the first virtual stage
// (rank 0's chunk 0) receives no activation and sends no gradient; the last (rank pp-1's chunk
// chunks-1) sends no activation and receives no gradient.
struct Edges {
  int pp, rank, chunks;
  bool first(int chunk) const { return rank == 0 && chunk == 0; }
  bool last(int chunk) const { return rank == pp - 1 && chunk == chunks - 1; }
  std::vector<PipeTransfer> before(const Compute& c) const {
    if (c.type == Type::Forward) {
      if (first(c.chunk)) return {};
      return {{Kind::RecvActivation, c.micro, c.chunk}};
    }
    if (last(c.chunk)) return {};
    return {{Kind::RecvGrad, c.micro, c.chunk}};
  }
  std::vector<PipeTransfer> after(const Compute& c) const {
    if (c.type == Type::Forward) {
      if (last(c.chunk)) return {};
      return {{Kind::SendActivation, c.micro, c.chunk}};
    }
    if (first(c.chunk)) return {};
    return {{Kind::SendGrad, c.micro, c.chunk}};
  }
};

// The computes in steps (a warm-up forward; a steady forward and backward; a cool-down
// backward), with one Exchange between two steps: the outputs of the step just done and the
// inputs of the next one -- Megatron's send_forward_backward_recv_forward_backward. The next
// backward's gradient is thus asked for before the next forward runs, not just before the
// backward: posted late, two ranks each sending a gradient the other asks for only after its
// next forward deadlock (pp 2, two chunks, m 4).
std::vector<PipeAction> place_transfers(const std::vector<std::vector<Compute>>& steps, const Edges& edges) {
  std::vector<PipeAction> out;
  std::vector<PipeTransfer> pending;  // sends of the step just done
  for (const std::vector<Compute>& step : steps) {
    std::vector<PipeTransfer> ex = std::move(pending);
    pending.clear();
    for (const Compute& c : step)
      for (const PipeTransfer& t : edges.before(c)) ex.push_back(t);
    if (!ex.empty()) out.push_back({Type::Exchange, -1, std::move(ex)});
    for (const Compute& c : step) {
      out.push_back({c.type, c.micro, {}, c.chunk});
      for (const PipeTransfer& t : edges.after(c)) pending.push_back(t);
    }
  }
  if (!pending.empty()) out.push_back({Type::Exchange, -1, std::move(pending)});
  return out;
}

}  // namespace

int interleaved_warmup(int pp, int rank, int chunks, int micros) {
  check_args("interleaved_warmup", pp, rank, chunks, micros, true);
  const int total = micros * chunks;
  if (micros == pp) return total;
  return std::min(2 * (pp - rank - 1) + (chunks - 1) * pp, total);
}

int interleaved_live_chunks(int pp, int rank, int chunks, int micros) {
  return std::min(interleaved_warmup(pp, rank, chunks, micros) + 1, micros * chunks);
}

std::string interleaved_rule(int pp, int chunks, int micros) {
  if (chunks < 1) return "--pp-virtual must be at least 1 (got " + std::to_string(chunks) + ")";
  if (pp < 2 && chunks > 1) return "--pp-virtual " + std::to_string(chunks) + " needs --pp of 2 or more";
  if (micros < 1 || micros % pp != 0) {
    const int fit = std::max(pp, (micros + pp - 1) / pp * pp);
    return "the interleaved schedule needs --grad-accum (micro-batches a step) a multiple of --pp " +
           std::to_string(pp) + " (got " + std::to_string(micros) + "; " + std::to_string(fit) + " works)";
  }
  return "";
}

double interleaved_bubble_fraction(int pp, int chunks, int micros) {
  check_args("interleaved_bubble_fraction", pp, 0, chunks, micros, false);
  return double(pp - 1) / double(micros * chunks + pp - 1);
}

std::vector<PipeAction> interleaved_one_f_one_b(int pp, int rank, int chunks, int micros) {
  check_args("interleaved_one_f_one_b", pp, rank, chunks, micros, true);
  const int total = micros * chunks, warmup = interleaved_warmup(pp, rank, chunks, micros);
  std::vector<std::vector<Compute>> steps;
  for (int k = 0; k < warmup; ++k) steps.push_back({kth(pp, chunks, k, true)});
  for (int k = 0; k < total - warmup; ++k) steps.push_back({kth(pp, chunks, warmup + k, true), kth(pp, chunks, k, false)});
  for (int k = total - warmup; k < total; ++k) steps.push_back({kth(pp, chunks, k, false)});
  return place_transfers(steps, {pp, rank, chunks});
}

std::vector<PipeAction> interleaved_forward_only(int pp, int rank, int chunks, int micros) {
  check_args("interleaved_forward_only", pp, rank, chunks, micros, false);
  std::vector<std::vector<Compute>> steps;  // the training order's forwards: groups of pp micro-batches (the last may be short)
  for (int g = 0; g < micros; g += pp)
    for (int c = 0; c < chunks; ++c)
      for (int j = g; j < std::min(g + pp, micros); ++j) steps.push_back({{Type::Forward, j, c}});
  return place_transfers(steps, {pp, rank, chunks});
}

}  // namespace kiln
