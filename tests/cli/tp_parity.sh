#!/usr/bin/env bash
# tests/cli/tp_parity.sh -- tensor parallelism end to end against the single process at the same
# global batch of 8 sequences (label mpi):
#   reference   1 process, micro-batch 2 x grad-accum 4
#   tp 2        2 ranks (dp 1), 2 x 4; and with --activation-checkpointing full, selective
#   tp 4        4 ranks (dp 1), 2 x 4
#   tp 2 dp 2   4 ranks, 2 x 2 (DDP over dp)
# Checked over 10 steps: loss and gradient norm per step and the final weights' fingerprint
# (split parameters summed over tp) within a relative 1e-5, the DDP parity tolerance
# (tests/cli/ddp_parity.sh): the split layers sum the same products in another order (partial
# sums over tp, then an all-reduce), measured 2.5e-7 on losses at tp 2. A missing all-reduce, a
# bias added tp times or a wrong head slice moves these by 1e-2 or more.
# Also exactly: comm_bytes per step. Per micro-step, with A = B T d x 4 bytes of activation: 2
# all-reduces per block forward (attention and MLP outputs) and 2 backward (their inputs'
# gradients), 1 for the embedding, 1 for the output layer's input gradient, and the loss's max
# [B T] and [target logit, sum exp] [2, B T]; per step the norm's 8-byte all-reduce; each
# all-reduce counted twice (distributed/comm.h). With dp 2, DDP's 2 x 4 psi_local + 16 on top; with
# full activation checkpointing the recomputed forward's 2 all-reduces per block again.
# ZeRO-1, and ZeRO-3 with --offload all, over dp 2 of tp 2: parity as above.
# Checkpoints: a tp 1 checkpoint resumed at tp 2, the tp 2 x dp 2 ZeRO-3 (--offload all) run's at tp 1
# (one process), both from step 5: steps 6-10 within 1e-5 and the consolidated step-10 weights within
# 1e-5 of the reference's.
# GQA with tp above the kv heads (replicated): kv 1 at tp 2 (and its checkpoint), kv 2 at tp 4.
# ZeRO-1 and ZeRO-3 over dp 2 of tp 2 with the kv head replicated: parity as above.
# Bad input: tp not dividing the heads; tp and the kv heads not dividing one another; tp x pp
# not dividing the world.
# Every process computes on one thread (OMP_NUM_THREADS=1); the single-process runs go two at a time.
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
export OMP_NUM_THREADS=1
T=(train --device cpu --model tiny --steps 10 --log-every 100 --micro-batch 2)

"$KILN_BIN" "${T[@]}" --grad-accum 4 --save-dir "$work/ref" --save-every 5 --keep-last 0 --log-json "$work/ref.jsonl" >/dev/null & bg=($!)
"$KILN_BIN" "${T[@]}" --grad-accum 4 --n-kv-head 1 --save-dir "$work/ref_kv1" --log-json "$work/ref_kv1.jsonl" >/dev/null
wait "${bg[@]}"
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 4 --tp 2 --log-json "$work/tp2.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 4 --tp 2 --activation-checkpointing full --log-json "$work/tp2_ac.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 4 --tp 2 --activation-checkpointing selective --log-json "$work/tp2_sel.jsonl" >/dev/null
# Dropout under tp: attention dropout draws from each tp rank's own stream (so it cannot match
# the single process); the runs must be reproducible and activation checkpointing must replay
# the same masks.
for run in a b; do
  mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 4 --tp 2 --dropout 0.1 --log-json "$work/drop_$run.jsonl" >/dev/null
done
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 4 --tp 2 --dropout 0.1 --activation-checkpointing full --log-json "$work/drop_ac.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 4 --tp 4 --log-json "$work/tp4.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 2 --tp 2 --log-json "$work/tp2dp2.jsonl" >/dev/null
# ZeRO over dp of each tp slice.
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 2 --tp 2 --zero 1 --log-json "$work/tp2dp2_z1.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 2 --tp 2 --zero 3 --offload all --save-dir "$work/tp2dp2_z3" --save-every 5 \
  --keep-last 0 --log-json "$work/tp2dp2_z3.jsonl" >/dev/null
# Grouped-query attention with more tp ranks than kv heads: the kv heads are replicated.
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 4 --n-kv-head 1 --tp 2 --save-dir "$work/kv1_tp2" --log-json "$work/kv1_tp2.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 4 --n-kv-head 2 --tp 4 --log-json "$work/kv2_tp4.jsonl" >/dev/null
# ... under ZeRO over dp: the replicated kv rows count KV/tp in the sharded norm and fingerprint.
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 2 --n-kv-head 1 --tp 2 --zero 1 --log-json "$work/kv1_tp2_z1.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 2 --n-kv-head 1 --tp 2 --zero 3 --log-json "$work/kv1_tp2_z3.jsonl" >/dev/null
# Checkpoints across tp sizes: tp 1 -> tp 2 (from the reference's step 5), tp 2 x dp 2 -> tp 1.
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 4 --tp 2 --resume "$work/ref/step_00000005" --save-dir "$work/to_tp2" \
  --log-json "$work/to_tp2.jsonl" >/dev/null
"$KILN_BIN" "${T[@]}" --grad-accum 4 --resume "$work/tp2dp2_z3/step_00000005" --save-dir "$work/to_tp1" \
  --log-json "$work/to_tp1.jsonl" >/dev/null & bg=($!)
"$KILN_BIN" "${T[@]}" --grad-accum 4 --n-kv-head 2 --log-json "$work/ref_kv2.jsonl" >/dev/null
wait "${bg[@]}"

python3 - "$work" "$(dirname "$0")" <<'PY'
import sys
d, here = sys.argv[1], sys.argv[2]
sys.path.insert(0, here)
from zero_expect import load, compare
ref = load(f"{d}/ref.jsonl")
for name, tp, dp, K in (("tp2", 2, 1, 4), ("tp2_ac", 2, 1, 4), ("tp2_sel", 2, 1, 4), ("tp4", 4, 1, 4), ("tp2dp2", 2, 2, 2)):
    run = load(f"{d}/{name}.jsonl")
    w = run[0]["world"]
    assert (w["tp"], w["dp"]) == (tp, dp), w
    worst = compare(ref, run, name, 1e-5)
    c = run[0]["config"]
    B, Tn, dm, L = c["micro_batch"], c["seq_len"], c["d_model"], c["n_layer"]
    A = B * Tn * dm * 4
    per_micro = 2 * ((4 * L + 2) * A + 4 * B * Tn + 8 * B * Tn)
    if c["activation_checkpointing"] == "full":
        per_micro += 2 * 2 * L * A  # the recomputed forward all-reduces its blocks' outputs again
    want = K * per_micro + 2 * 8
    if dp > 1:
        want += 2 * 4 * run[0]["params_local"] + 2 * 8
    got = {r["comm_bytes"] for r in run if r["type"] == "step"}
    assert got == {want}, (name, got, want)
    print(f"{name}: within {worst:.1e} of the single process; comm_bytes {want} per step")
for name in ("tp2dp2_z1", "tp2dp2_z3"):
    run = load(f"{d}/{name}.jsonl")
    assert (run[0]["world"]["tp"], run[0]["world"]["dp"], run[0]["config"]["zero"] > 0) == (2, 2, True), name
    print(f"{name}: within {compare(ref, run, name, 1e-5):.1e} of the single process")
from zero_expect import max_weight_diff
for name, ref_name in (("kv1_tp2", "ref_kv1"), ("kv2_tp4", "ref_kv2"), ("kv1_tp2_z1", "ref_kv1"), ("kv1_tp2_z3", "ref_kv1")):
    line = f"{name}: within {compare(load(f'{d}/{ref_name}.jsonl'), load(f'{d}/{name}.jsonl'), name, 1e-5):.1e} of the single process"
    if name == "kv1_tp2":  # the replicated kv rows reassembled into the whole checkpoint
        w = max_weight_diff(f"{d}/ref_kv1/step_00000010/model.safetensors", f"{d}/kv1_tp2/step_00000010/model.safetensors")
        assert w <= 1e-5, (name, w)
        line += f"; step-10 weights within {w:.1e}"
    print(line)
losses = lambda n: [r["loss"] for r in load(f"{d}/{n}.jsonl") if r["type"] == "step"]
assert losses("drop_a") == losses("drop_b"), "dropout under tp is not reproducible"
worst = max(abs(x - y) / x for x, y in zip(losses("drop_a"), losses("drop_ac")))
assert worst <= 1e-6, ("activation checkpointing did not replay the tp-region masks", worst)
assert losses("drop_a") != losses("tp2") and losses("drop_a")[-1] < losses("drop_a")[0]
print(f"dropout under tp 2: reproducible, recomputation within {worst:.1e}")
from zero_expect import max_weight_diff, steps
for name in ("to_tp2", "to_tp1"):
    run = load(f"{d}/{name}.jsonl")
    assert sorted(steps(run)) == list(range(6, 11)) and run[0]["resumed_from"], name
    worst = compare(ref, run, name, 1e-5, first=6)
    w = max_weight_diff(f"{d}/ref/step_00000010/model.safetensors", f"{d}/{name}/step_00000010/model.safetensors")
    assert w <= 1e-5, (name, w)
    print(f"{name}: resumed, steps 6-10 within {worst:.1e}; step-10 weights within {w:.1e}")
PY

expect_refused 2 "--tp 2 does not divide the attention heads \(--n-head\) \(3\); --tp values this model splits into: 1$" "${T[@]}" --tp 2 --n-head 3 --n-kv-head 3 --d-model 96
expect_refused 2 "does not divide|not divisible" "${T[@]}" --tp 4
expect_refused 2 "--tp 2 and the key/value heads \(--n-kv-head 3\) must divide one another" "${T[@]}" --tp 2 --n-head 6 --n-kv-head 3 --d-model 96
echo "PASS"
