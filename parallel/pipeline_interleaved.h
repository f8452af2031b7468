// parallel/pipeline_interleaved.h -- the interleaved 1F1B schedule (Narayanan et al., 2021,
// "Efficient Large-Scale Language Model Training on GPU Clusters", s2.2; Megatron-LM's
// forward_backward_pipelining_with_interleaving): each of p ranks holds V model chunks, and
// the pipeline's bubble shrinks V-fold. Torch-free (kiln_plan), like the 1F1B schedule of
// parallel/pipeline_schedule.h, whose actions it emits.
//
// Layout. The blocks are split into p V virtual stages (parallel/pipeline_layout.h's counts for
// p V stages); rank r holds virtual stages r, r + p, .., r + (V - 1) p as its chunks 0 .. V-1,
// so virtual stage v = c p + r is chunk c of rank v mod p. A micro-batch goes through the ranks
// V times around the ring: rank r's chunk c sends its output to rank r + 1's chunk c, and rank
// p - 1's chunk c to rank 0's chunk c + 1. The embedding is rank 0's chunk 0, the loss rank
// p - 1's chunk V - 1.
//
// Order (Megatron's). m micro-batches, m a multiple of p (the rule below needs whole groups of p).
// Each rank runs m V forwards and m V backwards of chunks; the k-th of each (k in [0, m V)) is
//   group g = k div (p V), i = k mod (p V):  micro-batch g p + (i mod p),
//   chunk i div p (forward), V - 1 - (i div p) (backward)
// -- p micro-batches through chunk 0, the same p through chunk 1, .., then the next group.
// Rank r warms up with W_r forwards, then alternates forward W_r + j and backward j, then runs
// the W_r backwards left:
//   W_r = min(2 (p - r - 1) + (V - 1) p, m V),   or m V (all forwards first) when m = p.
// The 2 (p - r - 1) (1F1B has p - r - 1) covers the round trip of a gradient through the later
// ranks; (V - 1) p fills the first group's earlier chunks.
//
// Transfers. Between two computes a rank posts one Exchange: the output of the compute just done
// (an activation to the next virtual stage, or an input gradient to the previous one) and the
// inputs the next compute needs that have not arrived (the activation from the previous virtual
// stage, or the output gradient from the next). The rank's peers are r + 1 and r - 1 on the
// ring (mod p): with p = 2 both are the other rank. tests/test_pipeline_interleaved.cpp runs all
// ranks together under sends that never buffer and messages matched in posting order per pair of
// ranks (NCCL's rule, and the MPI backend's one tag), and checks that no (p, V, m) deadlocks or
// mismatches a message.
//
// Bubble. With a chunk's forward t_f / V and backward t_b / V (t_f, t_b: a whole stage's, as in
// 1F1B), the step takes (m V + p - 1)(t_f + t_b) / V, of which each rank computes m (t_f + t_b):
//   bubble = (p - 1) / (m V + p - 1)  of the step,   (p - 1) / (m V)  of the ideal step
// (Narayanan et al. 2021, s2.2) -- 1F1B's with m V in place of m. The price: V times the
// point-to-point messages (each micro-batch crosses p V - 1 boundaries, not p - 1), and rank r
// holding W_r + 1 chunks' activations at once, at most (2 p - 2 + (V - 1) p + 1) / V stages'
// worth on rank 0 -- p (1 + (p - 1) / (p V)) micro-batches of a stage, against 1F1B's p.
#pragma once

#include <string>
#include <vector>

#include "parallel/pipeline_schedule.h"

namespace kiln {

// The interleaved 1F1B schedule of `rank` in [0, pp) holding `chunks` >= 1 model chunks, for
// `micros` micro-batches. Throws std::invalid_argument unless pp >= 1, 0 <= rank < pp, chunks >= 1
// and micros a positive multiple of pp (interleaved_rule() says it in words).
std::vector<PipeAction> interleaved_one_f_one_b(int pp, int rank, int chunks, int micros);

// Forward passes only (evaluation), in the training order's forwards: groups of pp micro-batches
// (the last one may be short: any micros >= 1), each group through chunk 0, then chunk 1, ..
std::vector<PipeAction> interleaved_forward_only(int pp, int rank, int chunks, int micros);

// W_r above: the forwards rank `rank` runs before its first backward.
int interleaved_warmup(int pp, int rank, int chunks, int micros);

// "" when interleaved_one_f_one_b(pp, ., chunks, micros) exists, else one line saying the rule
// (the trainer's and kiln plan's refusal).
std::string interleaved_rule(int pp, int chunks, int micros);

// The idle share of the step: (pp - 1) / (micros chunks + pp - 1).
double interleaved_bubble_fraction(int pp, int chunks, int micros);

// The most chunk forwards rank `rank` holds at once (min(W_r + 1, m V)).
int interleaved_live_chunks(int pp, int rank, int chunks, int micros);

}  // namespace kiln
