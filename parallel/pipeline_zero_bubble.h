// parallel/pipeline_zero_bubble.h -- the ZB-H1 schedule (Qi et al., 2023, "Zero Bubble Pipeline
// Parallelism", s3.1; the order of the authors' handcrafted ZeroBubbleH1Pipeline): 1F1B with
// each backward split into its input-gradient half I (what the stage before waits for) and its
// weight-gradient half W (what nobody waits for), the W's moved to fill the bubble. Torch-free
// (kiln_plan), built from parallel/pipeline_schedule.h's 1F1B actions; the executor splits the
// backward as parallel/backward_split.h describes.
//
// Stage s of p, m micro-batches. Take 1F1B's actions -- its p - s - 1 warm-up forwards, its
// steady forward / backward steps, its cool-down backwards -- and its Exchanges, unchanged;
// replace each backward by I, and add the W's, oldest first: none for the first s I's (their W's
// are deferred), then one for each later I -- in the steady phase just before the Exchange that
// sends the I's gradient and takes the next forward's input, in the cool-down just after the
// Exchange that sends it -- and the W's left at the end. Stage 0 keeps the fused backward (it
// sends no input gradient: nothing would wait less).
// Why those places: an Exchange completes when both neighbours have posted it (sends never
// buffer, parallel/pipeline_schedule.h). In the steady phase the stage before reaches its side of
// [>G b <A f+1] only after its next forward, so a W placed after that Exchange would start late,
// the stage idling in it; placed before, the W fills that wait. In the cool-down the stage before
// waits for the gradient itself, so it goes first and the W runs while it is used.
//
// Bubble: with F, I and W of equal time t (1F1B's backward I + W: 2t), 1F1B idles 3 (p - 1) t a
// step and ZB-H1 (p - 1) t -- a third, for m >= p. In general, every stage's passes taking t_F,
// t_I, t_W with t_W <= min(t_F, t_I):
//     idle = (p - 1)(t_F + t_I - t_W) + max(0, p - m) t_W
// (tests/test_pipeline_zero_bubble.cpp simulates it under those exchange rules for integer times
// up to 6 / 8 / 6, p 1-6, m 1-10). A transformer stage always has t_W <= min(t_F, t_I): W is the
// weight GEMMs' 2 FLOPs per parameter and token, F the same 2 plus attention's 4 d T, I the input
// GEMMs' 2 plus attention's backward 8 d T (plus what selective recomputation repeats). Memory: a deferred
// micro-batch keeps its graph until its W, so stage s holds up to (p - s) + s = p micro-batches'
// activations, 1F1B's stage-0 figure, on every stage: the peak unchanged ("the same memory as
// 1F1B"), the later stages fuller.
#pragma once

#include <string>
#include <vector>

#include "parallel/pipeline_schedule.h"

namespace kiln {

// The ZB-H1 schedule of `stage` in [0, pp) for `micros` >= 1 micro-batches. Throws
// std::invalid_argument as one_f_one_b does.
std::vector<PipeAction> zb_h1(int pp, int stage, int micros);

// "" when ZB-H1 runs with this layout, else one line saying why not (the trainer's and kiln plan's
// refusal): it needs pp >= 2 and one chunk a stage, and is not built with ZeRO-3 or full recomputation.
std::string zb_h1_rule(int pp, int chunks, int zero, bool full_recompute);

// The idle time of a step (above) whose stages' forward, input-gradient and weight-gradient passes
// take t_f, t_i, t_w. Throws std::invalid_argument unless pp, micros >= 1 and
// 0 <= t_w <= min(t_f, t_i) (beyond it the formula does not hold).
double zb_h1_idle(int pp, int micros, double t_f, double t_i, double t_w);

// The idle share of a step whose forward, input-gradient and weight-gradient passes take equal
// times: idle / (3 micros + idle) with idle = (pp - 1) + max(0, pp - micros) passes -- (pp - 1)
// for micros >= pp (1F1B: 3 (pp - 1) at any micros).
double zb_h1_bubble_fraction(int pp, int micros);

}  // namespace kiln
