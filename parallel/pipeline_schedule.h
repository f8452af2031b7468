// parallel/pipeline_schedule.h -- what each pipeline stage does, in order: the 1F1B schedule
// (Narayanan et al., 2021, "PipeDream-Flush"; Megatron-LM's
// forward_backward_pipelining_without_interleaving) and the forward-only one used for
// evaluation. Plain lists of actions, torch-free (it lives in kiln_plan), so the schedule is
// tested on its own -- including a simulation of all stages together -- and the executor only
// walks the list.
//
// pp stages, m micro-batches, stage s in [0, pp). Stage s runs three phases:
//   warm-up    w = min(pp - s - 1, m) forwards (micro-batches 0 .. w-1), no backward;
//   steady     r = m - w iterations of one forward and one backward: forward w + i, then
//              backward i, for i in [0, r);
//   cool-down  the w backwards left, r .. m-1.
// The last stage has w = 0: it alternates F0 B0 F1 B1 ... from the start. With pp == 1 that is
// the whole schedule, with no transfers.
//
// Activation memory: a micro-batch's activations live from its forward to its backward. Stage s
// holds at most w + 1 of them at once in the steady phase (w when r = 0), i.e. min(pp - s, m):
// on the first stage pp however large m grows, where GPipe (all forwards, then all backwards)
// holds m.
//
// Bubble: with every stage taking t_f per forward and t_b per backward, and free transfers, the
// step takes (m + pp - 1)(t_f + t_b), of which each stage computes m(t_f + t_b); the idle
// fraction is
//   bubble = (pp - 1) / (m + pp - 1)        (Narayanan et al. 2021, s2.2)
// the same as GPipe's; 1F1B only bounds the memory.
//
// Transfers and deadlock: activations go to stage s + 1 and their gradients come back to s - 1.
// Between a pair of ranks messages match in posting order (one tag), so the k-th SendActivation
// of s is the k-th RecvActivation of s + 1. Assume sends never buffer: a transfer completes only
// once the peer has posted its counterpart. In the steady phase neighbours s and s + 1 each owe
// the other a tensor at the same moment (s: the activation of forward f; s + 1: the gradient of
// backward b); were each to post its send alone and wait on it before posting its receive, both
// would wait on a send forever. So the transfers of one Exchange are posted together (one NCCL
// group, or non-blocking MPI) and completed together, and each steady Exchange pairs a send with
// the receive from the same neighbour: s's {SendActivation f, RecvGrad b} is met by s + 1's
// {SendGrad b, RecvActivation f}. Every Exchange involves one neighbour, and the Exchanges
// of s with s + 1 mirror those of s + 1 with s one to one, in the same order -- so each wait is
// on a peer that is waiting on the same Exchange or about to reach it.
// tests/test_pipeline_schedule.cpp simulates all stages under exactly that rule.
#pragma once

#include <string>
#include <vector>

namespace kiln {

// One point-to-point transfer of a pipeline stage. Activations flow to stage + 1, their
// gradients back to stage - 1.
struct PipeTransfer {
  enum class Kind { SendActivation, RecvActivation, SendGrad, RecvGrad };
  Kind kind;
  int micro;      // the micro-batch the tensor belongs to
  int chunk = 0;  // this rank's model chunk that sends it or takes it (interleaved schedules;
                  // parallel/pipeline_interleaved.h); 0 with one chunk a rank
  bool operator==(const PipeTransfer& o) const { return kind == o.kind && micro == o.micro && chunk == o.chunk; }
  bool operator!=(const PipeTransfer& o) const { return !(*this == o); }
};

// One action of a stage's schedule, executed in order.
//   Forward m:  the stage's forward of micro-batch m (its input received by an earlier Exchange,
//               or the embedding on the first stage)
//   Backward m: the stage's backward of micro-batch m
//   Exchange:   transfers posted together (one NCCL group / non-blocking MPI) and completed
//               together before the next action
struct PipeAction {
  enum class Type { Forward, Backward, Exchange, BackwardInput, BackwardWeight };
  Type type;
  int micro = -1;                       // Forward / Backward
  std::vector<PipeTransfer> transfers;  // Exchange (never empty)
  int chunk = 0;                        // Forward / Backward: the rank's model chunk (0 with one)
};

// The 1F1B schedule of `stage` in [0, pp) for `micros` >= 1 micro-batches (Narayanan et al.,
// 2021, "PipeDream-Flush"; Megatron-LM's forward_backward_pipelining_without_interleaving).
// Throws std::invalid_argument unless pp >= 1, 0 <= stage < pp and micros >= 1.
std::vector<PipeAction> one_f_one_b(int pp, int stage, int micros);

// Forward passes only (evaluation): recv, forward, send for each micro-batch in order.
std::vector<PipeAction> forward_only(int pp, int stage, int micros);

// (pp - stage - 1) capped at micros: the forwards before the first backward.
int warmup_forwards(int pp, int stage, int micros);

// The bubble fraction of 1F1B: (pp - 1) / (micros + pp - 1).
double bubble_fraction(int pp, int micros);

// "F0 [>A0] [<A1] F1 [>A1 <G0] B0 ..." -- a readable one-line rendering for test failure
// messages and docs: F/B a forward/backward, [..] an Exchange, > send, < receive, A an
// activation, G a gradient, each followed by its micro-batch, and by ":c" when its model chunk
// c is not 0 (interleaved schedules: "F3:1" is micro-batch 3's forward on chunk 1).
std::string to_string(const std::vector<PipeAction>& actions);

}  // namespace kiln
