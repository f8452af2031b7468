#!/usr/bin/env bash
# tests/cli/sequence_parallel.sh -- sequence parallelism (--sp) and context parallelism (--cp) end
# to end against the single process at the same global batch of 8 sequences (label mpi), the
# tiny preset (L 4, d 128, T 128, 4 heads), 10 steps:
#   tp 2 with and without --sp; tp 2 + sp with full and selective recomputation, with ZeRO-1
#   and ZeRO-3 over dp 2, with pp 2, with one kv head (replicated over tp); cp 2, cp 2 x tp 2,
#   cp 2 x dp 2 (DDP), cp 2 x dp 2 under ZeRO-1, cp 2 under ZeRO-3, cp 2 x tp 2 x dp 2 under
#   ZeRO-1 (8 ranks), cp 2 x pp 2, cp 2 x tp 2 x pp 2 (8 ranks, steps 1-5); cp 4 at seq 256
#   against its own single process.
# Tolerance: relative 1e-5 on every step's loss and gradient norm and the final weights'
# fingerprint, tp's (tests/cli/tp_parity.sh): the split layers and the gathered attention sum
# the same products in another order (measured ~1e-7). A missing reduction over tp or cp, a bias
# added twice, a wrong position or a leaked future key moves these by 1e-3 or more.
# bf16 (tp 2 + sp, cp 2; 5 steps: this CPU computes bf16 18-25x slower than fp32): 5e-4 loss /
# 2e-2 norm / 2e-4 fingerprint, the tolerances of the 16-bit layouts (tests/cli/param_dtype_zero.sh):
# the reordered sums round differently in bf16.
# Dropout 0.1: --sp draws the residual masks of the whole sequence and keeps its rows, so tp 2 +
# sp equals tp 2 (same attention streams) within 1e-6; cp 2 runs are reproducible.
# comm_bytes exactly, fp32, A = B T d x 4 (one [B, T, d] fp32 activation), R = the replicated
# parameters (6 L d + 2 d + T d), K micro-batches:
#   tp 2 + sp   tp 2's bytes + K (8 R + (2 L + 1) A): every tp all-reduce of activations became an
#               all-gather + a reduce-scatter of the same total, the column layers' inputs are
#               gathered again in backward (2 per block and the head), and the replicated
#               parameters' gradients are all-reduced over tp (parallel/sequence_parallel.h);
#               full recomputation: + K 4 L A (the recomputed forward's gathers and scatters)
#   cp n        DDP over dp x cp (2 x 4 psi + 16) + K L 4 A / (t) (the K/V all-gather forward and
#               its reduce-scatter backward, the whole sequence's K and V, parallel/context_parallel.h);
#               with tp the tp collectives move the rank's T / n positions
# Memory: the config record's activation estimate (kiln plan's) falls with --sp and --cp, and with
# --cp the measured peak (VmHWM) by at least half as much.
# Checkpoints: cp 2 x tp 2's step-5 checkpoint and cp 2 x tp 2 x pp 2's (it stops at 5) resume on one
# process; the single process's step-5 checkpoint resumes at tp 2 + sp: steps 6-10 and the step-10
# weights within 1e-5 of the reference.
# Every process computes on one thread (OMP_NUM_THREADS=1); the single-process runs go two at a time.
# Bad input: --sp without --tp, --sp with tp not dividing the sequence, 2 cp not dividing it, 2 cp
# tp not dividing it under cp with sp (built since: tests/cli/compose.sh), cp not dividing the world.
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
export OMP_NUM_THREADS=1
T=(train --device cpu --model tiny --steps 10 --log-every 100 --micro-batch 2)
TB=(train --device cpu --model tiny --steps 5 --log-every 100 --micro-batch 2 --precision bf16)

"$KILN_BIN" "${T[@]}" --grad-accum 4 --save-dir "$work/ref" --save-every 5 --keep-last 0 --log-json "$work/ref.jsonl" >/dev/null & bg=($!)
"$KILN_BIN" "${TB[@]}" --grad-accum 4 --log-json "$work/ref_bf16.jsonl" >/dev/null
wait "${bg[@]}"
"$KILN_BIN" "${T[@]}" --grad-accum 4 --n-kv-head 1 --log-json "$work/ref_kv1.jsonl" >/dev/null & bg=($!)
"$KILN_BIN" "${T[@]}" --grad-accum 4 --seq-len 256 --log-json "$work/ref_256.jsonl" >/dev/null
wait "${bg[@]}"
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 4 --tp 2 --log-json "$work/tp2.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 4 --tp 2 --sp --log-json "$work/sp.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 4 --tp 2 --sp --activation-checkpointing full --log-json "$work/sp_full.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 4 --tp 2 --sp --activation-checkpointing selective --log-json "$work/sp_sel.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 2 --tp 2 --sp --zero 1 --log-json "$work/sp_dp2_z1.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 2 --tp 2 --sp --zero 3 --log-json "$work/sp_dp2_z3.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 4 --tp 2 --sp --pp 2 --log-json "$work/sp_pp2.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 4 --tp 2 --sp --n-kv-head 1 --log-json "$work/sp_kv1.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${TB[@]}" --grad-accum 4 --tp 2 --sp --log-json "$work/sp_bf16.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 4 --tp 2 --dropout 0.1 --log-json "$work/tp2_drop.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 4 --tp 2 --sp --dropout 0.1 --log-json "$work/sp_drop.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 4 --cp 2 --log-json "$work/cp2.jsonl" >"$work/cp2.out"
# The start-up line names cp (it printed "dp 1 tp 1 pp 1"; issue 48, item 12).
grep -q "2 rank(s) (dp 1 cp 2 tp 1 pp 1)" "$work/cp2.out" || fail "the start-up line leaves out cp: $(grep '^kiln: ' "$work/cp2.out" | head -n 1)"
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 4 --cp 2 --tp 2 --save-dir "$work/cp2_tp2" --save-every 5 --keep-last 0 \
  --log-json "$work/cp2_tp2.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 2 --cp 2 --log-json "$work/cp2_dp2.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 2 --cp 2 --zero 1 --log-json "$work/cp2_dp2_z1.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 4 --cp 2 --zero 3 --log-json "$work/cp2_z3.jsonl" >/dev/null
mpi 8 "$KILN_BIN" "${T[@]}" --grad-accum 2 --cp 2 --tp 2 --zero 1 --log-json "$work/cp2_tp2_dp2_z1.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${TB[@]}" --grad-accum 4 --cp 2 --log-json "$work/cp2_bf16.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 4 --cp 4 --seq-len 256 --log-json "$work/cp4_256.jsonl" >/dev/null
# cp with pp: each stage runs its blocks on the rank's two chunks; the stages exchange them
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 4 --cp 2 --pp 2 --log-json "$work/cp2_pp2.jsonl" >/dev/null
for run in a b; do
  mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 4 --cp 2 --dropout 0.1 --log-json "$work/cp2_drop_$run.jsonl" >/dev/null
done
# Checkpoints: consolidated whatever the layout.
mpi 8 "$KILN_BIN" "${T[@]}" --grad-accum 4 --cp 2 --tp 2 --pp 2 --stop-at-step 5 --save-dir "$work/cp2_tp2_pp2" \
  --log-json "$work/cp2_tp2_pp2.jsonl" >/dev/null
"$KILN_BIN" "${T[@]}" --grad-accum 4 --resume "$work/cp2_tp2/step_00000005" --save-dir "$work/from_cp" \
  --log-json "$work/from_cp.jsonl" >/dev/null & bg=($!)
"$KILN_BIN" "${T[@]}" --grad-accum 4 --resume "$work/cp2_tp2_pp2/step_00000005" --save-dir "$work/from_cp_pp" \
  --log-json "$work/from_cp_pp.jsonl" >/dev/null
wait "${bg[@]}"
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 4 --tp 2 --sp --resume "$work/ref/step_00000005" --save-dir "$work/to_sp" \
  --log-json "$work/to_sp.jsonl" >/dev/null

# Memory: the config record's estimate (kiln plan's activation bytes per rank) and the measured
# peak (VmHWM on the CPU: the process, LibTorch's ~0.4 GB included), 2 steps each: the single
# process against cp 2 (tiny, T 512, B 4, dropout 0.1).
M2=(train --device cpu --model tiny --steps 2 --log-every 100 --micro-batch 4 --seq-len 512 --dropout 0.1)
"$KILN_BIN" "${M2[@]}" --log-json "$work/mem_one.jsonl" >/dev/null & bg=($!)
mpi 2 "$KILN_BIN" "${M2[@]}" --cp 2 --log-json "$work/mem_cp2.jsonl" >/dev/null
wait "${bg[@]}"

python3 - "$work" "$(dirname "$0")" <<'PY'
import sys
d, here = sys.argv[1], sys.argv[2]
sys.path.insert(0, here)
from zero_expect import load, compare, max_weight_diff, steps
ref = {n: load(f"{d}/{f}.jsonl") for n, f in (("fp32", "ref"), ("bf16", "ref_bf16"), ("kv1", "ref_kv1"), ("256", "ref_256"))}

def world(run):
    w = run[0]["world"]
    return {k: w[k] for k in ("dp", "tp", "cp", "sp")}

def bytes_per_step(run):
    got = {r["comm_bytes"] for r in run if r["type"] == "step"}
    assert len(got) == 1, got
    return got.pop()

for name, ref_name, layout in (("sp", "fp32", (1, 2, 1, True)), ("sp_full", "fp32", (1, 2, 1, True)),
                               ("sp_sel", "fp32", (1, 2, 1, True)), ("sp_dp2_z1", "fp32", (2, 2, 1, True)),
                               ("sp_dp2_z3", "fp32", (2, 2, 1, True)), ("sp_pp2", "fp32", (1, 2, 1, True)),
                               ("sp_kv1", "kv1", (1, 2, 1, True)), ("cp2", "fp32", (1, 1, 2, False)),
                               ("cp2_tp2", "fp32", (1, 2, 2, False)), ("cp2_dp2", "fp32", (2, 1, 2, False)),
                               ("cp2_dp2_z1", "fp32", (2, 1, 2, False)), ("cp2_z3", "fp32", (1, 1, 2, False)),
                               ("cp2_tp2_dp2_z1", "fp32", (2, 2, 2, False)), ("cp2_pp2", "fp32", (1, 1, 2, False)),
                               ("cp4_256", "256", (1, 1, 4, False))):
    run = load(f"{d}/{name}.jsonl")
    assert tuple(world(run).values()) == layout, (name, world(run))
    print(f"{name}: {world(run)}, within {compare(ref[ref_name], run, name, 1e-5):.1e} of the single process")

# bf16: the 16-bit layouts' tolerances.
for name in ("sp_bf16", "cp2_bf16"):
    sr, ss = steps(ref["bf16"]), steps(load(f"{d}/{name}.jsonl"))
    rel = lambda a, b: abs(a - b) / abs(a)
    worst = {k: max(rel(sr[s][k], ss[s][k]) for s in sr) for k in ("loss", "grad_norm")}
    assert worst["loss"] <= 5e-4 and worst["grad_norm"] <= 2e-2, (name, worst)
    run, rr = load(f"{d}/{name}.jsonl"), ref["bf16"]
    p = max(rel(rr[-1][k], run[-1][k]) for k in ("param_sum", "param_sq"))
    assert p <= 2e-4, (name, p)
    print(f"{name}: bf16, loss within {worst['loss']:.1e}, norm {worst['grad_norm']:.1e}, fingerprint {p:.1e}")

# Dropout: sp's masks are tp's.
loss = lambda n: [r["loss"] for r in load(f"{d}/{n}.jsonl") if r["type"] == "step"]
worst = max(abs(a - b) / a for a, b in zip(loss("tp2_drop"), loss("sp_drop")))
assert worst <= 1e-6 and loss("tp2_drop") != loss("tp2"), ("sp's dropout masks are not tp's", worst)
print(f"dropout 0.1: tp 2 + sp within {worst:.1e} of tp 2")
assert loss("cp2_drop_a") == loss("cp2_drop_b") and loss("cp2_drop_a") != loss("cp2"), "cp dropout not reproducible"
print("dropout 0.1: cp 2 reproducible")

# comm_bytes, exactly.
c = ref["fp32"][0]["config"]
B, Tn, dm, L, K = c["micro_batch"], c["seq_len"], c["d_model"], c["n_layer"], 4
A = B * Tn * dm * 4
R = 6 * L * dm + 2 * dm + Tn * dm
tp2 = K * 2 * ((4 * L + 2) * A + 4 * B * Tn + 8 * B * Tn) + 2 * 8
assert bytes_per_step(load(f"{d}/tp2.jsonl")) == tp2
want = {"sp": tp2 + K * (8 * R + (2 * L + 1) * A), "sp_sel": tp2 + K * (8 * R + (2 * L + 1) * A),
        "sp_full": tp2 + K * (8 * R + (2 * L + 1) * A + 4 * L * A)}
psi = ref["fp32"][0]["params_local"]
want["cp2"] = 2 * 4 * psi + 16 + K * L * 4 * A
want["cp2_dp2"] = 2 * 4 * psi + 16 + 2 * L * 4 * A  # K 2
cptp = load(f"{d}/cp2_tp2.jsonl")
n, t = 2, 2
want["cp2_tp2"] = (K * 2 * ((4 * L + 2) * A // n + 12 * B * Tn // n) + 2 * 8   # tp over the rank's T/2 positions
                   + K * L * 4 * A // t                                            # K and V of the rank's heads
                   + 2 * 4 * cptp[0]["params_local"] + 16)                         # DDP over dp x cp
for name, b in want.items():
    got = bytes_per_step(cptp if name == "cp2_tp2" else load(f"{d}/{name}.jsonl"))
    assert got == b, (name, got, b)
    print(f"{name}: comm_bytes {got} per step, as worked out")

# Memory: the estimate falls (sp: the replicated regions / t; cp: all but K and V / cp), and for
# cp the measured peak by at least half the estimated fall (the peak also holds transients).
# sp's fall is within VmHWM's run-to-run spread (a 75 MB fall measured as 10-94 MB over four
# pairs of d 512 runs: glibc keeps freed pages), so sp's measurement is test_sequence_parallel.cpp's
# (bytes in use, per layer).
est = lambda n: load(f"{d}/{n}.jsonl")[0]["activations"]["estimate_bytes"]
assert est("sp") < est("tp2"), (est("sp"), est("tp2"))
print(f"sp: activations estimated {est('tp2') / 1e6:.2f} -> {est('sp') / 1e6:.2f} MB per rank")
one, cp2 = est("mem_one"), est("mem_cp2")
pb, ps = (max(r["mem_gb"] for r in load(f"{d}/{n}.jsonl") if r["type"] == "step") * 1e9 for n in ("mem_one", "mem_cp2"))
assert one / 2 < cp2 < one / 1.8, (one, cp2)  # / cp, but for the whole K and V and the mask
assert pb - ps >= 0.5 * (one - cp2), (one, cp2, pb, ps)
print(f"cp 2: activations estimated {one / 1e6:.1f} -> {cp2 / 1e6:.1f} MB, measured peak {pb / 1e6:.0f} -> {ps / 1e6:.0f} MB")

assert all(load(f"{d}/{n}.jsonl")[0]["world"]["pp"] == 2 for n in ("cp2_pp2", "cp2_tp2_pp2"))
# cp 2 x tp 2 x pp 2 ran steps 1-5 (then saved): each step's loss and norm within 1e-5
run, sr = load(f"{d}/cp2_tp2_pp2.jsonl"), steps(ref["fp32"])
assert world(run) == {"dp": 1, "tp": 2, "cp": 2, "sp": False} and sorted(steps(run)) == list(range(1, 6)), world(run)
worst = max(abs(sr[s][k] - r[k]) / abs(sr[s][k]) for s, r in steps(run).items() for k in ("loss", "grad_norm"))
assert worst <= 1e-5, worst
print(f"cp2_tp2_pp2: steps 1-5 within {worst:.1e} of the single process")
for name in ("from_cp", "from_cp_pp", "to_sp"):
    run = load(f"{d}/{name}.jsonl")
    assert sorted(steps(run)) == list(range(6, 11)) and run[0]["resumed_from"], name
    worst = compare(ref["fp32"], run, name, 1e-5, first=6)
    w = max_weight_diff(f"{d}/ref/step_00000010/model.safetensors", f"{d}/{name}/step_00000010/model.safetensors")
    assert w <= 1e-5, (name, w)
    print(f"{name}: resumed, steps 6-10 within {worst:.1e}; step-10 weights within {w:.1e}")
PY

expect_refused 1 "--sp .*needs --tp 2 or more" "${T[@]}" --sp
expect_refused 2 "--sp needs --tp 2 to divide the sequence length \(127\)" "${T[@]}" --tp 2 --sp --seq-len 127
expect_refused 2 "--cp 3 needs the sequence length \(128\) to divide into 2 x cp = 6 chunks" "${T[@]}" --cp 3
expect_refused 2 "--cp 3 with --sp needs the sequence length \(126\) to divide into 2 x cp x tp = 12 blocks" "${T[@]}" --cp 3 --tp 2 --sp --seq-len 126
expect_refused 2 "layout does not divide the world" "${T[@]}" --cp 4
echo "PASS"
