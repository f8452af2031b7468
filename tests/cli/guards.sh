#!/usr/bin/env bash
# tests/cli/guards.sh -- a run that guards its own health (issue 37; label mpi), with faults injected
# through the test-only KILN_TEST_NAN_GRAD=RANK:STEP[:COUNT] (runtime/trainer/nonfinite_guard.h: a
# NaN in one rank's gradient of its first MLP weight, before any reduction). bf16, 2 ranks:
#   - one NaN on rank 1 at step 3, --on-nonfinite skip, under DDP, ZeRO-2 and pp 2: step 3 is
#     skipped on every rank alike (the log's `skipped`, the summary's updates), and the weights
#     and optimizer state after it equal those before, bit for bit (the step-2 and step-3
#     checkpoints); training goes on.
#   - a NaN from step 3 on, --max-skipped-steps 3: the job ends at step 5 with exit 4 and one line
#     naming the step, the count, the rank the NaN came from and its parameter (traced before the
#     reductions), and saves nothing at the end (latest stays the step-4 periodic save).
#   - a diverged run (--lr 1e38, --on-nonfinite stop): the line names the ranks whose own loss was
#     not finite first.
#   - one bit flipped in one replica's weights (test-only KILN_TEST_FLIP_BIT): --check-replicas finds
#     it at the next check (in the first tensor), or before a save (in the last), and ends the job
#     (exit 4) naming the tensor and the rank outside the majority (dp 4), nothing saved; agreeing
#     replicas pass under DDP, ZeRO-2, 16-bit weights and ep; a check step's read is not deferred
#     behind the next step's work.
#   - a loss spike (test-only KILN_TEST_GARBAGE_SAMPLES: stream positions turned to random tokens):
#     --spike-rollback reloads the last checkpoint before it in place, skips the data since, and
#     the run equals, bit for bit, the one that never had that data (KILN_TEST_SKIP_SAMPLES); a
#     resume skips it too; without a checkpoint before the spike, exit 4 and one line.
#   - a slow rank (test-only KILN_TEST_SLOW_RANK=RANK:xF: its step F times its own compute longer, a
#     sleep before its forward, so it stays slow by that factor however loaded the machine is):
#     the step records' slowest_rank names it (all but at most one step: a loaded machine can
#     stall the other rank that much once), and the summary's stragglers
#     (runtime/observe/stragglers.h) -- under DDP, and under tp 2 and ZeRO-3, whose collectives
#     inside forward and backward make the fast rank wait there (its waits are taken off its
#     compute, distributed/wait_clock.h); an even run names nobody.
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
B=(train --device cpu --model tiny --log-every 100 --micro-batch 2 --grad-accum 2 --precision bf16)

# --- one NaN, skipped everywhere, weights unchanged
for layout in "ddp:" "zero2:--zero 2" "pp2:--pp 2"; do
  name=${layout%%:*}
  read -r -a extra <<<"${layout#*:}"
  KILN_TEST_NAN_GRAD=1:3 mpi 2 -x KILN_TEST_NAN_GRAD "$KILN_BIN" "${B[@]}" "${extra[@]}" --steps 5 --on-nonfinite skip \
    --save-dir "$work/$name" --save-every 1 --keep-last 0 --log-json "$work/$name.jsonl" >/dev/null ||
    fail "$name: the run with one NaN did not finish"
  python3 - "$work" "$name" "$(dirname "$0")" <<'PY' || fail "$name: the skipped step"
import json, sys
sys.path.insert(0, sys.argv[3])
from zero_expect import safetensors
work, name = sys.argv[1], sys.argv[2]
records = [json.loads(l) for l in open(f"{work}/{name}.jsonl")]
steps = {r["step"]: r for r in records if r["type"] == "step"}
assert [steps[s]["skipped"] for s in range(1, 6)] == [False, False, True, False, False], [steps[s]["skipped"] for s in steps]
summary = [r for r in records if r["type"] == "summary"][-1]
assert summary["updates"] == 4 and summary["skipped_steps"] == 1, summary
for f in ("model", "optimizer"):
    a = safetensors(f"{work}/{name}/step_00000002/{f}.safetensors")
    b = safetensors(f"{work}/{name}/step_00000003/{f}.safetensors")
    c = safetensors(f"{work}/{name}/step_00000004/{f}.safetensors")
    assert sorted(a) == sorted(b), (f, sorted(a), sorted(b))
    assert all(a[k].tobytes() == b[k].tobytes() for k in a), f"{name}: {f} changed in the skipped step"
    assert any(a[k].tobytes() != c[k].tobytes() for k in a), f"{name}: {f} did not change after it"
print(f"{name}: step 3 skipped on every rank, model and optimizer state unchanged by it, training went on")
PY
done

# --- a NaN every step from step 3: three skipped in a row end the job, naming where it came from
code=0
KILN_TEST_NAN_GRAD=1:3:100 mpi 2 -x KILN_TEST_NAN_GRAD "$KILN_BIN" "${B[@]}" --steps 10 --on-nonfinite skip --max-skipped-steps 3 \
  --save-dir "$work/fatal" --save-every 4 >/dev/null 2>"$work/fatal.err" || code=$?
[ "$code" -eq 4 ] || fail "three NaN steps in a row: exit $code (want 4): $(cat "$work/fatal.err")"
[ "$(grep -c '^kiln: error:' "$work/fatal.err")" -eq 1 ] || fail "want one kiln line: $(cat "$work/fatal.err")"
line=$(grep '^kiln: error:' "$work/fatal.err")
for want in "kiln: error: step 5: " "3 step(s) in a row skipped (--max-skipped-steps 3): stopping without saving" \
  "every rank's local loss was finite" "traced at step 5: non-finite gradients before the reductions on rank 1, first in h.0.mlp.c_fc.weight"; do
  [[ "$line" == *"$want"* ]] || fail "the line lacks '$want': $line"
done
[ "$(cat "$work/fatal/latest")" = "step_00000004" ] || fail "latest is $(cat "$work/fatal/latest"), want the step-4 save"
[ "$(ls -d "$work/fatal"/step_* | wc -l)" -eq 1 ] || fail "saved more than step 4: $(ls "$work/fatal")"
echo "three in a row: exit 4, $line"

# --- a diverged run: every rank's own loss not finite
code=0
mpi 2 "$KILN_BIN" "${B[@]}" --steps 5 --lr 1e38 --warmup 0 --grad-clip 0 >/dev/null 2>"$work/diverged.err" || code=$?
[ "$code" -eq 4 ] || fail "diverged: exit $code (want 4): $(cat "$work/diverged.err")"
grep -q "^kiln: error: step 2: .*not finite; stopping with the update skipped.*the local loss was not finite first at step 2 on ranks 0, 1" \
  "$work/diverged.err" || fail "diverged: $(cat "$work/diverged.err")"
echo "diverged: $(grep '^kiln: error' "$work/diverged.err")"
# --- one bit flipped in one replica's weights (test-only KILN_TEST_FLIP_BIT=RANK:STEP, after step STEP)
# dp 4: the majority names rank 2 alone; found at the next check (step 4 of --check-replicas 2),
# before the step-6 save; and before a save that comes first (step 3), nothing written.
code=0
KILN_TEST_FLIP_BIT=2:3 mpi 4 -x KILN_TEST_FLIP_BIT "$KILN_BIN" train --device cpu --model tiny --log-every 100 --micro-batch 1 \
  --steps 8 --check-replicas 2 --save-dir "$work/flip" --save-every 6 >/dev/null 2>"$work/flip.err" || code=$?
[ "$code" -eq 4 ] || fail "a flipped bit: exit $code (want 4): $(cat "$work/flip.err")"
[ "$(grep -c '^kiln: error:' "$work/flip.err")" -eq 1 ] || fail "want one kiln line: $(cat "$work/flip.err")"
grep -q "^kiln: error: step 4: the replicas' weights disagree (--check-replicas): wte differs on rank(s) 2 among its replicas (ranks 0, 1, 2, 3)" \
  "$work/flip.err" || fail "the line: $(cat "$work/flip.err")"
[ ! -e "$work/flip/latest" ] || fail "a checkpoint was written: $(ls "$work/flip")"
echo "flipped bit: $(grep '^kiln: error' "$work/flip.err")"
code=0
KILN_TEST_FLIP_BIT=1:3:last mpi 2 -x KILN_TEST_FLIP_BIT "$KILN_BIN" "${B[@]}" --steps 8 --check-replicas 100 --save-dir "$work/flip2" \
  --save-every 3 >/dev/null 2>"$work/flip2.err" || code=$?
[ "$code" -eq 4 ] && grep -q "step 3: the replicas' weights disagree.*ln_f.bias differs on rank(s) 0, 1 among its replicas (ranks 0, 1)" "$work/flip2.err" ||
  fail "a flip in the last tensor before a save: exit $code, $(cat "$work/flip2.err")"
[ ! -e "$work/flip2/latest" ] || fail "the save went ahead: $(ls "$work/flip2")"
# ... and agreeing replicas pass the check every step: DDP, ZeRO-2, 16-bit weights under ZeRO-1, tiny-moe with ep 2 at dp 4;
# every second step under DDP, whose check steps are read before the next step is queued (the others deferred)
mpi 2 "$KILN_BIN" "${B[@]}" --steps 5 --check-replicas 2 --log-json "$work/check2.jsonl" >/dev/null 2>"$work/ok.err" ||
  fail "--check-replicas 2: $(cat "$work/ok.err")"
python3 - "$work/check2.jsonl" <<'PY' || fail "a check step's read was deferred"
import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if r["type"] == "step"]
assert [(r["step"], r["read_deferred"]) for r in steps] == [(1, False), (2, False), (3, True), (4, False), (5, False)], \
    [(r["step"], r["read_deferred"]) for r in steps]
PY
for extra in "--zero 2" "--zero 1 --param-dtype bf16"; do
  read -r -a e <<<"$extra"
  mpi 2 "$KILN_BIN" "${B[@]}" "${e[@]}" --steps 4 --check-replicas 1 >/dev/null 2>"$work/ok.err" || fail "--check-replicas 1 $extra: $(cat "$work/ok.err")"
done
mpi 4 "$KILN_BIN" train --device cpu --model tiny-moe --ep 2 --micro-batch 1 --steps 3 --check-replicas 1 >/dev/null 2>"$work/ok.err" ||
  fail "--check-replicas with ep 2: $(cat "$work/ok.err")"
echo "replicas that agree pass: DDP, ZeRO-2, ZeRO-1 + bf16 weights, ep 2; check steps read at once"

# --- a loss spike (test-only KILN_TEST_GARBAGE_SAMPLES=160:168: the stream positions steps 41-42 read,
# at a global batch of 4, turned into random tokens): --spike-rollback 3 --spike-patience 2 reloads the
# step-40 checkpoint in place, skips those positions and goes on; the run is then the one that never
# had them (KILN_TEST_SKIP_SAMPLES=160:168) bit for bit -- the same data, state and arithmetic on the
# CPU -- and a resume from a later checkpoint skips them too. With --async-save (the rollback waits
# for the save in flight).
S=(train --device cpu --model tiny --steps 60 --micro-batch 2 --log-every 100)
KILN_TEST_GARBAGE_SAMPLES=160:168 mpi 2 -x KILN_TEST_GARBAGE_SAMPLES "$KILN_BIN" "${S[@]}" --save-dir "$work/spike" \
  --save-every 5 --keep-last 0 --async-save --spike-rollback 3 --spike-patience 2 --log-json "$work/spike.jsonl" \
  >"$work/spike.out" || fail "the spiking run: $(tail -3 "$work/spike.out")"
grep -q "^kiln: rollback after step 42: loss .* at steps 41-42, above .*reloaded $work/spike/step_00000040, skipping the data of steps 41-42 (stream positions 160-167); going on from step 41" \
  "$work/spike.out" || fail "no rollback line: $(grep -i rollback "$work/spike.out")"
KILN_TEST_SKIP_SAMPLES=160:168 mpi 2 -x KILN_TEST_SKIP_SAMPLES "$KILN_BIN" "${S[@]}" --log-json "$work/never.jsonl" >/dev/null
rm -rf "$work/spike/step_00000060"; echo step_00000050 >"$work/spike/latest"
mpi 2 "$KILN_BIN" "${S[@]}" --save-dir "$work/spike" --log-json "$work/spike_resumed.jsonl" >/dev/null || fail "resuming after a rollback"
python3 - "$work" <<'PY' || fail "spike rollback"
import json, sys
d = sys.argv[1]
def load(name):
    return [json.loads(l) for l in open(f"{d}/{name}.jsonl")]
spike, never, resumed = load("spike"), load("never"), load("spike_resumed")
(rb,) = [r for r in spike if r["type"] == "rollback"]
assert rb["spike_steps"] == [41, 42] and rb["to_step"] == 40 and rb["skipped_samples"] == [[160, 168]], rb
after = {r["step"]: r for r in spike[spike.index(rb):] if r["type"] == "step"}
ref = {r["step"]: r for r in never if r["type"] == "step"}
assert sorted(after) == list(range(41, 61)), sorted(after)
assert all((after[s]["loss"], after[s]["grad_norm"]) == (ref[s]["loss"], ref[s]["grad_norm"]) for s in after)
assert (spike[-1]["param_sum"], spike[-1]["param_sq"]) == (never[-1]["param_sum"], never[-1]["param_sq"])
state = json.load(open(f"{d}/spike/step_00000050/trainer_state.json"))
assert state["skipped_samples"] == [[160, 168]] and state["rollbacks"] == 1, state
summary = spike[-1]
assert summary["type"] == "summary" and summary["rollbacks"] == 1 and summary["skipped_samples"] == 8, summary
res = {r["step"]: r for r in resumed if r["type"] == "step"}
assert sorted(res) == list(range(51, 61)) and all(res[s]["loss"] == ref[s]["loss"] for s in res)
assert (resumed[-1]["param_sum"], resumed[-1]["param_sq"]) == (never[-1]["param_sum"], never[-1]["param_sq"])
print(f"spike at steps 41-42 (loss {', '.join(str(round(l, 2)) for l in [spike[i]['loss'] for i in range(len(spike)) if spike[i]['type'] == 'step' and spike[i]['step'] in (41, 42)][:2])}): "
      "rolled back to step 40, steps 41-60 equal the run that never had the window bit for bit; a resume from step 50 skips it too")
PY
code=0
KILN_TEST_GARBAGE_SAMPLES=160:168 mpi 2 -x KILN_TEST_GARBAGE_SAMPLES "$KILN_BIN" "${S[@]}" --save-dir "$work/nockpt" \
  --save-every 100 --spike-rollback 3 >/dev/null 2>"$work/nockpt.err" || code=$?
[ "$code" -eq 4 ] && grep -q "^kiln: error: step 42: a loss spike (.*) and no checkpoint from before step 41 in $work/nockpt to roll back to" \
  "$work/nockpt.err" || fail "a spike without a checkpoint before it: exit $code, $(cat "$work/nockpt.err")"
grep -q "1 spike rollback(s); 8 sample position(s) of the stream skipped" "$work/spike.out" || fail "the summary does not say the rollback: $(tail -4 "$work/spike.out")"
# ... and a loss that keeps spiking (garbage from stream position 160 on: every rollback meets more)
# ends the run after --max-rollbacks, instead of rolling back for ever
code=0
KILN_TEST_GARBAGE_SAMPLES=160:100000 mpi 2 -x KILN_TEST_GARBAGE_SAMPLES "$KILN_BIN" "${S[@]}" --save-dir "$work/spiky" \
  --save-every 5 --spike-rollback 3 --max-rollbacks 2 >"$work/spiky.out" 2>"$work/spiky.err" || code=$?
[ "$code" -eq 4 ] && grep -q "^kiln: error: step [0-9]*: a loss spike (.*) after 2 rollback(s) already (--max-rollbacks 2): the loss keeps spiking" \
  "$work/spiky.err" || fail "a loss that keeps spiking: exit $code, $(cat "$work/spiky.err")"
[ "$(grep -c '^kiln: rollback after' "$work/spiky.out")" -eq 2 ] || fail "want 2 rollbacks: $(grep rollback "$work/spiky.out")"

# --- a slow rank (test-only KILN_TEST_SLOW_RANK=1:x2: rank 1's step longer by twice its own compute,
# a sleep before its forward, from step 2), under DDP (the fast rank waits in the reductions after
# backward), tp 2 and ZeRO-3 (it waits inside forward and backward: tp's all-reduces, ZeRO-3's gathers)
for layout in "ddp:" "tp2:--tp 2" "zero3:--zero 3"; do
  name=${layout%%:*}
  read -r -a extra <<<"${layout#*:}"
  KILN_TEST_SLOW_RANK=1:x2 mpi 2 -x KILN_TEST_SLOW_RANK "$KILN_BIN" "${B[@]}" "${extra[@]}" --steps 6 --log-json "$work/slow_$name.jsonl" \
    >"$work/slow_$name.out" || fail "the slowed run ($name) failed"
  grep -q "^kiln: straggler: rank 1 (pipeline stage 0) computed" "$work/slow_$name.out" || fail "$name: no straggler line: $(cat "$work/slow_$name.out")"
done
mpi 2 "$KILN_BIN" "${B[@]}" --steps 6 --log-json "$work/even.jsonl" >/dev/null || fail "the even run failed"
python3 - "$work" <<'PY' || fail "stragglers"
import json, sys
work = sys.argv[1]
def load(name):
    return [json.loads(l) for l in open(f"{work}/{name}.jsonl")]
for name in ("ddp", "tp2", "zero3"):
    slow = load(f"slow_{name}")
    steps = [r for r in slow if r["type"] == "step" and r["step"] >= 2]  # step 1 is not slowed
    # Rank 1 is slowed 3x; another job on a shared 2-core machine can still stall rank 0 that much
    # for a step, so one step of the five may name it (naming the wrong rank, or always rank 0,
    # fails every step).
    named = sum(r["slowest_rank"] == 1 for r in steps)
    assert named >= len(steps) - 1, (name, [(r["slowest_rank"], r["slowest_compute_ms"], r["compute_wait_ms"]) for r in steps])
    # rank 0's own compute (its forward and backward less its waits) is in the max
    assert all(r["slowest_compute_ms"] >= r["forward_ms"] + r["backward_ms"] - r["compute_wait_ms"] for r in steps), name
    if name != "ddp":  # rank 0 stood still inside its forward and backward, waiting for rank 1
        assert all(r["compute_wait_ms"] > 0 for r in steps), (name, [r["compute_wait_ms"] for r in steps])
    (s,) = slow[-1]["stragglers"]
    assert s["rank"] == 1 and s["stage"] == 0 and s["median_compute_ms"] > 1.2 * s["stage_median_compute_ms"], (name, s)
    print(f"slow rank, {name}: slowest_rank 1 in {named} of {len(steps)} steps; the summary names it ({s['median_compute_ms']:.0f} ms against the stage's "
          f"{s['stage_median_compute_ms']:.0f})")
even = load("even")
assert even[-1]["type"] == "summary" and even[-1]["stragglers"] == [], even[-1]["stragglers"]
print("none in the even run")
PY
echo "PASS"
