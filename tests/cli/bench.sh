#!/usr/bin/env bash
# tests/cli/bench.sh -- `kiln bench` on the tiny model on the CPU (labels cli, mpi): the table and
# the JSON report, figures consistent with each other (tokens/s from the step times, the phase
# split adding up to the step, MFU = TFLOP/s / peak), the sweep's choice, a 2-rank ZeRO run, and bad
# input. Energy is null here (no GPU); the speed figures of a CPU run mean nothing and are not
# judged.
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
B=(bench --device cpu --model tiny --warmup 1 --measure 3 --micro-batch 2)

"$KILN_BIN" "${B[@]}" --peak-tflops 2 --json "$work/one.json" >"$work/one.out"
grep -q "tokens/s" "$work/one.out" || fail "no table"
python3 - "$work/one.json" <<'PY'
import json, sys
rep = json.load(open(sys.argv[1]))
assert rep["type"] == "bench" and rep["measure"] == 3 and len(rep["runs"]) == 1, rep
r = rep["runs"][0]
assert r["measured_steps"] == 3 and r["fits"], r
tokens_per_step = 2 * 128  # micro-batch 2 x seq 128
assert abs(r["tokens_per_s"] - tokens_per_step / (r["step_ms"] / 1e3)) <= 1e-6 * r["tokens_per_s"], r
assert abs(r["mfu"] - r["tflops"] / 2) <= 1e-12, r
split = r["forward_ms"] + r["backward_ms"] + r["exposed_comm_ms"] + r["optimizer_ms"]
assert r["forward_ms"] > 0 and r["backward_ms"] > 0 and r["optimizer_ms"] > 0, r
# The phases and the step's time run between the same points (runtime/observe/phase_timer.h: a step's
# interval ends at its one host synchronisation): on the CPU they add up to it, to rounding.
assert abs(split - r["step_ms"]) <= 1e-9 * r["step_ms"], (split, r["step_ms"])
assert r["watts"] is None and r["joules_per_token"] is None and r["tflops_per_watt"] is None, r
ms = r["model_state"]["device"]
assert ms["params"] == 4 * r["params"] and ms["optimizer"] == 8 * r["params"], ms
print("one run:", {k: r[k] for k in ("tokens_per_s", "step_ms", "forward_ms", "backward_ms", "optimizer_ms")})
PY

"$KILN_BIN" "${B[@]}" --measure 2 --sweep --max-micro-batch 2 --json "$work/sweep.json" >"$work/sweep.out"
grep -q "^best: micro-batch" "$work/sweep.out" || fail "the sweep names no best configuration"
python3 - "$work/sweep.json" <<'PY'
import json, sys
rep = json.load(open(sys.argv[1]))
runs = rep["runs"]
assert [(r["activation_checkpointing"], r["micro_batch"]) for r in runs] == \
    [(a, m) for a in ("none", "selective", "full") for m in (1, 2)], runs
assert rep["best"]["tokens_per_s"] == max(r["tokens_per_s"] for r in runs), rep["best"]
print("sweep: best", rep["best"]["activation_checkpointing"], rep["best"]["micro_batch"])
PY

timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np 2 "$KILN_BIN" "${B[@]}" --zero 1 --json "$work/zero.json" >/dev/null
python3 - "$work/zero.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["runs"][0]
assert r["world"]["dp"] == 2 and r["zero"] == 1, r
assert r["model_state"]["device"]["optimizer"] == 8 * r["params"] // 2, r["model_state"]
print("2 ranks, ZeRO-1:", r["tokens_per_s"], "tokens/s")
PY

code=0; "$KILN_BIN" bench --measure 0 2>"$work/err" || code=$?
[ "$code" -eq 2 ] && [ "$(wc -l <"$work/err")" -eq 1 ] && grep -q "measure must be at least 1" "$work/err" || { cat "$work/err"; fail "bad --measure"; }
code=0; timeout 120 "$MPIEXEC" --allow-run-as-root --oversubscribe -np 2 "$KILN_BIN" "${B[@]}" --sweep 2>"$work/err" >/dev/null || code=$?
[ "$code" -ne 0 ] && grep -q "sweep runs in a world of one" "$work/err" || { cat "$work/err"; fail "--sweep under 2 ranks"; }
echo "PASS"
