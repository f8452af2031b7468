#!/usr/bin/env bash
# tests/cli/ddp_faults.sh -- a rank that stalls or dies ends the whole job, never a hang (label mpi).
#   SIGSTOP one rank after training has started: the other's watchdog aborts the job within
#     --comm-timeout (3 s) plus a margin, with its one-line message naming the operation.
#   SIGKILL one rank: mpirun ends the job.
#   An error on one rank only: that rank aborts the job (MPI_Abort) instead of leaving its peer
#   blocked in a collective; exit code 2 and one kiln line.
#   Ranks started with different settings (MPMD): exit 2 at once, one line naming the setting; the
#   outputs rank 0 alone writes, and --device texts that resolve to the same kind, may differ.
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"

# start_job LOG: a long 2-rank run in the background; sets job (mpirun's pid) once step 3 is logged.
start_job() {
  "$MPIEXEC" --allow-run-as-root -np 2 "$KILN_BIN" train --device cpu --steps 1000000 --log-every 1000 \
    --comm-timeout 3 --log-json "$work/$1.jsonl" >"$work/$1.out" 2>"$work/$1.err" &
  job=$!
  for _ in $(seq 600); do
    [ -f "$work/$1.jsonl" ] && [ "$(grep -c '"type":"step"' "$work/$1.jsonl")" -ge 3 ] && return 0
    kill -0 "$job" 2>/dev/null || fail "$1: the job ended before it started training: $(cat "$work/$1.err")"
    sleep 0.1
  done
  fail "$1: no training step within 60 s"
}
# wait_job SECONDS: waits for the job to end; sets code and elapsed; fails (and cleans up) on a hang.
wait_job() {
  local start=$SECONDS
  for _ in $(seq $(( $1 * 10 ))); do
    if ! kill -0 "$job" 2>/dev/null; then
      code=0; wait "$job" || code=$?
      elapsed=$(( SECONDS - start ))
      return 0
    fi
    sleep 0.1
  done
  pkill -KILL -P "$job" 2>/dev/null; kill -KILL "$job" 2>/dev/null
  fail "the job still runs $1 s after the fault: it hangs"
}
ranks() { pgrep -P "$job" -f "$KILN_BIN"; }

# --- a stalled rank
start_job stop
victim=$(ranks | tail -n 1)
[ -n "$victim" ] || fail "no rank process found under mpirun $job"
kill -STOP "$victim"
wait_job 30
kill -KILL "$victim" 2>/dev/null || true
[ "$code" -ne 0 ] || fail "job exited 0 after a rank stalled"
grep -q "did not complete within 3 s (--comm-timeout)" "$work/stop.err" || fail "no watchdog message: $(cat "$work/stop.err")"
echo "SIGSTOP: job ended in ${elapsed}s with exit $code: $(grep 'kiln: error' "$work/stop.err" | head -n 1)"

# --- a killed rank
start_job kill
victim=$(ranks | tail -n 1)
kill -KILL "$victim"
wait_job 30
[ "$code" -ne 0 ] || fail "job exited 0 after a rank was killed"
echo "SIGKILL: job ended in ${elapsed}s with exit $code"

# --- an error on one rank only (rank 0 alone opens the log): the job ends at once, one line.
# Rank 0's verdict reaches every rank (distributed/rank0_verdict.h), so the line is the one every
# rank agrees on, without "rank 0:" -- thrown on rank 0 alone it waited 10 s for the other rank to
# fail too (launch/main.cpp), then aborted the job naming the rank.
code=0
timeout 60 "$MPIEXEC" --allow-run-as-root -np 2 "$KILN_BIN" train --device cpu --steps 5 \
  --log-json /nonexistent-dir/run.jsonl >/dev/null 2>"$work/one.err" || code=$?
[ "$code" -eq 2 ] || fail "an error on rank 0 alone: exit $code (want 2), $(cat "$work/one.err")"
[ "$(grep -c '^kiln: error:' "$work/one.err")" -eq 1 ] || fail "want one kiln line: $(cat "$work/one.err")"
grep -q '^kiln: error: --log-json /nonexistent-dir/run.jsonl: cannot open' "$work/one.err" ||
  fail "rank 0's error was not every rank's verdict: $(cat "$work/one.err")"
echo "error on one rank: exit $code, $(grep '^kiln: error' "$work/one.err")"

# --- ranks started with different settings (an MPMD launch): refused before any other collective,
# one line naming the setting, at once -- not the watchdog's stall after --comm-init-timeout.
code=0
start=$SECONDS
timeout 60 "$MPIEXEC" --allow-run-as-root -np 1 "$KILN_BIN" train --device cpu --steps 3 --pp 2 --pp-virtual 2 --grad-accum 4 \
  : -np 1 "$KILN_BIN" train --device cpu --steps 3 --pp 2 --grad-accum 4 >/dev/null 2>"$work/mpmd.err" || code=$?
[ "$code" -eq 2 ] || fail "ranks with different settings: exit $code (want 2), $(cat "$work/mpmd.err")"
[ "$(grep -c '^kiln: error:' "$work/mpmd.err")" -eq 1 ] || fail "want one kiln line: $(cat "$work/mpmd.err")"
grep -q 'different settings: --pp-schedule is "interleaved" on rank 0 but "1f1b" on rank 1' "$work/mpmd.err" ||
  fail "the line does not name the setting: $(cat "$work/mpmd.err")"
[ $(( SECONDS - start )) -lt 30 ] || fail "the mismatch took $(( SECONDS - start )) s to end the job"
# ... and outputs rank 0 alone writes may differ: the same run with a log on rank 0 only trains;
# so may the text of --device where it names the same kind of device (issue 48: a launcher's
# `--device cuda:$LOCAL_RANK` was refused): `auto` on a machine without a GPU beside `cpu`.
CUDA_VISIBLE_DEVICES= "$MPIEXEC" --allow-run-as-root -np 1 "$KILN_BIN" train --device auto --steps 2 --log-json "$work/mpmd.jsonl" \
  : -np 1 "$KILN_BIN" train --device cpu --steps 2 >/dev/null 2>"$work/mpmd_log.err" ||
  fail "a --log-json on rank 0 alone, or --device auto beside --device cpu, was refused: $(cat "$work/mpmd_log.err")"
echo "different settings: exit $code in $(( SECONDS - start )) s, $(grep '^kiln: error' "$work/mpmd.err")"
echo "PASS"
