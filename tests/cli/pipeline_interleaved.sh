#!/usr/bin/env bash
# tests/cli/pipeline_interleaved.sh -- the interleaved 1F1B schedule (--pp-virtual V,
# parallel/pipeline_interleaved.h) end to end against one process on the same global batch of 8
# sequences (label mpi):
#   pp 2 x V 2       m 4 (4 virtual stages of one block), and m 2 = pp (all forwards first), with
#                    full activation checkpointing, and with --pp-split 1,1,1,1 written out
#   dp 2 x pp 2 x V 2   m 2: DDP, ZeRO-1, ZeRO-2 (gradients reduce-scattered every micro-step: a
#                    chunk's units alone each time)
#   tp 2 x pp 2 x V 2   m 4; and with --sp (the boundaries carry the rank's T / tp rows); cp 2 x
#                    pp 2 x V 2 (the rank's two chunks of every sequence)
#   pp 4 x V 2       an 8-block model, m 4 and m 8 (against its own single process)
#   tiny-moe         pp 2 x V 2, and ep 2 x pp 2 at dp 4 (8 ranks: the experts' copies are two
#                    ranks, whose reduction the pipeline must hold back to the last micro-batch,
#                    1F1B and interleaved)
# Tolerance: loss and gradient norm per step and the final weights' fingerprint within a
# relative 1e-5 (tests/cli/pipeline.sh's; measured ~2e-7: only the tied wte's sum and the norm's
# sum over stages change order). Exactly: the record's virtual-stage blocks and bubble, stage 0's
# pp_live_max (interleaved_live_chunks: 2 (p - 1) + (V - 1) p + 1 chunk forwards, or m V when
# m = p), and every stage's comm_bytes per step (no tp, no ZeRO): per micro-batch an activation
# from each chunk but the last virtual stage's and a gradient from each but the first's, A =
# B T d x 4 bytes each, the tied wte's gradient V' d x 4 once, the verdict 2 x 12, DDP 2 x 4 psi.
# Evaluation (--val-data): pp 2 x V 2 and cp 2 x pp 2 against one process's validation losses
# (2 steps, evaluated after each).
# Checkpoints: the pp 2 x V 2 run's step 5 resumed in one process, and the reference's step 5
# resumed at pp 2 x V 2: steps 6-10 and the step-10 weights within 1e-5.
# kiln plan --compare on nine of the logs (one invocation): every exact row equal (the stages' blocks, model state,
# ZeRO's padded count, comm_bytes). Bad input: m not a multiple of pp, V without pp, --pp-schedule against --pp-virtual, pp x V
# above the blocks, a --pp-split of the wrong length.
# Every process computes on one thread (OMP_NUM_THREADS=1); the single-process runs go two at a time.
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
export OMP_NUM_THREADS=1
T=(train --device cpu --model tiny --steps 10 --log-every 100)
T8=(train --device cpu --model tiny --n-layer 8 --steps 10 --log-every 100)
M=(train --device cpu --model tiny-moe --steps 10 --log-every 100)

"$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 4 --save-dir "$work/ref" --save-every 5 --keep-last 0 \
  --log-json "$work/ref.jsonl" >/dev/null & bg=($!)
"$KILN_BIN" "${T8[@]}" --micro-batch 2 --grad-accum 4 --log-json "$work/ref8.jsonl" >/dev/null
wait "${bg[@]}"
mpi 2 "$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 4 --pp 2 --pp-virtual 2 --save-dir "$work/v2" --save-every 5 \
  --keep-last 0 --log-json "$work/v2.jsonl" >"$work/v2.out"
mpi 2 "$KILN_BIN" "${T[@]}" --micro-batch 4 --grad-accum 2 --pp 2 --pp-virtual 2 --log-json "$work/v2_m2.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 4 --pp 2 --pp-virtual 2 --activation-checkpointing full \
  --log-json "$work/v2_ac.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 4 --pp 2 --pp-virtual 2 --pp-schedule interleaved \
  --pp-split 1,1,1,1 --log-json "$work/v2_split.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 2 --pp 2 --pp-virtual 2 --log-json "$work/dp2v2.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 2 --pp 2 --pp-virtual 2 --zero 1 --log-json "$work/dp2v2_z1.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 2 --pp 2 --pp-virtual 2 --zero 2 --log-json "$work/dp2v2_z2.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 4 --pp 2 --pp-virtual 2 --tp 2 --log-json "$work/tp2v2.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 4 --pp 2 --pp-virtual 2 --tp 2 --sp --log-json "$work/sp2v2.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 4 --pp 2 --pp-virtual 2 --cp 2 --log-json "$work/cp2v2.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T8[@]}" --micro-batch 2 --grad-accum 4 --pp 4 --pp-virtual 2 --log-json "$work/pp4v2.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T8[@]}" --micro-batch 1 --grad-accum 8 --pp 4 --pp-virtual 2 --log-json "$work/pp4v2_m8.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${M[@]}" --micro-batch 2 --grad-accum 4 --pp 2 --pp-virtual 2 --log-json "$work/moe_v2.jsonl" >/dev/null
mpi 8 "$KILN_BIN" "${M[@]}" --micro-batch 1 --grad-accum 2 --pp 2 --ep 2 --log-json "$work/moe_ep2pp2dp4.jsonl" >/dev/null
mpi 8 "$KILN_BIN" "${M[@]}" --micro-batch 1 --grad-accum 2 --pp 2 --pp-virtual 2 --ep 2 --log-json "$work/moe_ep2v2dp4.jsonl" >/dev/null
# Checkpoints across the schedules.
"$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 4 --resume "$work/v2/step_00000005" --save-dir "$work/from_v2" \
  --log-json "$work/from_v2.jsonl" >/dev/null & bg=($!)
"$KILN_BIN" "${M[@]}" --micro-batch 2 --grad-accum 4 --log-json "$work/refmoe.jsonl" >/dev/null
wait "${bg[@]}"
mpi 2 "$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 4 --pp 2 --pp-virtual 2 --resume "$work/ref/step_00000005" \
  --save-dir "$work/to_v2" --log-json "$work/to_v2.jsonl" >/dev/null
grep -q "pipeline of 2 stages x 2 chunks (blocks 1,1,1,1 a virtual stage), interleaved 1F1B over 4 micro-batches: bubble 11.1%" \
  "$work/v2.out" || fail "no interleaved pipeline line: $(cat "$work/v2.out")"

python3 - "$work" "$(dirname "$0")" <<'PY'
import sys
d, here = sys.argv[1], sys.argv[2]
sys.path.insert(0, here)
from zero_expect import load, compare, check_resumed, units
refs = {"tiny": load(f"{d}/ref.jsonl"), "tiny8": load(f"{d}/ref8.jsonl"), "moe": load(f"{d}/refmoe.jsonl")}
runs = {  # name: (reference, dp, tp, pp, V, blocks per virtual stage)
    "v2": ("tiny", 1, 1, 2, 2, [1, 1, 1, 1]), "v2_m2": ("tiny", 1, 1, 2, 2, [1, 1, 1, 1]),
    "v2_ac": ("tiny", 1, 1, 2, 2, [1, 1, 1, 1]), "v2_split": ("tiny", 1, 1, 2, 2, [1, 1, 1, 1]),
    "dp2v2": ("tiny", 2, 1, 2, 2, [1, 1, 1, 1]), "dp2v2_z1": ("tiny", 2, 1, 2, 2, [1, 1, 1, 1]),
    "dp2v2_z2": ("tiny", 2, 1, 2, 2, [1, 1, 1, 1]), "tp2v2": ("tiny", 1, 2, 2, 2, [1, 1, 1, 1]),
    "sp2v2": ("tiny", 1, 2, 2, 2, [1, 1, 1, 1]), "cp2v2": ("tiny", 1, 1, 2, 2, [1, 1, 1, 1]),
    "pp4v2": ("tiny8", 1, 1, 4, 2, [1] * 8), "pp4v2_m8": ("tiny8", 1, 1, 4, 2, [1] * 8),
    "moe_v2": ("moe", 1, 1, 2, 2, None), "moe_ep2pp2dp4": ("moe", 4, 1, 2, 1, None),
    "moe_ep2v2dp4": ("moe", 4, 1, 2, 2, None),
}
for name, (ref, dp, tp, pp, V, blocks) in runs.items():
    run = load(f"{d}/{name}.jsonl")
    w, c, p = run[0]["world"], run[0]["config"], run[0]["pipeline"]
    assert (w["dp"], w["tp"], w["pp"]) == (dp, tp, pp), (name, w)
    assert (p["virtual"], p["schedule"]) == (V, "interleaved" if V > 1 else "1f1b"), (name, p)
    if blocks:
        assert p["blocks"] == blocks, (name, p)
    K = c["grad_accum"]
    assert abs(p["bubble"] - (pp - 1) / (K * V + pp - 1)) < 1e-12, (name, p)
    worst = compare(refs[ref], run, name, 1e-5)
    live = {r["pp_live_max"] for r in run if r["type"] == "step"}
    want_live = K * V if K == pp else min(2 * (pp - 1) + (V - 1) * pp + 1, K * V)
    if V == 1:
        want_live = min(pp, K)
    assert live == {want_live}, (name, live, want_live)
    line = f"{name}: within {worst:.1e} of the single process; stage 0 held {want_live} chunk forwards"
    if tp == 1 and c["zero"] == 0 and c["cp"] == 1 and ref != "moe":
        B, Tn, dm, Vp = c["micro_batch"], c["seq_len"], c["d_model"], c["padded_vocab_size"]
        A = B * Tn * dm * 4
        rows = run[-1]["pipeline_stages"]
        for r in rows:
            s = r["stage"]
            first, last = s == 0, s == pp - 1
            acts = V - (1 if last else 0)  # chunks sending an activation on
            grads = V - (1 if first else 0)  # chunks sending a gradient back
            n_local = (Vp * dm if first or last else 0) + (Tn * dm if first else 0) + (2 * dm if last else 0) \
                + sum(blocks[v] for v in range(s, pp * V, pp)) * units(c)[1]
            assert r["params_local"] == n_local, (name, s, r["params_local"], n_local)
            want = K * (acts + grads) * A + (Vp * dm * 4 if first or last else 0) + 2 * 12
            if dp > 1:
                want += 2 * 4 * n_local
            assert r["comm_bytes_last_step"] == want, (name, s, r["comm_bytes_last_step"], want)
        line += f"; all {pp} stages' comm_bytes exact"
    print(line)
for name in ("from_v2", "to_v2"):
    check_resumed(refs["tiny"], d, name, 6, 10, f"{d}/ref")
PY

# --- evaluation runs the forward-only order of the same groups: the validation loss of pp 2 x V 2
# (and of cp 2 x pp 2 under 1F1B, which the sequence-parallel test does not evaluate) is the
# single process's.
python3 -c "
import random; random.seed(1); w = ['the', 'cat', 'sat', 'on', 'a', 'mat', 'dog', 'ran', 'far', 'away']
open('$work/a.txt', 'w').write(' '.join(random.choice(w) for _ in range(200000)))"
"$KILN_BIN" prep --input "$work/a.txt" --out "$work/shards" --val-tokens 20000 >/dev/null
E=(train --device cpu --model tiny --steps 2 --eval-every 1 --eval-batches 3 --micro-batch 2 --grad-accum 4 --log-every 100
   --data "$work/shards/train_*.bin" --val-data "$work/shards/val_000000.bin")
"$KILN_BIN" "${E[@]}" --log-json "$work/eval1.jsonl" >/dev/null & bg=($!)
mpi 2 "$KILN_BIN" "${E[@]}" --pp 2 --pp-virtual 2 --log-json "$work/eval_v2.jsonl" >/dev/null
wait "${bg[@]}"
mpi 4 "$KILN_BIN" "${E[@]}" --pp 2 --cp 2 --log-json "$work/eval_cp2pp2.jsonl" >/dev/null
python3 - "$work" <<'PY'
import json, sys
d = sys.argv[1]
def evals(name):
    return [(r["step"], r["val_loss"]) for r in map(json.loads, open(f"{d}/{name}.jsonl")) if r["type"] == "eval"]
ref = evals("eval1")
assert [s for s, _ in ref] == [1, 2], ref
for name in ("eval_v2", "eval_cp2pp2"):
    got = evals(name)
    assert [s for s, _ in got] == [1, 2], (name, got)
    worst = max(abs(a - b) / abs(a) for (_, a), (_, b) in zip(ref, got))
    assert worst <= 1e-5, (name, ref, got)
    print(f"{name}: validation losses within {worst:.1e} of the single process's")
PY

# --- kiln plan --compare on the interleaved logs: the exact rows (parameters, FLOPs, every stage's
# blocks, model state, ZeRO's padded count, comm_bytes) equal; the peak memory printed.
names=(v2 v2_m2 dp2v2_z1 dp2v2_z2 tp2v2 sp2v2 cp2v2 pp4v2_m8 moe_v2)
"$KILN_BIN" plan $(printf -- "--compare $work/%s.jsonl " "${names[@]}") --json >"$work/cmp.json" || fail "kiln plan --compare ${names[*]}"
python3 - "$work" "$(dirname "$0")" "${names[@]}" <<'PY'
import sys
d, here, names = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.path.insert(0, here)
from zero_expect import plan_reports
for name, c in plan_reports(f"{d}/cmp.json", d, names).items():
    rows = {r["name"]: r for r in c["rows"]}
    assert c["exact_ok"], (name, [r for r in c["rows"] if r["exact"] and r["equal"] is False])
    comm = rows["comm_bytes"]
    assert comm["measured"] == comm["predicted"], (name, comm)
    print(f"plan --compare {name}: exact rows equal, comm_bytes {comm['measured']:.0f}; "
          f"peak memory {rows['peak_memory']['rel_error']:+.2%}")
PY

# --- bad input: one line each, before any rank trains.
B=(train --device cpu --model tiny --steps 1)
expect_refused 2 "a multiple of --pp 2 \(got 3; 4 works\)" "${B[@]}" --pp 2 --pp-virtual 2 --grad-accum 3
expect_refused 1 "--pp-virtual 2 needs --pp of 2 or more" "${B[@]}" --pp-virtual 2 --grad-accum 2
expect_refused 2 "give --pp-virtual 2 or more" "${B[@]}" --pp 2 --pp-schedule interleaved --grad-accum 2
expect_refused 2 "--pp-schedule 1f1b holds one chunk a rank" "${B[@]}" --pp 2 --pp-virtual 2 --pp-schedule 1f1b --grad-accum 2
expect_refused 2 "--pp 2 x --pp-virtual 4 = 8 virtual stages are more than the model's 4 blocks" "${B[@]}" --pp 2 --pp-virtual 4 --grad-accum 2
expect_refused 2 "want --pp 2 x --pp-virtual 2 = 4 virtual stages holding the model's 4 blocks" "${B[@]}" --pp 2 --pp-virtual 2 --pp-split 2,2 --grad-accum 2
echo "pipeline_interleaved: ok"
