#!/usr/bin/env bash
# tests/cli/fp8.sh -- --precision fp8 (kernels/float8.h, docs/precision.md): the blocks' linear
# layers in float8 with dynamic scaling, tensorwise or rowwise, the rest bf16. LibTorch 2.11 runs
# tensorwise _scaled_mm on the CPU, and kernels/float8.cpp composes the rowwise product's
# arithmetic, so both recipes' training runs here (the speed is the GPU's).
#
# 1. The curve: the tiny model, every block layer in float8 (--fp8-filter all: the default's
#    H100 size filter keeps none of tiny's 128-wide layers -- checked in the record), 200 steps
#    against bf16 from the same seed: the mean of the last 10 losses within 1% of bf16's (the
#    issue's bound for gpt2-124m's 500 steps on the GPU), with e5m2 gradients (the default) and
#    with e4m3 ones, and under the rowwise recipe (e4m3 gradients). Measured: e5m2 0.90056, e4m3
#    0.90044, rowwise 0.90036, bf16 0.90027 (+0.033%, +0.020%, +0.011%); on another CPU of this
#    project (2026-12-07; LibTorch's CPU float8 GEMM sums in another order there) 0.90072, 0.90075,
#    0.90064 (+0.050%, +0.054%, +0.041%), bf16 the same.
# 2. Parity with one fp8 process (micro-batch 4 x grad-accum 4, 10 steps): DDP 2, ZeRO-3 over 2,
#    tp 2, pp 2 and cp 2, the same global batch of 16. cp: every layer's rows are split over cp,
#    whose amax reductions (of the inputs and the output gradients) give one process's scales;
#    its attention runs in chunks and its bf16 ops in another order (bf16's cp 2 is 1.4e-5 /
#    1.1e-3 / 1.2e-5 from one process): held to tp's bounds, and its first loss to tp's.
#    tp 2 + sp: the column layers quantise their rows with the group's amax and gather them in 8
#    bits (the whole's quantisation, half the bytes: comm_bytes checked exactly against bf16's
#    sp); held to tp's bounds. DDP and ZeRO: every micro-batch is quantised as
#    one process quantises it (the same tensors, the same scales); the 16-bit gradients are summed
#    in fp32 in another order (micro-steps, then the reduction), which moves the weights by ~1e-7
#    and with them an amax or the rounding of an element at a float8 boundary now and then --
#    held to 1e-4 on the loss and gradient norm per step and on the final fingerprint. tp: the
#    amax of every split tensor is the group's maximum (Float8Scaling's reducers), so the
#    quantised operands are one process's; the row-parallel products are partial sums rounded to
#    bf16 before the all-reduce (as under bf16, tests/cli/param_dtype.sh: 5e-4 / 2e-2 / 2e-4 held
#    there): held to the same, and tp's first loss (the same weights) to 5e-5. pp: each stage's
#    blocks as one process runs them, each stage's forward in its own autocast scope (as under
#    bf16): held to tp's bounds. Measured (10 steps; loss / gradient norm / fingerprint): dp 2
#    8.4e-8 / 0 / 0, ZeRO-3 8.4e-8 / 5.4e-8 / 7.4e-11 (before the 8-bit gather, with clipping), tp 2 1.6e-4 / 4.4e-3 / 4.4e-5 (first loss
#    2.3e-5), pp 2 8.6e-5 / 3.0e-3 / 2.7e-5, cp 2 1.5e-4 / 3.8e-3 / 1.1e-5 (first loss 0), tp 2 +
#    sp 1.0e-4 / 6.1e-3 / 4.2e-5 (first loss 2.3e-5). With tp's amax reductions turned off by hand (each rank
#    scaling by its own parts): tp 2 7.1e-4 / 1.9e-2 / 8.0e-6, first loss 1.4e-4 -- past the bounds.
#    ZeRO-3 gathers the float8 weights in 8 bits (parallel/zero.h, "Float8 weights"): at dp 2, with
#    the optimizer offloaded, and at dp 2 x tp 2. The dp 2 ZeRO-3 runs are compared without
#    gradient clipping (--grad-clip 0, against a one-process run without it): ZeRO sums the squared
#    norm over shards in double, one process in fp32, so the clip factors differ in their last
#    bits, the weights by an ulp, and at float8 boundaries an amax or a rounding flips -- over 10
#    steps that grew to 9e-4 in the gradient norm on one of this project's CPUs (the 16-bit gather
#    the same), past the 1e-4 that holds the runs' own arithmetic. Without clipping: 9.7e-8 /
#    3.9e-8 / 4.9e-16 for both. dp 2 x tp 2 keeps clipping under tp's bounds: 8.4e-5 / 6.5e-3 /
#    5.1e-5 (first loss 2.2e-5), tp 2's own figures. The 8-bit gather's bytes: comm_bytes against
#    bf16's ZeRO-3, exactly (below).
# 3. Checkpoints hold the fp32 masters: an fp8 run saved at step 5 resumes replay-exact, resumes
#    under bf16 (--allow-config-change; its first loss within 5e-3 of the fp8 run's step 6: the
#    quantisation of one step; measured 2.8e-4), and a bf16 checkpoint resumes under fp8 the
#    same way (1.7e-4).
# 4. Refusals, one line each: a bad --fp8-grad, a bad --fp8-recipe.
# 5. Full and selective recomputation equal no recomputation, bit for bit (below).
# 6. The rowwise recipe in the layouts, and the experts (below). Also in 2.: fp32 working weights.
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
cd "$work"
# One run against a reference, over its steps (2. and 6.): every step's loss and gradient norm and
# the final fingerprint within tol (relative); returns the worst of each and the first loss's.
cat > parity.py <<'PY'
import json
load = lambda n: [json.loads(l) for l in open(f"{n}.jsonl")]
steps = lambda run: [r for r in run if r["type"] == "step"]
rel = lambda a, b: abs(a - b) / max(abs(a), 1e-30)
def compare(ref, run, name, tol):
    assert len(steps(run)) == len(steps(ref)) == 10, name
    worst = {}
    for a, b in zip(steps(ref), steps(run)):
        for key, t in (("loss", tol[0]), ("grad_norm", tol[1])):
            worst[key] = max(worst.get(key, 0.0), rel(a[key], b[key]))
            assert rel(a[key], b[key]) <= t, (name, a["step"], key, a[key], b[key])
    for key in ("param_sum", "param_sq"):
        worst["param"] = max(worst.get("param", 0.0), rel(ref[-1][key], run[-1][key]))
        assert rel(ref[-1][key], run[-1][key]) <= tol[2], (name, key, ref[-1][key], run[-1][key])
    return worst, rel(steps(ref)[0]["loss"], steps(run)[0]["loss"])
PY
T=(train --device cpu --log-every 50 --dropout 0)
F=(--precision fp8 --fp8-filter all)

# 1. (the four curves at once: one thread each -- the same arithmetic whatever runs beside it --
#    on the test's two cores)
C=("${T[@]}" --steps 200 --micro-batch 4)
"$KILN_BIN" "${C[@]}" --precision bf16 --log-json c_bf16.jsonl >/dev/null & a=$!
"$KILN_BIN" "${C[@]}" "${F[@]}" --log-json c_fp8.jsonl >c_fp8.out & b=$!
"$KILN_BIN" "${C[@]}" "${F[@]}" --fp8-grad e4m3 --log-json c_fp8_e4m3.jsonl >/dev/null & c=$!
"$KILN_BIN" "${C[@]}" "${F[@]}" --fp8-recipe rowwise --log-json c_rowwise.jsonl >c_rowwise.out & d=$!
"$KILN_BIN" train --device cpu --steps 1 --precision fp8 --log-json auto.jsonl >auto.out || fail "fp8 with the default filter"
wait "$a" || fail "the bf16 curve"
wait "$b" || fail "the fp8 curve"
wait "$c" || fail "the fp8 curve with e4m3 gradients"
wait "$d" || fail "the rowwise fp8 curve"
grep -q "fp8: 16 of the 16 block linear layers in float8 (tensorwise scaling, gradients e5m2, filter all)" c_fp8.out ||
  { cat c_fp8.out; fail "the fp8 line"; }
grep -q "fp8: 16 of the 16 block linear layers in float8 (rowwise scaling, gradients e4m3, filter all)" c_rowwise.out ||
  { cat c_rowwise.out; fail "the rowwise fp8 line"; }
python3 - <<'PY'
import json
load = lambda n: [json.loads(l) for l in open(f"{n}.jsonl")]
losses = lambda run: [r["loss"] for r in run if r["type"] == "step"]
b, f, f4, rw, auto = load("c_bf16"), load("c_fp8"), load("c_fp8_e4m3"), load("c_rowwise"), load("auto")
assert f[0]["float8_layers"] == {"float8": 16, "of": 16}, f[0]["float8_layers"]
assert auto[0]["float8_layers"] == {"float8": 0, "of": 16}, auto[0]["float8_layers"]  # tiny is under the H100 filter
assert f[0]["compute_dtype"] == "BFloat16" and f[0]["config"]["precision"] == "fp8" and f[0]["config"]["param_dtype"] == "bf16"
assert b[0]["float8_layers"] is None
assert rw[0]["config"]["fp8_recipe"] == "rowwise" and rw[0]["config"]["fp8_grad"] == "e4m3" and f[0]["config"]["fp8_grad"] == "e5m2"
lb, lf, l4, lr = losses(b), losses(f), losses(f4), losses(rw)
assert len(lb) == len(lf) == len(l4) == len(lr) == 200 and lf != lb and l4 != lf and lr != l4
mb = sum(lb[-10:]) / 10
BAND = 0.01
for name, l in (("e5m2", lf), ("e4m3", l4), ("rowwise, e4m3", lr)):
    m = sum(l[-10:]) / 10
    print(f"fp8 ({name} gradients), 200 steps: mean of the last 10 losses {m:.5f} against bf16's {mb:.5f} ({(m - mb) / mb:+.3%}); "
          f"step 1 {l[0]:.5f} vs {lb[0]:.5f}")
    assert abs(m - mb) <= BAND * mb and m < 0.5 * l[0], (name, m, mb)
PY

# 2.
P=("${T[@]}" "${F[@]}" --steps 10 --micro-batch 4)
"$KILN_BIN" "${P[@]}" --grad-accum 4 --log-json ref.jsonl >/dev/null & a=$!
mpi 2 "$KILN_BIN" "${P[@]}" --grad-accum 2 --log-json dp2.jsonl >/dev/null
wait "$a" || fail "the one-process fp8 run"
# ZeRO-3 against one process without clipping (ref0; below): --grad-clip 0
"$KILN_BIN" "${P[@]}" --grad-accum 4 --grad-clip 0 --log-json ref0.jsonl >/dev/null & a=$!
mpi 2 "$KILN_BIN" "${P[@]}" --grad-accum 2 --zero 3 --grad-clip 0 --log-json zero3.jsonl >zero3.out
wait "$a" || fail "the one-process fp8 run without clipping"
grep -q "fp8: ZeRO-3 gathers 16 float8 weights in 8 bits" zero3.out || { cat zero3.out; fail "the 8-bit gather's line"; }
mpi 2 "$KILN_BIN" "${T[@]}" --steps 2 --micro-batch 4 --grad-accum 2 --zero 3 --grad-clip 0 --precision bf16 --log-json zero3_bf16.jsonl >/dev/null
mpi 2 "$KILN_BIN" "${P[@]}" --grad-accum 2 --zero 3 --grad-clip 0 --offload optimizer --log-json zero3_off.jsonl >/dev/null
mpi 4 "$KILN_BIN" "${P[@]}" --grad-accum 2 --zero 3 --tp 2 --log-json zero3tp2.jsonl >/dev/null
mpi 2 "$KILN_BIN" "${P[@]}" --grad-accum 4 --tp 2 --log-json tp2.jsonl >/dev/null
mpi 2 "$KILN_BIN" "${P[@]}" --grad-accum 4 --pp 2 --log-json pp2.jsonl >/dev/null
mpi 2 "$KILN_BIN" "${P[@]}" --grad-accum 4 --cp 2 --log-json cp2.jsonl >/dev/null
mpi 2 "$KILN_BIN" "${P[@]}" --grad-accum 4 --tp 2 --sp --log-json sp2.jsonl >/dev/null
"$KILN_BIN" "${P[@]}" --grad-accum 4 --param-dtype fp32 --log-json ref_fp32.jsonl >/dev/null & a=$!
mpi 2 "$KILN_BIN" "${T[@]}" --steps 2 --micro-batch 4 --grad-accum 4 --tp 2 --sp --precision bf16 --log-json sp2_bf16.jsonl >/dev/null
wait "$a" || fail "fp8 with fp32 working weights"
python3 - <<'PY'
from parity import load, steps, rel, compare
ref, ref0 = load("ref"), load("ref0")
for name, shape, tol in (("dp2", (2, 1, 1), (1e-4, 1e-4, 1e-4)), ("zero3", (2, 1, 1), (1e-4, 1e-4, 1e-4)),
                         ("zero3_off", (2, 1, 1), (1e-4, 1e-4, 1e-4)), ("zero3tp2", (2, 2, 1), (5e-4, 2e-2, 2e-4)),
                         ("tp2", (1, 2, 1), (5e-4, 2e-2, 2e-4)), ("pp2", (1, 1, 2), (5e-4, 2e-2, 2e-4)),
                         ("cp2", (1, 1, 1), (5e-4, 2e-2, 2e-4)), ("sp2", (1, 2, 1), (5e-4, 2e-2, 2e-4))):
    run = load(name)
    base = ref0 if name in ("zero3", "zero3_off") else ref
    w = run[0]["world"]
    assert (w["dp"], w["tp"], w["pp"]) == shape and run[0]["config"]["precision"] == "fp8", w
    assert run[0]["float8_layers"]["float8"] == (8 if name == "pp2" else 16), run[0]["float8_layers"]
    worst, first = compare(base, run, name, tol)
    # The first step (the same weights): tp's only difference is the row-parallel partial sums'
    # bf16 rounding when every split tensor takes the group's amax (measured 2.3e-5); each rank's
    # own amax quantises other values (1.4e-4, the reductions turned off by hand).
    assert name not in ("tp2", "cp2", "sp2", "zero3tp2") or first <= 5e-5, (name, first)
    assert name != "cp2" or w["cp"] == 2, w
    print(f"fp8 {name} vs one fp8 process: " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()) + f", first loss {first:.1e}")
# sp's 8-bit gather, in the step's comm_bytes (distributed/comm.h's algorithm bytes) against bf16's
# sp: a column layer (c_attn, c_fc: 8 of them) gathers x's rows in 8 bits, not 16 (B T d bytes,
# not 2 B T d), keeps them for backward (bf16's GatheredLinear gathers its 2 B T d again there),
# and all-reduces two fp32 amaxes over tp each micro-step (x's over the gather, g's: 2 x 4 bytes
# each); a row layer (attn.c_proj, mlp.c_proj: 8) one (x's); every layer's W's once a step (its
# kept 8-bit forms, GPT::keep_float8_weights: 16 x 8 bytes). Both reduce-scatter dX in bf16. So a
# step's bf16 - fp8 = 4 (8 (3 B T d - 16) - 8 x 8) - 16 x 8 at grad-accum 4; B 4, T 128, d 128.
B, T, d = 4, 128, 128
want = 4 * (8 * (3 * B * T * d - 16) - 8 * 8) - 16 * 8
sb, sf = steps(load("sp2_bf16")), steps(load("sp2"))
got = sb[0]["comm_bytes"] - sf[0]["comm_bytes"]
print(f"fp8 sp2's 8-bit gathers: {got} bytes a step fewer than bf16 sp2's ({sf[0]['comm_bytes']} against {sb[0]['comm_bytes']}; want {want})")
assert got == want and all(r["comm_bytes"] == sf[0]["comm_bytes"] for r in sf), (got, want)
# ZeRO-3's 8-bit gather (parallel/zero.h, "Float8 weights"), in comm_bytes against bf16's ZeRO-3:
# each block's four float8 weights (a unit of 196,608 elements, padded alike: 196,608 = 1536 x 128)
# gathered in 1 byte instead of 2, every micro-step for the forward (4 blocks) and again for the
# backward (3: the last block stays gathered), and once a step their 4 amaxes all-reduced per
# block (2 x 4 bytes each). So per step bf16 - fp8 = 2 x 7 x 196,608 - 4 x 4 x 8 (grad-accum 2).
want = 2 * 7 * 196608 - 4 * 4 * 8
zb, zf = steps(load("zero3_bf16")), steps(load("zero3"))
assert load("zero3_bf16")[0]["config"]["param_dtype"] == load("zero3")[0]["config"]["param_dtype"] == "bf16"
got = zb[0]["comm_bytes"] - zf[0]["comm_bytes"]
print(f"fp8 ZeRO-3's 8-bit weight gathers: {got} bytes a step fewer than bf16 ZeRO-3's ({zf[0]['comm_bytes']} against {zb[0]['comm_bytes']}; want {want})")
assert got == want and all(r["comm_bytes"] == zf[0]["comm_bytes"] for r in zf), (got, want)
# fp32 working weights: the float8 layers quantise W from fp32 (not from its bf16 rounding: the
# two roundings differ where bf16's crosses an e4m3 boundary), the other layers take autocast's
# bf16 copy of it; AdamW's fp32 masters are the same, but bf16 working weights drop the updates
# under half their ulp each step -- bf16's own fp32-vs-bf16 working weights differ by 5.3e-4 over
# these 10 steps; fp8's measured 6.6e-4. Held to 2e-3.
f32 = load("ref_fp32")
assert f32[0]["config"]["param_dtype"] == "fp32" and f32[0]["float8_layers"]["float8"] == 16
worst = max(rel(a["loss"], b["loss"]) for a, b in zip(steps(ref), steps(f32)))
print(f"fp8 with fp32 working weights vs bf16 ones: loss within {worst:.1e} over 10 steps")
assert len(steps(f32)) == 10 and worst <= 2e-3, worst
PY

# 3.
R=("${T[@]}" --steps 10 --micro-batch 4)
"$KILN_BIN" "${R[@]}" "${F[@]}" --log-json full.jsonl >/dev/null & a=$!
"$KILN_BIN" "${R[@]}" "${F[@]}" --save-dir ck --save-every 5 --stop-at-step 8 >/dev/null
wait "$a" || fail "the uninterrupted fp8 run"
"$KILN_BIN" "${R[@]}" "${F[@]}" --save-dir ck --resume ck/step_00000005 --log-json resumed.jsonl >/dev/null & a=$!
"$KILN_BIN" "${R[@]}" --precision bf16 --save-dir ck2 --resume ck/step_00000005 --allow-config-change --log-json as_bf16.jsonl >as_bf16.out
wait "$a" || fail "the fp8 resume"
grep -q "precision" as_bf16.out || { cat as_bf16.out; fail "the precision change was not reported"; }
"$KILN_BIN" "${R[@]}" --precision bf16 --log-json bfull.jsonl --save-dir ck3 --save-every 5 >/dev/null
"$KILN_BIN" "${R[@]}" "${F[@]}" --save-dir ck4 --resume ck3/step_00000005 --allow-config-change --log-json as_fp8.jsonl >/dev/null
python3 - <<'PY'
import json
s = lambda n: {r["step"]: r["loss"] for r in map(json.loads, open(f"{n}.jsonl")) if r["type"] == "step"}
full, resumed, as_bf16, bfull, as_fp8 = s("full"), s("resumed"), s("as_bf16"), s("bfull"), s("as_fp8")
assert sorted(resumed) == list(range(6, 11)) and all(resumed[k] == full[k] for k in resumed), [(k, resumed[k], full[k]) for k in resumed]
a = abs(as_bf16[6] - full[6]) / full[6]
b = abs(as_fp8[6] - bfull[6]) / bfull[6]
print(f"resume: fp8 steps 6-10 == the uninterrupted run; fp8 -> bf16 step 6 within {a:.1e}, bf16 -> fp8 within {b:.1e}")
assert a <= 5e-3 and b <= 5e-3 and as_bf16[6] != full[6]
PY

# 5. Activation checkpointing: full and selective recomputation rerun the float8 forward on the
#    same values (the same amax, the same quantised operands; selective's GELU hook steps aside
#    for a float8 feed-forward), so every loss and gradient norm equals the run without, bit for bit.
A=("${T[@]}" "${F[@]}" --steps 6 --micro-batch 4)
"$KILN_BIN" "${A[@]}" --log-json ac_none.jsonl >/dev/null & a=$!
"$KILN_BIN" "${A[@]}" --activation-checkpointing full --log-json ac_full.jsonl >/dev/null
wait "$a" || fail "fp8 without recomputation"
"$KILN_BIN" "${A[@]}" --activation-checkpointing selective --log-json ac_selective.jsonl >/dev/null
python3 - <<'PY'
import json
s = lambda n: [(r["loss"], r["grad_norm"]) for r in map(json.loads, open(f"{n}.jsonl")) if r["type"] == "step"]
none = s("ac_none")
assert len(none) == 6 and s("ac_full") == none and s("ac_selective") == none
print("fp8 with full and with selective recomputation == without, bit for bit (6 steps)")
PY

# 6. The rowwise recipe against one rowwise process (P's batches): ZeRO-3 over 2 (its layer keeps
#    the gathered 16-bit W for backward, as bf16's linear does: 1e-4 as DDP's above), tp 2 (the
#    amaxes over n and k all-reduced over tp), cp 2 (over m: dW's scales run over the tokens),
#    tp 2 + sp -- held to the tensorwise layouts' bounds (above); and tiny-moe's experts in float8 (rowwise only) at
#    dp 2 (1e-4, as DDP's above) and at ep 2 over dp 2 against one process. Under ep, y's and dX's
#    scales are a token's own (the first loss equal: measured 0), and only dW's (a feature's amax
#    over the tokens the expert got: the two ranks' micro-batches together under ep, one
#    micro-batch at a time in one process) see the layout; bf16's own ep 2 drifts from one
#    process by up to 9.8e-4 on the loss over these 10 steps (the experts' products batched
#    otherwise; its fingerprint by 1.2e-4; tensorwise fp8's, whose experts are bf16, by 5.1e-4 and
#    3.1e-4): held to 2e-3 on the loss, tp's 2e-2 on the norm, 5e-4 on the fingerprint. Measured
#    (loss / norm / fingerprint): rowwise ZeRO-3 0 / 3.0e-8 / 1.9e-11 (with clipping; compared
#    without it since 2026-12-07, 2.'s reason: with it 3.6e-4 in the norm on another CPU), tp 2 6.4e-5 / 2.5e-3 / 8.9e-6 (first loss 7.6e-6), cp 2
#    2.0e-4 / 3.5e-3 / 4.4e-6 (1.5e-7), tp 2 + sp 9.7e-5 / 5.8e-3 / 6.0e-6 (7.6e-6), MoE dp 2
#    8.2e-8 / 0 / 5.0e-13 (0), ep 2 6.5e-4 / 9.2e-3 / 1.5e-4 (0).
W=("${P[@]}" --fp8-recipe rowwise)
"$KILN_BIN" "${W[@]}" --grad-accum 4 --log-json rw_ref.jsonl >/dev/null & a=$!
mpi 2 "$KILN_BIN" "${W[@]}" --grad-accum 4 --tp 2 --log-json rw_tp2.jsonl >/dev/null
wait "$a" || fail "the one-process rowwise run"
mpi 2 "$KILN_BIN" "${W[@]}" --grad-accum 4 --cp 2 --log-json rw_cp2.jsonl >/dev/null
mpi 2 "$KILN_BIN" "${W[@]}" --grad-accum 4 --tp 2 --sp --log-json rw_sp2.jsonl >/dev/null
# ZeRO-3 without clipping, against one process without it (2.'s reason)
"$KILN_BIN" "${W[@]}" --grad-accum 4 --grad-clip 0 --log-json rw_ref0.jsonl >/dev/null & a=$!
mpi 2 "$KILN_BIN" "${W[@]}" --grad-accum 2 --zero 3 --grad-clip 0 --log-json rw_zero3.jsonl >/dev/null
wait "$a" || fail "the one-process rowwise run without clipping"
E=(train --device cpu --model tiny-moe --steps 10 --log-every 100 --micro-batch 2 --seq-len 64 --dropout 0 "${F[@]}" --fp8-recipe rowwise)
"$KILN_BIN" "${E[@]}" --grad-accum 4 --log-json moe_ref.jsonl >moe_ref.out & a=$!
mpi 2 "$KILN_BIN" "${E[@]}" --grad-accum 2 --ep 2 --log-json moe_ep2.jsonl >/dev/null
wait "$a" || fail "the one-process rowwise MoE run"
mpi 2 "$KILN_BIN" "${E[@]}" --grad-accum 2 --log-json moe_dp2.jsonl >/dev/null
"$KILN_BIN" "${E[@]}" --fp8-recipe tensorwise --steps 1 --log-json moe_tw.jsonl >/dev/null
python3 - <<'PY'
from parity import load, compare
# tiny-moe: 4 blocks of attention's 2 layers and 8 experts' 2: all in float8 under rowwise, the
# experts left in bf16 under tensorwise
assert load("moe_ref")[0]["float8_layers"] == {"float8": 72, "of": 72}, load("moe_ref")[0]["float8_layers"]
assert load("moe_tw")[0]["float8_layers"] == {"float8": 8, "of": 72}, load("moe_tw")[0]["float8_layers"]
for ref_name, name, tol in (("rw_ref0", "rw_zero3", (1e-4, 1e-4, 1e-4)), ("rw_ref", "rw_tp2", (5e-4, 2e-2, 2e-4)), ("rw_ref", "rw_cp2", (5e-4, 2e-2, 2e-4)),
                            ("rw_ref", "rw_sp2", (5e-4, 2e-2, 2e-4)), ("moe_ref", "moe_dp2", (1e-4, 1e-4, 1e-4)),
                            ("moe_ref", "moe_ep2", (2e-3, 2e-2, 5e-4))):
    ref, run = load(ref_name), load(name)
    assert run[0]["config"]["fp8_recipe"] == "rowwise"
    worst, first = compare(ref, run, name, tol)
    assert first <= 5e-5, (name, first)
    print(f"fp8 rowwise {name} vs one rowwise process: " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()) + f", first loss {first:.1e}")
PY

# 4.
expect_refused 1 "--fp8-grad must be one of auto, e4m3, e5m2" train --device cpu --steps 1 --precision fp8 --fp8-grad e3m4
expect_refused 1 "--fp8-recipe must be one of rowwise, tensorwise" train --device cpu --steps 1 --precision fp8 --fp8-recipe blockwise
echo "PASS"
