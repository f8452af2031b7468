// plan/cost_model.h -- kiln's cost model: compute, memory, communication, time and energy of
// training a GPT with a given layout on a given cluster. Pure arithmetic: no LibTorch, no I/O.
//
// Notation: P = parameters of the FLOP count (kiln's N': all parameters less the position
// embedding, tied output layer once), D = training tokens, L layers, d width, H heads, T sequence
// length, V vocabulary (V' padded to 128), b micro-batch, K = grad-accum (micro-batches per step
// per dp rank; the pipeline's m), N = dp, t = tp, p = pp, c = cp (context parallel: each sequence
// split over c ranks), G = dp x c (the ranks a gradient is reduced over: DDP's and ZeRO's group).
// "Per rank" means per device/process; world = dp x c x t x p.
//
// 1. Training compute and runtime (Kaplan et al. 2020 s2.1; Hoffmann et al. 2022 for D = 20P)
//      T = 6 P D          (+ 12 L d T_seq D with the attention term: T = F D, F of models/flops.h)
//      R = devices x peak x achieved          t = T / R;  with D = 20 P:  t = 120 P^2 / R
//      E = t x devices x watts                efficiency = R / (devices x watts)  [FLOP/s per W]
//
// 2. Model-state bytes per rank: kiln's exact accounting (parallel/zero, issues 5 and 17), not
//    the ZeRO paper's K = 12. Two weight policies, pb = bytes of the working weights:
//    fp32 (pb 4, the default; bf16/fp16 run under autocast): fp32 parameters, fp32 gradients,
//    fp32 AdamW moments, 4 + 4 + 8 = 16 bytes per parameter at ZeRO-0, the fp32 parameter
//    (shard) being its own master. 16-bit (pb 2, --param-dtype bf16|fp16; optim/adamw.h): 16-bit
//    weights, fp32 main grads, fp32 master + moments, 2 + 4 + 12 = 18. Gradients stay fp32 in
//    both (K micro-steps accumulated in 16 bits would round every partial sum) -- but where there
//    is nothing to accumulate or reduce (stage 0, K = 1, G = 1, p = 1, no communicator: kiln
//    train's --main-grads auto), AdamW reads the 2-byte gradients: 2 + 2 + 12 = 16. Parameters
//    are grouped in units -- unit 0 "outer" = wte, wpe, ln_f; one unit per block -- each padded
//    to a multiple of N x 64 elements: n' = ceil(n / 64N) 64N, Psi' = sum n' (Psi unpadded);
//    with context parallelism N is G = dp x c throughout (ZeRO shards over the dp x cp group);
//    o = 8 (pb 4) or 12 (pb 2: the fp32 master shard joins m and v).
//      stage   device params   device grads             device optimizer
//      0       pb Psi          4 Psi                    o Psi
//      1       pb Psi'         4 Psi'                   o Psi'/N
//      2       pb Psi'         4 Psi'/N  (*)            o Psi'/N
//      3       pb Psi'/N       4 Psi'/N  (*)            o Psi'/N
//      (*) 4 Psi' under --zero-accum local with K > 1 (a full local accumulation buffer).
//    --offload optimizer (stages 1-3): device optimizer 0; host optimizer 12 Psi'/N (moments and
//      the fp32 master copy, either policy), host grads 4 Psi'/N.  --offload all (stage 3):
//      device 0 (but for the local accumulation buffer (*)); host params pb Psi'/N (pb 4: it is
//      the master; pb 2: the 16-bit shard that is gathered), grads 4 Psi'/N, optimizer o Psi'/N.
//    Compare the ZeRO paper's (2 + 2 + K) Psi family (Rajbhandari et al. 2020, Fig. 1; anchors s7.2).
//    fp8 (--precision fp8) outside ZeRO-3: each float8 layer keeps its weight's two 8-bit forms
//    for the optimizer step (kernels/float8.h, Float8WeightCache), counted in cast_copies too:
//      + 2 x (the rank's parts of the float8 layers' weights, the experts' not)   (block_float8_kept)
//    The autocast copy (device `cast_copies`, any stage): with fp32 weights under 16-bit
//    autocast (pb 4, a 2), autocast's cache holds a 2-byte copy of every weight a block's matrix
//    products read, from the forward until the backward -- under ZeRO-3 too, where the copy
//    outlives the released gather, so every rank holds 16-bit copies of its whole stage:
//      cast_copies = 2 x L_s (c_attn weight + bias, attn c_proj weight, c_fc weight + bias,
//                    mlp c_proj weight [+ the two c_proj biases when t = 1])
//    (each bias where the model has one). Recomputation runs without the cast cache: under full
//    no block's copy outlives its forward (cast_copies = 0); under selective a GELU feed-forward's
//    c_proj is cast afresh inside gelu_linear (its weight and bias left out; SwiGLU's kept).
//    the rank's tp slices of them (under tp the row-parallel bias is added after the all-reduce,
//    outside the product, so it is not cast); 0 with 16-bit weights or fp32 compute. wte is left
//    out: the output layer's cast of it is a transient of the chunked loss (models/
//    linear_cross_entropy.h), not held to backward. Known undercount: under tp with fp16 the
//    plain path's at::linear does cache wte's copy (2 V' d / t more).
//    With tp and pp the units are the rank's own: each block's matrices and column-parallel
//    biases split over t (LayerNorms and row-parallel biases replicated; Megatron, Shoeybi et al.
//    2019), the vocabulary-parallel wte split over t. pp (kiln's parallel/pipeline_layout.h and
//    parallel/zero.cpp units_of): blocks split over p by count -- floor(L/p) each, the L mod p
//    extra ones to the middle stages first, then the first, then the last; or --pp-split -- wte
//    and wpe on the first stage, ln_f and a tied copy of wte on the last. A stage's units (p > 1):
//    wte alone (first and last stage), then wpe and ln_f, those it holds, as one unit, then its
//    blocks; a middle stage has only its blocks. With p = 1, unit 0 = wte, wpe, ln_f as above.
//
// The Llama family (models/gpt_config.h; docs/plan.md section 10): a norm is n = d (RMSNorm) or 2d;
//    c_attn's bias only where the pattern has it (all, qkv), the other linears' only under all;
//    SwiGLU's c_fc is [gate | up], 2 F x d (column-parallel: [gate_r | up_r]); no wpe with rotary
//    positions; an untied lm_head [V', d] (vocabulary-parallel) joins the outer unit (pp 1) or the
//    last stage's [ln_f, lm_head] unit, and the last stage then holds no copy of wte.
//
// 3. Activation bytes per token per layer: kiln's saved-tensor lists (docs/activation_
//    checkpointing.md, measured on the CPU within 1%), written as Korthikanti et al. 2022 do
//    (s4: 34 s b h + 5 a s^2 b, fp16, no GELU trick), with a = bytes of the compute dtype, r = the
//    working weights' bytes (the residual stream is in the parameters' dtype: 4, or 2 with
//    --param-dtype bf16|fp16), m = dropout-mask bytes (4 on the CPU, 1 on a GPU), kv =
//    n_kv_head x head_dim:
//      replicated over t:  r d (x) + 16 (two LayerNorms' mean, rstd) + a d (ln_1 out) + r d (y)
//                          + a d (ln_2 out) [+ 2 m d residual-dropout masks]
//      split over t:       attention core + a d (attention out) + 4 a d (h) + 4 a d (gelu(h))
//        core, flash:      a (d + 2 kv) (q, k, v views) + 4 H (fp32 logsumexp)
//        core, math path:  3 a d (q, k, v copies) + a H T (softmax) [+ (m + a) H T with dropout]
//      selective: core -> a (d + 2 kv) (the checkpoint's inputs), gelu(h) dropped (recomputed)
//      full:      r d (the block's input), plus one layer's `none` activations live while it is
//                 recomputed and back-propagated (Korthikanti s5: 2 s b h per layer + one layer)
//      selective and full also keep, per layer and micro-batch, the RNG state the recomputation
//      replays: the CPU generator's 5056 bytes (and the CUDA generator's 16 on a GPU).
//    GPU bf16 flash with dropout: none 34d + 4kv + 4H + 16, selective 26d + 4kv + 16, full 4d.
//    m: a GPU's masks are bool (1); the CPU's are the masked tensor's dtype (the residual
//    branches': a). The Llama family, measured on the CPU (tests/test_activation_checkpoint.cpp,
//    LlamaFamilyMemoryKeptIsThePlans: every mode, fp32 and bf16, within 1.7%):
//      RMSNorm, each norm's r d + 8:  GPU (LibTorch's fused kernel) r d + 4 (input, fp32 rstd);
//                                     CPU (the composite) 8 d + 4 (input in fp32, x rstd in fp32, rstd)
//      rotary positions:   + a (d + kv) split (the rotated q and k beside c_attn's output, which v
//                          views), flash and selective; the math path's copies are the same 3 a d
//      SwiGLU:             h, gelu(h) (a F + a F; F = 4d for GPT-2) -> 4 a F: [gate | up],
//                          silu(gate), the product -- kept under selective too (not recomputed)
//    Per rank: layers on the stage x b T x bytes, times the micro-batches in flight: 1F1B keeps
//    min(p - s, K) of them on stage s, so the first stage holds min(p, K) (Narayanan et al.
//    2021; kiln's parallel/pipeline.h).
//    Outside the blocks: embedding indices (8 B/token), ln_f (its norm's bytes + a d) and the loss:
//    the chunked loss (models/linear_cross_entropy.h; tp 1, not fp16) computes its gradients in
//    the forward and keeps dloss/dx and dloss/dW in fp32, 4 d per token + 4 V' d per micro-batch,
//    with transients G (a V' per token) and one chunk's fp32 logits (at most 256 MiB; on the CPU
//    under 16-bit autocast also W's fp32 copy, 4 V' d); the plain loss (fp16, --loss-chunk-rows -1,
//    and tp's vocabulary-parallel logits) keeps the fp32 log-probabilities (4 V/token; 4 V'/t
//    vocabulary-parallel) and the targets, with the logits and their gradient as transients;
//    with kiln's kernels on a GPU tp's loss runs two-pass (parallel/tensor_parallel.h) and keeps
//    the logits in the compute dtype and lse instead (a V'/t + 4 per token), dz the transient.
//    Sequence parallelism (--sp; Korthikanti s4.2.2, their 34 s b h / t): the replicated terms
//    live on the rank's T/t rows, so they divide by t -- the LayerNorm outputs too: c_attn, c_fc
//    and the head keep their input's rows (in the compute dtype) and gather them again in
//    backward (parallel/sequence_parallel.h: gathered_linear), as Megatron does:
//      per token, sp:      (replicated + split) / t          full, sp: r d / t
//      outside the blocks: the embedding's mask and ln_f's input, stats and output / t; the
//                          token ids and the loss's log-probabilities are every position's
//    Context parallelism (--cp c): each rank holds 2C = T/c positions of each sequence, and every
//    per-token term above is per local token (b T / c of them), except attention's gathered K and
//    V, whole [b, KV/t, T, h] per layer (kv_t = this rank's kv heads x head_dim: kv / t, or
//    head_dim when t exceeds the kv heads), and the causal mask: one additive [2C, T] bias in the
//    compute dtype for the run, shared by every layer and micro-batch (a per-layer mask -- or a
//    boolean one, which SDPA converts per call -- would be kept by the fused kernels for backward,
//    a 2C T per layer: 51 GB for gpt2-1.5b at T 32768, c 2):
//      per layer, cp:      (b T / c) x per-token bytes + b T x 2 a kv_t (K, V whole)
//      math path:          the K, V copies whole (b T x 2 a d / t), q and the scores per local token
//      full, cp:           (b T / c) r d
//      once per rank:      a 2C T (the mask)
//    docs/plan.md, section 8, has a seq 8192 / 32768 example.
//
// MoE (GPTConfig::n_experts > 0; models/moe.h; without expert parallelism every rank holds every
// expert; --ep below). Block i is an MoE block when i % moe_every == 0. E experts, k per token, F = 4d.
//    Parameters: an MoE block's feed-forward is E (dF + F + Fd + d) + E d (the experts and the
//      router W_g [E, d], no bias) in place of the MLP's dF + F + Fd + d; it is REPLICATED over
//      tp (nothing in it is split: parallel/tensor_parallel.cpp splits by name, and the MoE names
//      are not split), so a tp rank holds its attention slice plus the whole MoE layer. Each
//      block is its own ZeRO unit, so ZeRO shards the experts as any parameter; DDP all-reduces
//      them, ZeRO reduce-scatters and gathers them (section 4's Psi, Psi' include them).
//    FLOPs: F = 6 N_active + 12 L d T (models/flops.h): an MoE block's active parameters are
//      k experts and the router, k (dF + F + Fd + d) + E d; a stage's F_s uses the same per block.
//    Autocast copies (section 2): only the attention's weights of an MoE block are cached (c_attn
//      weight and bias, attn c_proj weight [+ its bias at t = 1]); the experts run on slices
//      fc_w[e], proj_w[e], which are not leaves, and autocast caches leaves only (runtime/
//      precision.cpp autocast_cached_numel, by name, counts no MoE parameter). Their 16-bit casts
//      are saved for backward by each expert's linear instead: counted as activations, per
//      micro-batch (below).
//    Activations of an MoE block, per token (an ESTIMATE from the op list of models/moe.cpp, not
//      measured), all replicated over tp: the attention half as a dense block's, then
//        4 d          ln_2's output, fp32 (the router's input: it runs in fp32 whatever the
//                     compute dtype; in place of the dense block's a d)
//        8 E + 4      the router logits (kept by the z-loss's logsumexp) and softmax probs, fp32,
//                     and the logsumexp
//        12 k + 4     the top-k indices (int64) and probabilities, their sum (the gates)
//        k (10 a d + a + 16)   per assignment: the expert's input (a d), h (4 a d), gelu(h)
//                     (4 a d), its output (a d, kept by the gate product), the gate (a), the
//                     sort's permutation and the token index (int64)
//      i.e. 4d + 8E + 12k + 8 + k (10 a d + a + 16) where a dense block has a d + 8 a d / t; k
//      assignments per token is an upper bound (the capacity drops some).
//      Per MoE layer and micro-batch, with fp32 weights under 16-bit autocast: the experts'
//      weight casts the linears save, a x 2 F d x E (every expert assumed to receive tokens);
//      with 16-bit weights the router's fp32 copy, 4 E d.
//      selective: the MoE layer keeps all of this (only attention's core is recomputed); full:
//      r d per block, as a dense block. Measured with kiln's MoEImpl on the CPU (mallinfo2, d 128,
//      E 8, k 2, dropless): 1.3% (fp32) and 2.0% (bf16) above this (autograd's nodes); docs/plan.md s9.
//      Transient while an MoE layer's backward runs: each expert's slice gradient is a full-size
//      [E, ...] tensor (select_backward) summed into one buffer per stacked weight: pb x E x
//      (mlp + F d), the four buffers and one more fc_w-sized gradient.
//    Communication: the step's verdict carries each MoE layer's routing stats, n_moe_layers x
//      (E + 3) floats inserted before the norm (runtime/trainer/trainer_step.cpp), all-reduced as before:
//      DDP 2 x 4 (2 + X), ZeRO and pp 2 x 4 (3 + X), X = n_moe_layers (E + 3), on every stage
//      (each stage sends every layer's row, zeros for the others'). tp: an MoE block has no tp
//      collective (its input is whole on every rank, its output needs no reduction), so it has
//      1 forward all-reduce (attention's c_proj; 2 under full recomputation) and 1 backward
//      (c_attn's input gradient) per micro-batch, against a dense block's 2 and 2.
//    Training totals (section 1) count P = N_active less the position embedding (6 N_active D),
//      and D = 20 N_active by default: a convention, not a compute-optimal law for MoE (give
//      --tokens).
//    kiln refuses MoE with --sp or --cp (a sequence is one routing group); the plan does too.
//
// Expert parallelism (--ep e; parallel/expert_parallel.h): the dp ranks of a tp position are cut
// into dp / e groups of e consecutive dp indices; rank r of a group holds experts [r E/e,
// (r + 1) E/e) of every MoE layer, the router and everything else whole as before. e divides dp
// and E; kiln builds it with DDP, ZeRO-1/2/3, tp and pp.
//    Parameters: an MoE block's unit on a rank is attention + (E/e) mlp + E d; params_local and
//      the model-state bytes (ZeRO-0's table, section 2) count them. psi_experts = the rank's
//      expert parameters ((E/e) mlp per MoE block), psi_dense = Psi - psi_experts.
//    DDP (exact): the dense parameters' all-reduce over dp, 2 rb psi_dense; the experts' over the
//      expert-data-parallel group (the dp / e ranks holding the same experts), 2 rb psi_experts
//      when dp / e > 1, nothing when it is 1 (a group of one skips its all-reduce); the verdict
//      as before (16 + the routing rows, over dp); the norm: one more all-reduce of one fp64
//      over the ep group (the experts' squares), 2 x 8 = 16 bytes per step.
//    All-to-all (the ep group; distributed/comm.h: an all_to_all counts its whole input), per MoE
//      layer and micro-batch: the counts, 8 E bytes, in every forward (twice under full
//      recomputation: the block's forward runs again inside backward) -- exact; the rows, a x d
//      x b_in to the experts (a this rank's admitted assignments; b_in ln_2's output dtype, fp32
//      but on the CPU with 16-bit weights) and R x d x b_out back (R the rows this rank's experts
//      ran; b_out the experts' output dtype, the compute dtype), and in backward the gradients
//      the other way, a x d x b_out and R x d x b_in. a and R depend on the routing: the plan
//      takes a balanced load without dropping, a = R = k b T, i.e. per MoE layer and micro-batch
//        passes x k b T d (b_in + b_out),   passes = 2 (forward, backward), 3 with full
//      -- an ESTIMATE (a capacity factor drops assignments; imbalance moves rows unevenly).
//    Time: the all-to-alls are serial (the experts wait for their rows; the counts need a host
//      read), their wire bytes comm_bytes x (e - 1)/e (the own block stays) at the collective
//      busbw of the link the ep group crosses (in a node when tp x e <= devices per node), as a
//      ring collective's: an assumption -- an all-to-all across nodes is usually slower than a
//      ring's busbw. The experts' FLOPs per rank are unchanged at a balanced load.
//    Memory: the experts' weight casts and the backward's expert-gradient buffers count E/e
//      experts; per assignment one more int64 (the arrived rows' order, kept by index_select).
//    ZeRO (parallel/zero.h): each MoE block's experts a unit of their own, sharded, reduced and
//      (ZeRO-1/2) all-gathered after the step over the expert-dp group (M = dp / e; no reduction
//      when M = 1); under ZeRO-3 both of a block's units are gathered for its forward and again
//      for its backward (the last block's kept), each over its group -- a group of one still
//      counts its gathers' bytes (distributed/comm_self.h) -- and its transient is the largest
//      dense unit plus the largest expert unit, twice (gathered and prefetched).
//
// 4. Communication per rank per optimizer step, in kiln's comm_bytes convention (each
//    collective counts its full buffer times its ring factor: all_reduce 2x, reduce_scatter 1x
//    the input, all_gather 1x the output, broadcast 1x, send: bytes sent). The wire traffic of
//    a ring collective over n ranks is comm_bytes x (n - 1)/n (nccl-tests PERFORMANCE.md) and
//    its time wire / busbw of the link it crosses (inside a node, or between nodes).
//    DDP and ZeRO run over the dp x cp group: N = G = dp x c in every row below.
//      DDP (ZeRO-0, N > 1)  2 x 4 Psi + 16           (gradients; [loss, non-finite flag] 8 B;
//                                                     a world of one under mpirun: 2 x 4 Psi;
//                                                     --reduce-dtype bf16: 2 x 2 Psi)
//      ZeRO-1               rb Psi' + pb Psi' + 24   (reduce-scatter, all-gather; 12 B verdict)
//      ZeRO-2  reduce       K rb Psi' + pb Psi' + 24   local: rb Psi' + pb Psi' + 24
//      ZeRO-3  reduce       K (pb Psi' + pb (Psi' - n_0' - n_L') + rb Psi') + 24
//              local        K (pb Psi' + pb (Psi' - n_0' - n_L')) + rb Psi' + 24
//    rb = 4, or 2 with --reduce-dtype bf16; pb = the working weights' bytes (4, or 2 with
//    --param-dtype bf16|fp16: ZeRO-3's gathers halve). i.e. DDP and ZeRO-1/2 move 2 Psi, ZeRO-3
//    3 Psi per step (anchors s7.3). Offload's host copies: the gradient shard down, 4 Psi'/N;
//    the parameter shard up, pb Psi'/N.
//    tp (Megatron; Korthikanti s4.2.2; kiln's parallel/tensor_parallel.h): per layer and
//    micro-batch 2 forward all-reduces of the row-parallel outputs, b T d a bytes (4 with full
//    recomputation), and 2 backward of the column-parallel inputs' gradients, b T d 4 (fp32: the
//    LayerNorm outputs they flow into are fp32 under autocast; 2 on the CPU with 16-bit weights,
//    whose autocast runs layer_norm in the input's dtype), plus the vocabulary-parallel
//    embedding's forward all-reduce (b T d r; first stage), the head's input-gradient
//    all-reduce (b T d, as the backward ones) and the cross-entropy's three (b T 4 each; last stage), and with p = 1
//    and no ZeRO the norm's 8-byte all-reduce.
//    pp (kiln's parallel/pipeline.h; a send counts the bytes a rank sends): per micro-batch the
//    first stage sends its output b T d r (the residual stream) forward, the last stage its input's gradient
//    backward, a middle stage both; once per step the first and the last stage each send their
//    tied wte gradient to the other, 4 V' d / t (under ZeRO only its dp shard of the wte unit,
//    4 n_wte' / N) -- not with an untied lm_head, which shares nothing between the stages. The step's verdict [loss, non-finite, grad norm^2] is one all-reduce over the
//    whole world (2 x 12), with or without ZeRO, and replaces DDP's 16-byte one and tp's norm.
//    sp (parallel/sequence_parallel.h): each tp all-reduce of [b, T, d] becomes an all-gather
//    (1x the output) plus a reduce-scatter (1x the input), and each column-parallel layer
//    gathers its input again in backward (it keeps only its rows). Per layer and micro-batch:
//      forward (each, twice under full):  c_attn, c_fc inputs gathered + the two row-parallel
//                                         outputs reduce-scattered        4 b T d a
//      backward:                          the two inputs gathered again + the row outputs'
//                                         gradients gathered             4 b T d a
//                                         the inputs' gradients reduce-scattered  2 b T d ln
//    i.e. 8 b T d a + 2 b T d ln (12 b T d a + 2 b T d ln with full), against plain tp's
//    4 b T d a (8 with full) + 4 b T d ln:
//    2 b T d a more per layer in fp32. The embedding's reduce-scatter + all-gather, 2 b T d r,
//    equal plain tp's all-reduce; the head: ln_f's output gathered forward and backward and its
//    gradient reduce-scattered, 2 b T d a + b T d ln (plain: 2 b T d ln). NEW: every parameter
//    tp replicates is all-reduced over tp in each backward, in its own dtype: per micro-batch
//    2 pb (6 L_s d [+ T d wpe, first stage] [+ 2 d ln_f, last stage]) (the LayerNorms and the
//    two row-parallel biases of each block; the Llama family: 2 n per block, the biases only
//    under bias = all, wpe only with learned positions, ln_f's n). With pp the stages exchange
//    the rank's rows (T / t under sp, T / c under cp; section 4's pp).
//    cp (parallel/context_parallel.h): per layer and micro-batch one all-gather of the stacked K
//    and V, output [2, b, KV_t, T, h], 2 b KV_t T h a bytes (again per recomputed forward under
//    full; selective keeps the gathered K, V), and one reduce-scatter of their gradient, the same
//    size (the gradient is in the compute dtype). tp's collectives run on the rank's b T / c
//    positions. The verdict is over dp x c (16 B DDP; 24 B ZeRO, over the world with tp).
//
// 5. Time per optimizer step (per rank; the slowest stage sets it):
//      t_f = F_s b T / (t c R),  t_b = (2 F_s + F_re,s) b T / (t c R)   per micro-batch on stage s
//      (cp's mirrored chunks give every cp rank the same attention work: an even 1/c share):
//      F_s = sum over its blocks (2 n_block + 4 d T) [+ 2 (V' d + n) on the last stage: the
//      output layer and ln_f], n_block the block's active parameters (MoE: k experts and the
//      router), summing to F/3 over the stages (F/3 itself at p = 1); F_re,s = the sum over its
//      blocks of the recomputed FLOPs per token: full 2 n_block + 4 d T, selective 4 d T
//      compute  = K (t_f + t_b)
//      exposed  = serial comm (tp, pp p2p, post-step all-gathers, verdicts, offload copies and
//                 the host AdamW, cp's K/V gathers and reduce-scatters, sp's replicated-gradient
//                 all-reduces) + per window max(0, comm overlapped there - window's compute)
//                 (DDP buckets / ZeRO reduce-scatters behind backward, ZeRO-3 gathers behind the
//                 phase they feed)
//      bubble   = (p - 1)(t_f + t_b)       (1F1B: bubble fraction (p-1)/(K+p-1); Narayanan s2.2)
//                 (p - 1)(t_f + t_b) / V   (interleaved, V chunks a stage)
//                 (p - 1)(t_f + t_i - t_w) + max(0, p - K) t_w   (ZB-H1, t_b = t_i + t_w:
//                 t_w = 2 N_s b T / (t c R), the weight GEMMs of the stage's N_s parameters;
//                 parallel/pipeline_zero_bubble.h)
//      step     = compute + exposed + bubble of the stage where that sum is largest;
//      MFU = F x tokens per step / (devices x step x peak)
//    Required bandwidth to hide a group's communication behind compute: b = C / t_compute, C the
//    group's wire bytes per step; the cluster has it when b <= that link's busbw.
//
// 6. Checkpoints (--save-every N; runtime/checkpoint/checkpoint.h, async_save.h): the files hold
//    4 bytes a parameter of fp32 weights and 8 of AdamW's moments, C = 12 P (the headers, configs
//    and 4-byte step counts a tensor are left out); rank 0 writes them at the disk's rate W:
//    write = C / W.
//      synchronous  stall = write                       (every rank waits for rank 0)
//      --async-save stall = S / H + max(0, write - N t)  (each rank's snapshot S over the host
//                   link H, and the wait for the previous write when one takes longer than N
//                   steps of t each)
//    and per step stall / N, added to the step. --async-save is kiln train's default, and the
//    plan's. Its snapshot S lives in one pool per rank, allocated and touched at set-up and held
//    for the run whenever the run saves (runtime/checkpoint/consolidate.h, StateSnapshot), host
//    memory (pinned on a GPU) beside offload's host state, counted in the host bytes per node:
//      ZeRO        every rank: 12 x its shards (fp32 weights or master, m, v; 3 x ZeroEngine::
//                  snapshot_numel's third), the experts' shards over their copies under --ep
//      no ZeRO     the ranks whose copy a gather reads (cp 0, dp < max(1, ep); rank 0 among
//                  them): 12 Psi + 4 x the parameter tensors (a step count each); the others
//                  4 bytes (the pool's one element)
//    On the CPU the pool is the process's memory too, so a CPU run's peak includes it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/gpt_config.h"
#include "parallel/zero_options.h"
#include "plan/cluster.h"

namespace kiln::plan {

using ::kiln::Offload;    // parallel/zero_options.h: the engine's own option values
using ::kiln::ZeroAccum;  // ZeRO-2/3 with K > 1: reduce-scatter every micro-step, or once
using ::kiln::parse_offload;
using ::kiln::parse_zero_accum;
using ::kiln::to_string;
enum class Recompute { None, Selective, Full };  // --activation-checkpointing
enum class Attention { Flash, Math };            // which attention kernel keeps what (section 3)

Recompute parse_recompute(const std::string& s);
Attention parse_attention(const std::string& s);
std::string to_string(Recompute r);
std::string to_string(Attention a);

// How one training run is laid out and executed. Filled by the CLI (or --compare from a log),
// validated once against the model and the cluster.
struct Layout {
  int64_t dp = 1, tp = 1, pp = 1;       // data / tensor / pipeline parallel sizes
  int64_t cp = 1;                       // context-parallel size: each sequence split over cp ranks (2 cp chunks)
  int64_t ep = 1;                       // expert-parallel size: each MoE layer's experts divided over ep dp ranks (divides dp and E)
  bool sp = false;                      // sequence parallelism inside the tp group (needs tp >= 2)
  int zero = 0;                         // ZeRO stage 0..3
  Offload offload = Offload::None;      // optimizer: stages 1-3; all: stage 3
  ZeroAccum zero_accum = ZeroAccum::Reduce;
  bool delayed_update = false;          // --offload-delayed-update (offload optimizer): the host AdamW under the next step's compute
  Recompute recompute = Recompute::None;
  int64_t micro_batch = 1;              // sequences per micro-batch per rank
  int64_t grad_accum = 1;               // micro-batches per optimizer step per dp rank (K)
  int compute_bytes = 2;                // a: 2 for bf16/fp16 autocast, 4 for fp32
  int float8 = 0;                       // --precision fp8 (compute_bytes 2): 0 off, 1 tensorwise, 2 rowwise (kernels/float8.h)
  bool fp8_filter_all = false;          // --fp8-filter all (else auto: kernels/float8_filter.h's size filter)
  int param_bytes = 4;                  // working weights: 4 (fp32), 2 (--param-dtype bf16/fp16: fp32 masters with AdamW)
  int reduce_bytes = 4;                 // gradient all-reduce (DDP) / reduce-scatter (ZeRO): 4 (fp32), 2 (--reduce-dtype bf16)
  bool main_grads_always = false;       // --main-grads always: fp32 main grads even with nothing to accumulate
  std::string pp_split;                 // --pp-split "a,b,c": blocks per stage (virtual stage); empty = kiln's balanced default
  int64_t pp_virtual = 1;               // --pp-virtual V: model chunks a stage holds (interleaved 1F1B when > 1)
  bool zero_bubble = false;             // --pp-schedule zb-h1 (parallel/pipeline_zero_bubble.h)
  int64_t save_every = 0;               // steps between checkpoints (0: none in the time model)
  bool saves = false;                   // the run checkpoints (kiln train --save-dir), at least at its end; save_every > 0 implies it
  bool async_save = true;               // --async-save, kiln train's default: the steps stall for a host copy, not the write,
                                        // and each rank holds its snapshot pool in host memory from set-up (section 6)
  Attention attention = Attention::Flash;
  bool dropout = false;                 // dropout > 0 (masks kept)
  bool cpu = false;                     // runs on the CPU: 4-byte dropout masks, no CUDA generator
  bool fused_kernels = false;           // kiln's CUDA kernels ran (kernels/; --kernels fused on a GPU): the norms
                                        // answer in the residual stream's dtype and keep x and fp32 mean, rstd; SwiGLU
                                        // keeps [gate | up] alone (docs/plan.md s3)
  bool comm_in_world_of_one = false;    // a communicator exists even with dp = 1 (mpirun + --backend)
  bool plain_loss = false;              // the whole-logits loss (fp16, --loss-chunk-rows -1); else chunked but under tp
  double base_bytes = 0;                // resident bytes outside the model (CPU runs: LibTorch, ~0.4 GB)

  int64_t devices() const { return dp * cp * tp * pp; }
  // --async-save's snapshot pool is held (runtime/checkpoint/async_save.h): saves, written in the background
  bool holds_save_pool() const { return async_save && (saves || save_every > 0); }
  int64_t grad_ranks() const { return dp * cp; }  // G: the group DDP and ZeRO reduce (and shard) over
  // 16-bit working weights with nothing to accumulate or reduce: AdamW reads the 2-byte gradients
  // themselves, no fp32 main grad (kiln train's --main-grads auto; optim/adamw.h, trainer.cpp's rule)
  bool reads_16bit_grads() const {
    return zero == 0 && param_bytes == 2 && !main_grads_always && grad_accum == 1 && grad_ranks() == 1 && ep == 1 &&
           pp == 1 && !comm_in_world_of_one;
  }
  // --ep: the ranks holding the same experts (the expert-data-parallel group), dp / ep of them and,
  // under cp, each one's cp ranks (distributed/mesh.h)
  int64_t expert_copies() const { return dp / ep * cp; }
  // Throws ConfigError with one line naming what does not divide or combine.
  void validate(const GPTConfig& model, const ClusterSpec& cluster) const;
};

// ---- 1. training compute, runtime, energy -------------------------------------------------
struct TrainingTotals {
  double params = 0;            // P
  double tokens = 0;            // D
  bool compute_optimal = false; // D = 20 P
  double flops = 0;             // T
  double cluster_flops = 0;     // R, FLOP/s
  double seconds = 0;           // t = T / R
  double energy_j = 0;          // E
  double flops_per_watt = 0;    // R / (devices x watts)
};
// tokens <= 0: D = 20 P. attention_flops_per_token > 0 adds that term (12 L d T) to 6 P.
TrainingTotals training_totals(double params, double tokens, double attention_flops_per_token,
                               const ClusterSpec& cluster);

// ---- 2. model-state bytes -------------------------------------------------------------------
// The parameter units a rank of pipeline stage `stage` holds, in kiln's ZeRO order (section 2:
// with pp > 1 wte alone, then wpe / ln_f, then the blocks; the outer units are the first
// size() - blocks ones), with tp splitting as in section 2. `pp_split` as --pp-split.
// ep: expert parallelism, E/ep experts per MoE block.
// pp_virtual: the stage's blocks are those of its virtual stages (parallel/pipeline_interleaved.h).
std::vector<int64_t> rank_units(const GPTConfig& model, int64_t tp, int64_t pp, int64_t stage,
                                const std::string& pp_split = "", int64_t ep = 1, int64_t pp_virtual = 1);
// Blocks per stage: kiln's split (parallel/pipeline_layout.h), the layout's --pp-split if given;
// per virtual stage (pp x V of them) under --pp-virtual.
std::vector<int64_t> stage_blocks(const GPTConfig& model, const Layout& layout);
// The blocks of pipeline stage `stage`, in order: its chunks' (chunk c = virtual stage c pp + stage).
std::vector<std::vector<int64_t>> stage_chunks(const GPTConfig& model, const Layout& layout, int64_t stage);
// Parameters of block `index` (its number in the whole model) on a tp rank: a dense block's
// matrices split over tp, an MoE block's experts and router whole (replicated over tp); with
// expert parallelism E/ep of the experts.
int64_t block_numel(const GPTConfig& model, int64_t tp, int64_t index, int64_t ep = 1);
// One expert's parameters, or a dense block's MLP half at tp = t.
int64_t mlp_numel(const GPTConfig& model, int64_t tp);
// One norm's parameters: 2d (LayerNorm: weight, bias) or d (RMSNorm: weight).
int64_t norm_numel(const GPTConfig& model);
// Of block_numel, the experts' parameters on an ep rank: (E/ep) x one expert (0 for a dense block).
int64_t block_expert_numel(const GPTConfig& model, int64_t index, int64_t ep = 1);
// The parameters one token's forward multiplies by in block `index` (tp 1): a dense block's all,
// an MoE block's attention half, k experts and the router (the n_block of section 5's F_s).
int64_t block_active_numel(const GPTConfig& model, int64_t index);
// Which of block `index`'s layers run their products in float8 under the layout's --precision
// fp8 (none when off): c_attn, attn c_proj and the dense MLP's two, each where
// kernels/float8_filter.h admits its whole shape and its tp part's dims are multiples of 16
// (GPT::set_float8's rule); an MoE block's experts under rowwise.
struct Float8Layers {
  bool c_attn = false, attn_proj = false, c_fc = false, mlp_proj = false, experts = false;
};
Float8Layers block_float8_layers(const GPTConfig& model, const Layout& l, int64_t index);
Float8Layers float8_layers_of(const GPTConfig& model, const Layout& l, bool moe);  // a dense block's, or an MoE block's
// Of the block's active weights, those whose products run in float8 (an MoE block's k active experts).
int64_t block_float8_numel(const GPTConfig& model, const Layout& l, int64_t index);
// ZeRO-3 gathers the float8 layers' weights in 8 bits (parallel/zero.h, "Float8 weights"): under
// --precision fp8 tensorwise, without --offload all.
bool float8_gathered(const Layout& l);
// This rank's tp parts of the weights of a block's layers `f8` names (not the experts'), elements.
int64_t float8_parts_numel(const GPTConfig& model, const Layout& l, const Float8Layers& f8);
// Of block `index`, this rank's parts of the float8 layers' weights (not the experts') whose 8-bit
// forms the trainer keeps for a step (GPT::keep_float8_weights: fp8 outside ZeRO-3), 2 bytes each,
// counted with the cast copies.
int64_t block_float8_kept(const GPTConfig& model, const Layout& l, int64_t index);
// Of block `index`, this rank's parts of the weights so gathered (the trainer's rule: every
// float8 layer's but c_attn's where tp replicates the kv heads), elements and how many weights;
// {0, 0} where float8_gathered is false.
std::pair<int64_t, int64_t> block_float8_gathered(const GPTConfig& model, const Layout& l, int64_t index);
int64_t padded_numel(int64_t n, int64_t dp);  // ceil(n / 64 dp) 64 dp
int64_t sum_padded(const std::vector<int64_t>& units, int64_t dp);
int64_t sum_units(const std::vector<int64_t>& units);

struct StateBytes {
  int64_t params = 0, grads = 0, optimizer = 0;
  int64_t cast_copies = 0;  // autocast's 2-byte weight copies, forward to backward (device only; section 2)
  int64_t total() const { return params + grads + optimizer + cast_copies; }
  StateBytes& operator+=(const StateBytes& o) {
    params += o.params, grads += o.grads, optimizer += o.optimizer, cast_copies += o.cast_copies;
    return *this;
  }
};
struct ModelState {
  StateBytes device, host;
  ModelState& operator+=(const ModelState& o) {
    device += o.device, host += o.host;
    return *this;
  }
};
// params, grads and optimizer of section 2's table; cast_copies is left 0 (make_plan sets it
// from cast_copy_bytes, which needs the model's shape).
// ZeRO shards over `ranks` (0: the layout's dp x cp; the expert units: dp / ep).
ModelState model_state(const std::vector<int64_t>& units, const Layout& layout, int64_t ranks = 0);
// The parameter tensors a rank of pipeline stage `stage` holds (models/gpt.cpp's registered
// parameters: wte, wpe, ln_f, lm_head where the stage has them; per block its norms, linears and
// their biases, or an MoE layer's router and stacked experts). --async-save's snapshot keeps a
// 4-byte step count for each (section 6).
int64_t rank_param_tensors(const GPTConfig& model, const Layout& layout, int64_t stage);
// Autocast's held 2-byte weight copies on a rank of a stage holding blocks [first_block,
// first_block + blocks) (section 2; an MoE block's attention weights only); a stage of several
// chunks sums its chunks'.
int64_t cast_copy_bytes(const GPTConfig& model, const Layout& layout, int64_t blocks, int64_t first_block = 0);

// ---- 3. activations -------------------------------------------------------------------------
struct ActivationBytes {
  double replicated = 0;  // bytes per token per layer, the same on every tp rank (without --sp; / tp with it)
  double split = 0;       // bytes per token per layer before dividing over tp
  double kv_whole = 0;    // cp > 1: bytes per token of the WHOLE sequence per layer on each rank (its K, V heads, gathered)
  double per_layer = 0;   // bytes per layer and micro-batch: the checkpoint's saved generator states (fp8: q_W under 16-bit ZeRO-3 gathers)
  double unsplit = 0;     // bytes per token per layer whatever tp and sp (fp8 under sp: the column layers' gathered q_x)
  // Per token of the rank's positions (the micro-batch's b T, or b T / cp with cp), per layer.
  double per_token(int64_t tp, bool sp = false) const {
    const double t = static_cast<double>(tp);
    return (sp ? replicated / t : replicated) + split / t + unsplit;
  }
  // One layer and micro-batch of `tokens` = b T on a rank (section 3).
  double layer_bytes(double tokens, int64_t tp, bool sp = false, int64_t cp = 1) const {
    return tokens / static_cast<double>(cp) * per_token(tp, sp) + tokens * kv_whole + per_layer;
  }
};
// The bytes of a norm's output element: fp32 for LayerNorm under CUDA autocast (its fp32 list),
// else the residual stream's (the parameters' dtype).
double norm_output_bytes(const GPTConfig& model, const Layout& layout);
// What one norm keeps per token between forward and backward, its input included, when that
// input has r bytes (section 3).
double norm_kept_bytes(const GPTConfig& model, const Layout& layout, double r);
// Kept between forward and backward, per token per layer, for `mode` (the layout's tp and cp set
// kv_whole and the mask; per_token / layer_bytes divide). moe: an MoE block's (section 3, MoE;
// an estimate), else a dense block's.
ActivationBytes layer_activation_bytes(const GPTConfig& model, const Layout& layout, Recompute mode, bool moe = false);

// ---- 4. communication -----------------------------------------------------------------------
// --ep: the bytes of one element of the rows the all-to-alls move -- to the experts in the
// compute dtype (models/moe.cpp casts ln_2's output, fp32 on CUDA, before the dispatch), back in
// the experts' output dtype (the compute dtype too); the backward's gradients the same.
struct EpRowBytes {
  int in = 4, out = 4;
};
EpRowBytes ep_row_bytes(const Layout& layout);
// What compute it can hide behind. FirstForward: the next step's first forward, once (offload's
// host AdamW under ZeRO-3, which each unit's next gather waits for: parallel/zero.h). NextStep:
// the next step's forwards and backwards, all K of them (the delayed update's host AdamW, waited
// for only by the next step's step: parallel/zero.h, "The delayed update").
enum class Window { Serial, Forward, Backward, LastBackward, FirstForward, NextStep };
struct CommItem {
  std::string group;       // dp | tp | pp | host
  std::string what;        // "gradient all-reduce", ...
  int64_t group_size = 1;  // ranks in the collective (2 for p2p)
  double comm_bytes = 0;   // per step, kiln's convention (section 4)
  double wire_bytes = 0;   // per step, comm_bytes x (n-1)/n (p2p and host copies: bytes)
  double busbw = 0;        // bytes/s of the link it crosses
  std::string link;        // intra-node | inter-node | pcie | host-cpu
  double seconds = 0;      // per step
  Window window = Window::Serial;
  int64_t occurrences = 1; // how many times per step it happens (per micro-step items: K)
  bool estimate = false;   // not accounting: depends on what the run does (ep's all-to-all payload, routing-dependent)
};

// ---- 5. the whole plan of one layout ----------------------------------------------------------
struct StagePlan {
  int64_t stage = 0;
  int64_t blocks = 0;
  std::vector<std::vector<int64_t>> chunks;  // its blocks by chunk (one chunk but under --pp-virtual)
  int64_t moe_blocks = 0;         // how many of its blocks are MoE blocks
  std::vector<int64_t> units;     // this rank's parameter units (the outer ones, then one per block)
  // ZeRO under --ep (parallel/zero.h): each MoE block's experts, a unit of their own sharded over
  // the expert-data-parallel group (dp / ep ranks); `units` then holds the blocks without them
  std::vector<int64_t> expert_units;
  // ZeRO-3 under fp8 tensorwise (float8_gathered): each block's 8-bit-gathered weights, a unit of
  // their own after the block's (whose entry in `units` then holds the rest), and their count
  std::vector<int64_t> float8_units;
  int64_t float8_weights = 0;
  double forward_s = 0, backward_s = 0;  // this stage's compute per micro-batch
  double weight_s = 0;            // of backward_s, the weight-gradient GEMMs' (ZB-H1's W pass): 2 per parameter and token
  double bubble_s = 0;            // its idle time a step (section 5's bubble, by schedule)
  int64_t psi = 0, psi_padded = 0;
  int64_t psi_experts = 0;        // of psi, the experts' parameters (E/ep per MoE block): DDP reduces them over expert-dp under ep
  int64_t psi_experts_padded = 0; // of psi_padded, expert_units' (padded over expert-dp)
  ModelState state;
  double activation_bytes = 0;    // kept activations, all in-flight micro-batches
  double transient_bytes = 0;     // gathered ZeRO-3 units, recompute working set, logits
  double peak_device_bytes = 0;   // state.device + activations + transients + base
  // --async-save's snapshot pool (section 6; runtime/checkpoint/consolidate.h StateSnapshot),
  // host memory (pinned on a GPU) from set-up: under ZeRO every rank's, 12 B an element of its
  // shards; without ZeRO the stage's dp-0 (dp < ep under --ep), cp-0 ranks', 12 B a parameter
  // and 4 B a parameter tensor (its step count) -- the other ranks hold 4 B
  double save_pool_bytes = 0;
  double save_pool_other_bytes = 0;  // the pool of the stage's other ranks (4 B without ZeRO)
  double host_bytes = 0;          // this rank's host bytes: host model state + save_pool_bytes
  std::vector<CommItem> comm;
  double comm_bytes = 0;          // sum of comm[].comm_bytes over the network groups (kiln's figure)
  double ep_comm_bytes = 0;       // of it, the ep group's (the log's ep_comm_bytes): all-to-alls and the norm's 16 bytes
  double ep_exact_bytes = 0;      // of that, the accounting part (the counts and the norm; the rows are an estimate)
  double ep_norm_bytes = 0;       // of that, the norm's (DDP on one stage: clip_grad_norm_ep's all-reduce)
  double exposed_comm_s = 0;
  double step_s = 0;              // K (forward_s + backward_s) + bubble_s + exposed_comm_s: its step
};

struct GroupBandwidth {
  std::string group;
  double wire_bytes = 0;     // per step
  double required = 0;       // bytes/s = wire / compute time
  double available = 0;      // busbw of its link
  bool enough = true;
};

struct Plan {
  GPTConfig model;
  ClusterSpec cluster;
  Layout layout;
  int64_t tokens_per_step = 0;
  double flops_per_token = 0;     // F (model)
  double float8_flops_per_token = 0;  // of F, the float8 products' (--precision fp8), at the 8-bit rate
  double recompute_flops_per_token = 0;
  double forward_s = 0, backward_s = 0;  // t_f, t_b per micro-batch, of the slowest stage
  double compute_s = 0, exposed_comm_s = 0, bubble_s = 0, step_s = 0;
  double tokens_per_s = 0, mfu = 0, hfu = 0;
  // Checkpoints (section 6): the files' bytes, rank 0's write, the steps' stall per save and that
  // stall per step (in step_s) when save_every > 0.
  double checkpoint_bytes = 0, save_write_s = 0, save_stall_s = 0, save_s = 0;
  std::vector<StagePlan> stages;
  int64_t critical_stage = 0;     // the stage with the highest device peak (first such)
  int64_t slowest_stage = 0;      // the stage with the longest step: its compute, exposed comm and bubble (first such)
  std::vector<GroupBandwidth> bandwidth;
  bool fits_device = true, fits_host = true;
  double host_node_bytes = 0;     // the fullest node's host bytes: its ranks' host model state and snapshot pools
  double peak_device_bytes() const { return stages[critical_stage].peak_device_bytes; }
  double host_bytes_per_node() const { return host_node_bytes; }
  bool fits() const { return fits_device && fits_host; }
};

// Evaluates one layout (validated here). Throws ConfigError for a layout that cannot run.
Plan make_plan(const GPTConfig& model, const ClusterSpec& cluster, const Layout& layout);

// Training totals for the layout: steps = ceil(D / tokens per step), time = steps x step time.
struct LayoutTotals {
  int64_t steps = 0;
  double seconds = 0, energy_j = 0, device_hours = 0;
};
LayoutTotals layout_totals(const Plan& plan, double tokens);

}  // namespace kiln::plan
