#!/usr/bin/env bash
# tests/cli/profile.sh -- `--profile FILE` (runtime/observe/profiler.h) on the CPU (labels cli, mpi): the
# window of steps, the Chrome trace, the top-costs table and the `profile` record; kiln bench's
# measured steps; a second rank's own trace; bad input. On a GPU the table is of kernels (the
# kit's quick visit profiles gpt2-124m); here of host operators.
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
T=(train --device cpu --model tiny --micro-batch 2 --steps 6 --log-every 6)

"$KILN_BIN" "${T[@]}" --profile "$work/t.json" --profile-steps 2 --log-json "$work/t.jsonl" >"$work/t.out"
grep -q "profiled steps 3-4 into $work/t.json" "$work/t.out" || { cat "$work/t.out"; fail "no profile line for steps 3-4"; }
grep -q "aten::" "$work/t.out" || fail "the table names no operator"
python3 - "$work" <<'PY'
import json, sys
d = sys.argv[1]
trace = json.load(open(f"{d}/t.json"))
names = {e.get("name", "") for e in trace["traceEvents"]}
assert any(n.startswith("aten::mm") or n.startswith("aten::addmm") for n in names), sorted(names)[:20]
recs = [json.loads(l) for l in open(f"{d}/t.jsonl")]
prof = [r for r in recs if r["type"] == "profile"]
assert len(prof) == 1, prof
p = prof[0]
assert (p["first_step"], p["last_step"]) == (3, 4) and p["trace"] == f"{d}/t.json", p
assert p["device"] is False and p["busy"] is None and p["wall_ms"] > 0 and p["events"] > 0, p
assert 0 < len(p["top"]) <= 15 and all(a["ms"] >= b["ms"] for a, b in zip(p["top"], p["top"][1:])), p["top"]
assert abs(sum(t["ms"] for t in p["top"]) - p["total_ms"]) <= p["total_ms"] + 1e-9
# Profiling changes nothing of the training: the steps are all there, in order.
assert [r["step"] for r in recs if r["type"] == "step"] == list(range(1, 7)), [r["step"] for r in recs if r["type"] == "step"]
print("train: steps 3-4 profiled,", p["events"], "events, top", p["top"][0]["name"])
PY

# The same run without the profiler: the same losses (the profiler observes, it does not change).
"$KILN_BIN" "${T[@]}" --log-json "$work/plain.jsonl" >/dev/null
python3 - "$work" <<'PY'
import json, sys
d = sys.argv[1]
last = lambda n: [json.loads(l) for l in open(f"{d}/{n}.jsonl")][-1]
assert last("t")["param_sq"] == last("plain")["param_sq"], (last("t")["param_sq"], last("plain")["param_sq"])
print("profiled and plain runs end with the same weights")
PY

# A window past the last step ends with the run.
"$KILN_BIN" "${T[@]}" --profile "$work/end.json" --profile-start 5 --profile-steps 10 >"$work/end.out"
grep -q "profiled steps 5-6" "$work/end.out" || { cat "$work/end.out"; fail "the window is not cut at the run's end"; }

# kiln bench: the measured steps.
"$KILN_BIN" bench --device cpu --model tiny --micro-batch 2 --warmup 1 --measure 3 --profile "$work/b.json" >"$work/b.out"
grep -q "profiled steps 2-4 into $work/b.json" "$work/b.out" || { cat "$work/b.out"; fail "bench did not profile its measured steps"; }
[ -s "$work/b.json" ] || fail "no bench trace"

# Two ranks: each writes its own trace; rank 0 prints.
timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np 2 "$KILN_BIN" "${T[@]}" --backend mpi \
  --profile "$work/m.json" --profile-steps 1 >"$work/m.out"
[ -s "$work/m.json" ] && [ -s "$work/m.json.rank1" ] || fail "two ranks: want m.json and m.json.rank1"
[ "$(grep -c 'profiled steps' "$work/m.out")" -eq 1 ] || fail "two ranks: want one table (rank 0's)"

# Bad input: one line, exit 2.
refused() {
  local regex=$1; shift
  local code=0
  "$KILN_BIN" "$@" >/dev/null 2>"$work/err" || code=$?
  [ "$code" -eq 2 ] && [ "$(wc -l <"$work/err")" -eq 1 ] && grep -Eq "kiln: error: .*$regex" "$work/err" \
    || { cat "$work/err"; fail "$* (want exit 2 and one line matching '$regex', got exit $code)"; }
  echo "refused: $(cat "$work/err")"
}
refused "cannot open for writing" "${T[@]}" --profile "$work/no/such/dir/t.json"
refused "--profile-start 9 is outside this run's steps 1-6" "${T[@]}" --profile "$work/x.json" --profile-start 9
refused "--profile-steps must be" "${T[@]}" --profile "$work/x.json" --profile-steps 0
refused "not a --sweep" bench --device cpu --model tiny --sweep --profile "$work/x.json"
echo "PASS"
