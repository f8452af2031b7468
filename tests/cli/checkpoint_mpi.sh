#!/usr/bin/env bash
# tests/cli/checkpoint_mpi.sh -- checkpoints under mpirun (label mpi).
#   Resume by replay at 2 ranks: 20 steps straight against 10 + resume + 10: steps 11-20 and
#     the final weights bit-identical (==).
#   Resume at another layout: saved at 2 ranks (micro-batch 4 x grad-accum 2), resumed at 4
#     ranks (4 x 1), the same global batch of 16: steps 11-20 match a straight 4-rank run
#     within a relative 1e-5, the DDP parity tolerance (tests/cli/ddp_parity.sh says why):
#     before step 10 the two runs summed their gradients in different orders.
#   A save slower than --comm-timeout finishes (the others wait under --save-timeout) and resumes
#     by replay; one slower than --save-timeout ends the job with a line naming it.
#   A refused checkpoint fails on every rank together: one line, exit 2, no hang.
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }

T=(train --device cpu --model tiny --dropout 0.1 --micro-batch 4 --warmup 5 --steps 20 --log-every 100)

mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 2 --log-json "$work/np2.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 2 --stop-at-step 10 --save-dir "$work/ck" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 2 --save-dir "$work/ck" --log-json "$work/np2_resumed.jsonl" >/dev/null
# The 2 -> 4 case resumes from the step-10 checkpoint of a separate directory.
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 2 --stop-at-step 10 --save-dir "$work/ck2" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --dropout 0 --grad-accum 1 --log-json "$work/np4.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --dropout 0 --grad-accum 2 --stop-at-step 10 --save-dir "$work/ck3" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --dropout 0 --grad-accum 1 --save-dir "$work/ck3" --log-json "$work/np4_resumed.jsonl" >/dev/null

python3 - "$work" <<'PY'
import json, sys
d = sys.argv[1]
load = lambda n: [json.loads(l) for l in open(f"{d}/{n}.jsonl")]
steps = lambda rs: {r["step"]: r for r in rs if r["type"] == "step"}
a, b = load("np2"), load("np2_resumed")
sa, sb = steps(a), steps(b)
assert sorted(sb) == list(range(11, 21)), sorted(sb)
for s in sb:
    for key in ("loss", "grad_norm", "lr"):
        assert sb[s][key] == sa[s][key], (s, key, sb[s][key], sa[s][key])
assert (a[-1]["param_sum"], a[-1]["param_sq"]) == (b[-1]["param_sum"], b[-1]["param_sq"])
print("np 2: steps 11-20 and final weights bit-identical after resume")

ref, res = load("np4"), load("np4_resumed")
assert res[0]["world"]["dp"] == 4 and res[0]["start_step"] == 10
sr, ss = steps(ref), steps(res)
rel = lambda x, y: abs(x - y) / max(abs(x), 1e-30)
worst = 0.0
for s in range(11, 21):
    for key in ("loss", "grad_norm"):
        worst = max(worst, rel(sr[s][key], ss[s][key]))
for key in ("param_sum", "param_sq"):
    worst = max(worst, rel(ref[-1][key], res[-1][key]))
assert worst <= 1e-5, worst
print(f"saved at 2 ranks, resumed at 4: steps 11-20 and final weights within {worst:.1e} of the 4-rank run")
PY

# ---- saves and loads are not bounded by --comm-timeout: rank 0 writes (reads) alone while the
# other rank waits in a collective. A save that takes 4 s against a 2 s --comm-timeout (test hook)
# finishes, and its checkpoint resumes by replay; one that outlasts --save-timeout ends the job
# with a line naming it.
KILN_TEST_SLOW_SAVE_S=4 mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 2 --stop-at-step 10 --save-every 5 --save-dir "$work/slow" \
  --comm-timeout 2 >/dev/null 2>"$work/err" || { cat "$work/err"; fail "a save slower than --comm-timeout ended the job"; }
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 2 --save-dir "$work/slow" --comm-timeout 2 --log-json "$work/slow.jsonl" >/dev/null
python3 - "$work" <<'PY'
import json, sys
d = sys.argv[1]
load = lambda n: [json.loads(l) for l in open(f"{d}/{n}.jsonl")]
a = {r["step"]: r for r in load("np2") if r["type"] == "step"}
recs = load("slow")
b = {r["step"]: r for r in recs if r["type"] == "step"}
assert sorted(b) == list(range(11, 21)), sorted(b)
assert all(b[s]["loss"] == a[s]["loss"] for s in b)
ld = [r for r in recs if r["type"] == "resume"]
assert len(ld) == 1 and ld[0]["bytes"] > 0 and ld[0]["step"] == 10, ld
saves = [r for r in recs if r["type"] == "checkpoint"]
assert saves and all(r["bytes"] > 0 and r["seconds"] > 0 and "peak_extra_host_gb" in r for r in saves), saves
print("a save slower than --comm-timeout finished; its checkpoint replayed steps 11-20 exactly")
PY
code=0
KILN_TEST_SLOW_SAVE_S=8 mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 2 --stop-at-step 5 --save-dir "$work/slower" --comm-timeout 1 \
  --save-timeout 2 >/dev/null 2>"$work/err" || code=$?
[ "$code" -ne 0 ] || fail "a save over --save-timeout did not end the job"
grep -q "did not complete within 2 s (--save-timeout: rank 0 writes the checkpoint meanwhile)" "$work/err" ||
  { cat "$work/err"; fail "the timeout message does not name --save-timeout"; }
echo "ok: a save over --save-timeout ends the job naming it"

code=0
mpi 2 "$KILN_BIN" "${T[@]}" --n-layer 3 --grad-accum 2 --steps 22 --resume "$work/ck" >"$work/out" 2>"$work/err" || code=$?
[ "$code" -eq 2 ] || { cat "$work/err"; fail "a checkpoint of another shape: exit $code (want 2)"; }
[ "$(grep -c 'kiln: error: .*another model shape' "$work/err")" -eq 1 ] || { cat "$work/err"; fail "want one error line"; }
echo "ok: a refused checkpoint ends every rank with one line"
echo "PASS"
