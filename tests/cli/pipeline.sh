#!/usr/bin/env bash
# tests/cli/pipeline.sh -- pipeline parallelism (1F1B) end to end against the single process at
# the same global batch of 8 sequences (label mpi):
#   reference    1 process, micro-batch 2 x grad-accum 4
#   pp 2         2 ranks, 2 x 4 (and with full activation checkpointing, and --pp-split 1,3)
#   pp 4         4 ranks (one block per stage), 2 x 4; and 4 x 2 (fewer micro-batches than
#                stages: allowed, with a warning about the bubble)
#   pp 3         3 ranks, default split 1,2,1 (the extra block to the middle stage)
#   dp 2 x pp 2  4 ranks, 2 x 2: DDP, ZeRO-1 and ZeRO-2 over dp
#   tp 2 x pp 2  4 ranks, 2 x 4
#   dp 2 x tp 2 x pp 2   8 ranks (oversubscribed), 2 x 2: DDP, and ZeRO-1
# Checked over 10 steps: loss and gradient norm per step and the final weights' fingerprint within
# a relative 1e-5, the DDP parity tolerance (tests/cli/ddp_parity.sh). Pipelining changes no
# arithmetic inside a stage; what moves is the order of two sums -- the tied wte's gradient is
# (lookup part) + (output-layer part) added after the backward instead of accumulated inside it,
# and the squared norm is summed over stages -- measured about 2e-7. A micro-batch's gradient
# dropped or doubled, a missing tied-embedding sync or a stage skipping its update moves these by
# 1e-3 or more.
# Also exactly: comm_bytes per step of rank 0 (stage 0) -- and, without tp, every stage's last step
# and model-state bytes, from the summary's pipeline_stages -- in distributed/comm.h's unit: per micro-step
# its activation sent on (A = B T d x 4 bytes; a middle stage also sends a gradient back, the last
# stage only gradients), the tied wte's gradient exchanged once by the end stages (V'/tp d x 4,
# or its dp shard under ZeRO), the verdict's all-reduce of 3 floats over the world (2 x 12); plus
# DDP's 2 x 4 psi_local, ZeRO-1's 8 psi' and ZeRO-2's (K + 1) 4 psi', and under tp stage 0's
# all-reduces: (1 + 4 L_0) x 2A per micro-step (embedding; two per block forward and backward).
# Checkpoints: the reference's step 5 resumed at pp 2; the dp 2 x tp 2 x pp 2 ZeRO-1 run's step 5
# resumed in one process; the pp 4 run's step 5 resumed at pp 2: steps 6-10 within 1e-5 and the
# step-10 weights within 1e-5 of the reference's.
# A stage whose peer stalls: the job ends through the watchdog. Bad input: pp above the blocks,
# a --pp-split that does not fit, tp x pp not dividing the world (ZeRO-3 with pp, built since:
# tests/cli/pipeline_zero3.sh).
# Every process computes on one thread (OMP_NUM_THREADS=1).
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
export OMP_NUM_THREADS=1
T=(train --device cpu --model tiny --steps 10 --log-every 100)

"$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 4 --save-dir "$work/ref" --save-every 5 --keep-last 0 \
  --log-json "$work/ref.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 4 --pp 2 --log-json "$work/pp2.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 4 --pp 2 --activation-checkpointing full --log-json "$work/pp2_ac.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 4 --pp 2 --pp-split 1,3 --log-json "$work/pp2_split.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 4 --pp 4 --save-dir "$work/pp4" --save-every 5 --keep-last 0 \
  --log-json "$work/pp4.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --micro-batch 4 --grad-accum 2 --pp 4 --log-json "$work/pp4_m2.jsonl" >"$work/pp4_m2.out"
mpi 3 "$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 4 --pp 3 --log-json "$work/pp3.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 2 --pp 2 --log-json "$work/dp2pp2.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 2 --pp 2 --zero 1 --log-json "$work/dp2pp2_z1.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 2 --pp 2 --zero 2 --log-json "$work/dp2pp2_z2.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 4 --pp 2 --tp 2 --log-json "$work/tp2pp2.jsonl" >/dev/null
mpi 8 "$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 2 --pp 2 --tp 2 --log-json "$work/3d.jsonl" >/dev/null
mpi 8 "$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 2 --pp 2 --tp 2 --zero 1 --save-dir "$work/3d_z1" --save-every 5 \
  --keep-last 0 --log-json "$work/3d_z1.jsonl" >/dev/null
grep -q "warning: --grad-accum 2 is below --pp 4" "$work/pp4_m2.out" || fail "no bubble warning: $(cat "$work/pp4_m2.out")"
# Checkpoints across pp sizes: the reference's step 5 at pp 2, the 8-rank ZeRO-1 run's in one
# process, the pp 4 run's at pp 2.
mpi 2 "$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 4 --pp 2 --resume "$work/ref/step_00000005" \
  --save-dir "$work/to_pp2" --log-json "$work/to_pp2.jsonl" >/dev/null
"$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 4 --resume "$work/3d_z1/step_00000005" --save-dir "$work/to_pp1" \
  --log-json "$work/to_pp1.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 4 --pp 2 --resume "$work/pp4/step_00000005" --save-dir "$work/pp4_to_pp2" \
  --log-json "$work/pp4_to_pp2.jsonl" >/dev/null

python3 - "$work" "$(dirname "$0")" <<'PY'
import sys
d, here = sys.argv[1], sys.argv[2]
sys.path.insert(0, here)
from zero_expect import load, compare, max_weight_diff, steps, units, padded
ref = load(f"{d}/ref.jsonl")
runs = {  # name: (dp, tp, pp, blocks per stage)
    "pp2": (1, 1, 2, [2, 2]), "pp2_ac": (1, 1, 2, [2, 2]), "pp2_split": (1, 1, 2, [1, 3]),
    "pp4": (1, 1, 4, [1, 1, 1, 1]), "pp4_m2": (1, 1, 4, [1, 1, 1, 1]), "pp3": (1, 1, 3, [1, 2, 1]),
    "dp2pp2": (2, 1, 2, [2, 2]), "dp2pp2_z1": (2, 1, 2, [2, 2]), "dp2pp2_z2": (2, 1, 2, [2, 2]),
    "tp2pp2": (1, 2, 2, [2, 2]), "3d": (2, 2, 2, [2, 2]), "3d_z1": (2, 2, 2, [2, 2]),
}
for name, (dp, tp, pp, blocks) in runs.items():
    run = load(f"{d}/{name}.jsonl")
    w, c = run[0]["world"], run[0]["config"]
    assert (w["dp"], w["tp"], w["pp"]) == (dp, tp, pp), (name, w)
    assert run[0]["pipeline"]["blocks"] == blocks, (name, run[0]["pipeline"])
    worst = compare(ref, run, name, 1e-5)
    B, Tn, dm, Vp, K = c["micro_batch"], c["seq_len"], c["d_model"], c["padded_vocab_size"], c["grad_accum"]
    A = B * Tn * dm * 4
    wte = Vp // tp * dm * 4
    want = K * A + 2 * 12
    if c["zero"] == 0:
        want += wte
        if dp > 1:
            want += 2 * 4 * run[0]["params_local"]
    else:
        # Stage 0's ZeRO units: wte alone, wpe, its blocks; each padded to dp x 64 elements.
        h = dm // c["n_head"]
        rows = (c["n_head"] // tp + 2 * max(c["n_kv_head"] // tp, 1)) * h  # this tp rank's c_attn rows
        block = 4 * dm + dm * rows + rows + dm * (dm // tp) + dm + 2 * dm * (4 * dm // tp) + 4 * dm // tp + dm
        assert tp > 1 or block == units(c)[1]
        P = padded(Vp // tp * dm, dp) + padded(Tn * dm, dp) + blocks[0] * padded(block, dp)
        assert run[0]["zero"]["padded_params"] == P, (name, run[0]["zero"], P)
        want += padded(Vp // tp * dm, dp) * 4 // dp
        want += 8 * P if c["zero"] == 1 else (K + 1) * 4 * P
    if tp > 1:
        want += K * (1 + 4 * blocks[0]) * 2 * A
    got = {r["comm_bytes"] for r in run if r["type"] == "step"}
    assert got == {want}, (name, got, want)
    if tp == 1:  # every stage's last step and model state, from the summary (tp traffic: stage 0 only above)
        rows = run[-1]["pipeline_stages"]
        assert [r["stage"] for r in rows] == list(range(pp)), (name, rows)
        for r in rows:
            st = r["stage"]
            first, last = st == 0, st == pp - 1
            outer = ([Vp * dm] if first or last else []) , (Tn * dm if first else 0) + (2 * dm if last else 0)
            n_local = sum(outer[0]) + outer[1] + blocks[st] * units(c)[1]
            assert r["params_local"] == n_local, (name, st, r["params_local"], n_local)
            want_s = (2 * K * A if not (first or last) else K * A) + 2 * 12
            if c["zero"] == 0:
                want_s += wte if first or last else 0
                if dp > 1:
                    want_s += 2 * 4 * n_local
                assert r["model_state"]["device"] == {"params": 4 * n_local, "grads": 4 * n_local, "optimizer": 8 * n_local, "cast_copies": 0}, (name, st, r)
            else:
                P_s = sum(padded(u, dp) for u in outer[0]) + (padded(outer[1], dp) if outer[1] else 0) + blocks[st] * padded(units(c)[1], dp)
                want_s += padded(Vp * dm, dp) * 4 // dp if first or last else 0
                want_s += 8 * P_s if c["zero"] == 1 else (K + 1) * 4 * P_s
            assert r["comm_bytes_last_step"] == want_s, (name, st, r["comm_bytes_last_step"], want_s)
    live = {r["pp_live_max"] for r in run if r["type"] == "step"}
    assert live == {min(pp, K)}, (name, live, "stage 0 must hold at most min(pp, m) micro-batches (1F1B)")
    print(f"{name}: within {worst:.1e} of the single process; comm_bytes {want} per step"
          + (f"; all {pp} stages' last-step comm_bytes and model state exact" if tp == 1 else ""))
for name in ("to_pp2", "to_pp1", "pp4_to_pp2"):
    run = load(f"{d}/{name}.jsonl")
    assert sorted(steps(run)) == list(range(6, 11)) and run[0]["resumed_from"], name
    worst = compare(ref, run, name, 1e-5, first=6)
    wd = max_weight_diff(f"{d}/ref/step_00000010/model.safetensors", f"{d}/{name}/step_00000010/model.safetensors")
    assert wd <= 1e-5, (name, wd)
    print(f"{name}: resumed, steps 6-10 within {worst:.1e}; step-10 weights within {wd:.1e}")
PY

# --- a stage whose peer stalls: the watchdog ends the job.
"$MPIEXEC" --allow-run-as-root -np 2 "$KILN_BIN" train --device cpu --model tiny --steps 1000000 --log-every 1000 \
  --grad-accum 4 --pp 2 --comm-timeout 3 --log-json "$work/stall.jsonl" >/dev/null 2>"$work/stall.err" &
job=$!
for _ in $(seq 600); do
  [ -f "$work/stall.jsonl" ] && [ "$(grep -c '"type":"step"' "$work/stall.jsonl")" -ge 3 ] && break
  kill -0 "$job" 2>/dev/null || fail "stall: the job ended before it trained: $(cat "$work/stall.err")"
  sleep 0.1
done
victim=$(pgrep -P "$job" -f "$KILN_BIN" | tail -n 1)  # the last stage
[ -n "$victim" ] || fail "stall: no rank process under mpirun $job"
kill -STOP "$victim"
start=$SECONDS
while kill -0 "$job" 2>/dev/null && [ $(( SECONDS - start )) -lt 30 ]; do sleep 0.1; done
if kill -0 "$job" 2>/dev/null; then
  kill -KILL "$victim" 2>/dev/null; pkill -KILL -P "$job" 2>/dev/null; kill -KILL "$job" 2>/dev/null
  fail "stall: the job still runs 30 s after a stage stopped"
fi
kill -KILL "$victim" 2>/dev/null || true
code=0; wait "$job" || code=$?
[ "$code" -ne 0 ] || fail "stall: the job exited 0"
grep -q "did not complete within 3 s (--comm-timeout)" "$work/stall.err" || fail "stall: no watchdog message: $(cat "$work/stall.err")"
echo "stalled stage: job ended in $(( SECONDS - start ))s, exit $code: $(grep 'kiln: error' "$work/stall.err" | head -n 1)"

expect_refused 2 "--pp 8 is larger than the model's 4 blocks" "${T[@]}" --pp 8
expect_refused 2 "--pp-split '1,2' gives 2 stage\(s\) holding 3 block\(s\)" "${T[@]}" --pp 2 --pp-split 1,2
expect_refused 2 "--pp-split '2,x'" "${T[@]}" --pp 2 --pp-split 2,x
expect_refused 2 "layout does not divide the world" "${T[@]}" --pp 2 --tp 2
echo "PASS"
