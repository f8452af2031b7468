#!/usr/bin/env bash
# launch/kiln_mpirun.sh -- mpirun for a kiln job that a scheduler (or Ctrl-C) stops with SIGTERM,
# SIGINT or SIGHUP: the job stops cleanly, saves, and this script exits 75 ("stopped, saved:
# resume"), as `kiln train` does without mpirun (docs/operations.md, "Preemption").
#
#   launch/kiln_mpirun.sh [mpirun flags] build/kiln train --save-dir ckpt ...
#   (MPIEXEC names the launcher to run, `mpirun` by default)
#
# Why: Open MPI's mpirun does not forward SIGTERM, SIGINT or SIGHUP to the ranks (it refuses them
# in ess_base_forward_signals); it takes them as an order to end the job: SIGTERM to every rank,
# SIGKILL odls_base_sigkill_timeout (1 s) later, and exit 1 -- a save that takes longer is killed,
# and a requeue script that resubmits on 75 sees 1. It forwards SIGUSR1 and SIGUSR2, which kiln
# takes as a stop request (--stop-signals, USR1 by default). So this script runs mpirun in a
# session of its own (a signal to this script's process group -- Ctrl-C in a terminal -- reaches
# this script only) and turns the first TERM, INT, HUP or USR1 it gets into SIGUSR1 to mpirun:
# every rank finishes its step, saves and exits 75, and so does mpirun, and so does this script.
# A second TERM, INT or HUP is passed on as it is: mpirun ends the job at once (nothing saved).
#
# What no wrapper can help: a scheduler that signals every process of the job itself (Slurm at
# the time limit, through its cgroup) reaches mpirun directly. There, ask for an earlier SIGUSR1
# (`#SBATCH --signal=B:USR1@300`, delivered to this script; examples/slurm_ddp.sbatch).
set -u
launcher=${MPIEXEC:-mpirun}
if [ $# -eq 0 ]; then
  echo "usage: launch/kiln_mpirun.sh [mpirun flags] KILN train ... (a kiln job under $launcher that SIGTERM stops with a save, exit 75)" >&2
  exit 2
fi
# This script runs without job control, so the background child leads no process group and
# setsid makes its session in place (no fork): $! is mpirun's own pid.
if command -v setsid >/dev/null 2>&1; then
  setsid "$launcher" "$@" &
else
  "$launcher" "$@" &
fi
runner=$!
asked=0
stop() {  # stop SIGNAL: the first request becomes SIGUSR1 to mpirun, a second is passed on
  if [ "$asked" -eq 0 ]; then
    asked=1
    echo "kiln_mpirun.sh: SIG$1: asking every rank to stop after this step and save (SIGUSR1 to $launcher); again to end the job at once" >&2
    kill -USR1 "$runner" 2>/dev/null || true
  elif [ "$1" != USR1 ]; then
    kill -"$1" "$runner" 2>/dev/null || true
  fi
}
trap 'stop TERM' TERM
trap 'stop INT' INT
trap 'stop HUP' HUP
trap 'stop USR1' USR1
code=0
while true; do
  wait "$runner" && code=0 || code=$?
  kill -0 "$runner" 2>/dev/null || break  # a trap ends the wait early; wait again until mpirun ends
done
exit "$code"
