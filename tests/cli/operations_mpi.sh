#!/usr/bin/env bash
# tests/cli/operations_mpi.sh -- operating a long job under mpirun (label mpi; docs/operations.md):
#   SIGTERM to one rank of two at step N: both finish the step, agree to stop after it, save step N
#     and exit 75; resumed at 2 ranks, the run replays the uninterrupted one bit for bit.
#   SIGTERM to the process group of launch/kiln_mpirun.sh (a scheduler's, a terminal's Ctrl-C) stops
#     the job the same way: the wrapper sends mpirun SIGUSR1, which it forwards to every rank (as
#     examples/slurm_ddp.sbatch passes on Slurm's --signal warning); a 2 s save completes; exit 75.
#   An error every rank finds alike (a layout that does not divide the world, a missing data
#     file) ends the job with one `kiln: error:` line, a clean MPI finalisation and exit 2 or 3:
#     no MPI_Abort banner; the user's save directory is left as it was (no lock file).
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
T=(train --device cpu --model tiny --dropout 0.1 --micro-batch 4 --warmup 5 --log-every 100 --steps 40)

mpi 2 "$KILN_BIN" "${T[@]}" --log-json "$work/straight.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --save-dir "$work/sig" --log-json "$work/sig.jsonl" >"$work/sig.out" 2>&1 &
launcher=$!
wait_steps "$work/sig.jsonl" 5
ranks=$(pgrep -f -- "--save-dir $work/sig --log-json" | grep -vx "$launcher" || true)
one=$(echo "$ranks" | tail -n 1)
[ -n "$one" ] || fail "no rank process found"
kill -TERM "$one"
code=0; wait "$launcher" || code=$?
[ "$code" -eq 75 ] || { cat "$work/sig.out"; fail "SIGTERM to one rank: exit $code (want 75)"; }
n=$(grep '"type":"step"' "$work/sig.jsonl" | tail -n 1 | python3 -c 'import json, sys; print(json.loads(sys.stdin.read())["step"])')
grep -q "interrupted at step $n (SIGTERM), saved $work/sig/step_$(printf %08d "$n")" "$work/sig.out" ||
  { cat "$work/sig.out"; fail "no 'interrupted at step $n' line"; }
mpi 2 "$KILN_BIN" "${T[@]}" --save-dir "$work/sig" --log-json "$work/sig.jsonl" >/dev/null
python3 - "$work" "$n" <<'PY'
import json, sys
d, n = sys.argv[1], int(sys.argv[2])
straight = [json.loads(l) for l in open(f"{d}/straight.jsonl")]
log = [json.loads(l) for l in open(f"{d}/sig.jsonl")]
start = [i for i, r in enumerate(log) if r["type"] == "resume"][0]
a = {r["step"]: r for r in straight if r["type"] == "step"}
b = {r["step"]: r for r in log[start:] if r["type"] == "step"}
assert sorted(b) == list(range(n + 1, 41)), sorted(b)
assert all((b[s]["loss"], b[s]["grad_norm"]) == (a[s]["loss"], a[s]["grad_norm"]) for s in b)
assert (straight[-1]["param_sum"], straight[-1]["param_sq"]) == (log[-1]["param_sum"], log[-1]["param_sq"])
print(f"SIGTERM to one rank of 2 after step {n}: both stopped and saved; the resume replayed steps {n + 1}-40 bit for bit")
PY

# SIGTERM, what a scheduler sends, to a job launched with launch/kiln_mpirun.sh (issue 48: sent
# to mpirun itself, it ended the job, exit 1, and SIGKILLed the ranks 1 s later, a save in the
# middle or not). The wrapper turns it into SIGUSR1, which mpirun forwards to every rank: they stop,
# save -- a save held 2 s here, past mpirun's 1 s before its SIGKILL -- and exit 75, and so do mpirun
# and the wrapper. Sent to the wrapper's whole process group, as a scheduler or a terminal's Ctrl-C
# does: mpirun, in a session of its own, does not get it. (The run is bounded by its 200 steps.)
KILN_TEST_SLOW_SAVE_S=2 MPIEXEC="$MPIEXEC" setsid "$(dirname "$0")/../../launch/kiln_mpirun.sh" --allow-run-as-root --oversubscribe \
  -np 2 -x KILN_TEST_SLOW_SAVE_S "$KILN_BIN" "${T[@]}" --steps 200 --async-save=false --save-dir "$work/term" \
  --log-json "$work/term.jsonl" >"$work/term.out" 2>&1 &
launcher=$!
wait_steps "$work/term.jsonl" 3
kill -TERM -- -"$launcher"
code=0; wait "$launcher" || code=$?
[ "$code" -eq 75 ] && grep -q "interrupted at step .* (SIGUSR1), saved" "$work/term.out" ||
  { cat "$work/term.out"; fail "SIGTERM to the job under launch/kiln_mpirun.sh: exit $code (want 75)"; }
[ -f "$work/term/$(cat "$work/term/latest")/trainer_state.json" ] || fail "no complete checkpoint after the stop"
echo "SIGTERM to the job under launch/kiln_mpirun.sh: SIGUSR1 to every rank through mpirun, a 2 s save, exit 75"

# Errors every rank finds: one line, no MPI_Abort banner, the error's exit code. The user's save
# directory is left as it was: no lock file in it (issue 48: a refused run left its .kiln.lock).
mkdir "$work/mine"
for case in "2|--tp 3|layout does not divide the world" "3|--data $work/none_*.bin|no file matches"; do
  IFS='|' read -r want flags msg <<<"$case"
  code=0
  # shellcheck disable=SC2086
  mpi 2 "$KILN_BIN" train --device cpu --steps 2 --save-dir "$work/mine" $flags >"$work/out" 2>"$work/err" || code=$?
  [ "$code" -eq "$want" ] || { cat "$work/err"; fail "$flags: exit $code (want $want)"; }
  [ "$(grep -c '^kiln: error:' "$work/err")" -eq 1 ] && grep -q "^kiln: error: .*$msg" "$work/err" ||
    { cat "$work/err"; fail "$flags: want one error line"; }
  ! grep -q "MPI_ABORT\|ORTE_ERROR_LOG" "$work/err" || { cat "$work/err"; fail "$flags: ended with MPI_Abort"; }
  [ -d "$work/mine" ] && [ -z "$(ls -A "$work/mine")" ] || fail "$flags: the refused run left $(ls -A "$work/mine") in the save directory"
  echo "ok ($code): $(grep '^kiln: error:' "$work/err")"
done
echo "PASS"
