#!/usr/bin/env bash
# tests/cli/offload_overlap.sh -- the overlapped offload step (parallel/zero.h, "The overlapped
# host step") against the serial one, bit for bit (label mpi).
# Every offload mode -- optimizer under ZeRO-1/2/3, all under ZeRO-3 (both accumulation policies),
# 16-bit working weights, fp16 with its loss scale, clipping that bites, with tp 2 and pp 2 (its
# tied embedding's gradient changed after it was downloaded), and tiny-moe with ep 2 at dp 4 (the
# experts' shards downloaded after their 1/ep) -- runs twice: the host worker's tasks in line
# (KILN_TEST_HOST_WORKER=inline: the order the step had before it overlapped) and on the worker
# thread (the default, as on a GPU), made slow (KILN_TEST_HOST_STEP_DELAY_MS=15 before every
# task, so each step's updates are still queued when the next forward starts: a
# gather, an add, a norm or a save that forgot to wait for them reads stale or half-written
# shards). The host work is the same arithmetic in either order, so the losses, gradient norms and
# final weights must be equal exactly. Then a save under the slow worker (step 3, while the updates
# are queued) resumed in line equals the uninterrupted run's steps 4-6.
# The delayed update (--offload-delayed-update; parallel/zero.h, "The delayed update", whose rule
# tests/test_zero_engine.cpp checks against a reference): the same in line / slowed-thread
# comparison under ZeRO-1/2/3, 16-bit weights, pp 2 and ep 2 -- the slowed worker is the case where
# the next forward and backward really run while the update is queued, and its gradient copies
# must wait for it; the delayed run equals the undelayed one at step 1 and not after; a save
# (which publishes the pending update) resumed equals the saving run's steps 4-6 bit for bit; and
# a resume that changes --save-every (the points where the delay restarts) is refused; with
# --offload-delay-from 2 (the first two updates undelayed) as well.
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
T=(train --device cpu --steps 6 --log-every 100 --dropout 0)
configs=(
  "2 tiny --grad-accum 2 --zero 1 --offload optimizer"
  "2 tiny --grad-accum 2 --zero 2 --offload optimizer --precision bf16"
  "2 tiny --grad-accum 2 --zero 3 --offload optimizer --precision fp16 --seq-len 64"
  "2 tiny --grad-accum 2 --zero 3 --offload all"
  "2 tiny --grad-accum 2 --zero 3 --offload all --zero-accum local --precision bf16"
  "2 tiny --grad-accum 1 --zero 3 --offload all --grad-clip 0.05"
  "2 tiny --grad-accum 2 --zero 3 --offload all --tp 2"
  "2 tiny --grad-accum 4 --zero 3 --offload optimizer --pp 2"
  "4 tiny-moe --grad-accum 2 --micro-batch 1 --ep 2 --zero 2 --offload optimizer"
  "4 tiny-moe --grad-accum 1 --micro-batch 1 --ep 2 --zero 3 --offload all"
  "2 tiny --grad-accum 2 --zero 1 --offload optimizer --offload-delayed-update"
  "2 tiny --grad-accum 2 --zero 2 --offload optimizer --precision bf16 --offload-delayed-update"
  "2 tiny --grad-accum 2 --zero 3 --offload optimizer --precision fp16 --seq-len 64 --offload-delayed-update"
  "2 tiny --grad-accum 4 --zero 3 --offload optimizer --pp 2 --offload-delayed-update"
  "4 tiny-moe --grad-accum 2 --micro-batch 1 --ep 2 --zero 2 --offload optimizer --offload-delayed-update"
  "2 tiny --grad-accum 2 --zero 3 --offload optimizer --precision bf16 --offload-delayed-update --offload-delay-from 2"
)
i=0
for cfg in "${configs[@]}"; do
  i=$((i + 1))
  read -r np model flags <<<"$cfg"
  case "$flags" in *--micro-batch*) ;; *) flags="--micro-batch 2 $flags" ;; esac
  # shellcheck disable=SC2086
  mpi "$np" -x KILN_TEST_HOST_WORKER=inline "$KILN_BIN" "${T[@]}" --model "$model" $flags --log-json "$work/serial$i.jsonl" >/dev/null ||
    fail "serial: $cfg"
  # shellcheck disable=SC2086
  mpi "$np" -x KILN_TEST_HOST_WORKER=thread -x KILN_TEST_HOST_STEP_DELAY_MS=15 "$KILN_BIN" "${T[@]}" --model "$model" $flags --log-json "$work/overlap$i.jsonl" >/dev/null ||
    fail "overlapped: $cfg"
  echo "$cfg" >"$work/cfg$i"
done
# A save while the updates are queued, and the resume from it.
save=(--model tiny --micro-batch 2 --grad-accum 2 --zero 3 --offload all)
mpi 2 -x KILN_TEST_HOST_WORKER=thread -x KILN_TEST_HOST_STEP_DELAY_MS=15 "$KILN_BIN" "${T[@]}" "${save[@]}" --save-dir "$work/ck" --save-every 3 \
  --log-json "$work/saved.jsonl" >/dev/null || fail "the run that saves"
mpi 2 -x KILN_TEST_HOST_WORKER=inline "$KILN_BIN" "${T[@]}" "${save[@]}" --resume "$work/ck/step_00000003" \
  --log-json "$work/resumed.jsonl" >/dev/null || fail "the resume"

# The delayed update saved at step 3 (the slowed worker: the update is queued at the save) and resumed.
delay=(--model tiny --micro-batch 2 --grad-accum 2 --zero 3 --offload optimizer --precision bf16 --offload-delayed-update)
mpi 2 -x KILN_TEST_HOST_WORKER=thread -x KILN_TEST_HOST_STEP_DELAY_MS=15 "$KILN_BIN" "${T[@]}" "${delay[@]}" --save-dir "$work/dk" --save-every 3 \
  --log-json "$work/dsaved.jsonl" >/dev/null || fail "the delayed run that saves"
mpi 2 -x KILN_TEST_HOST_WORKER=inline "$KILN_BIN" "${T[@]}" "${delay[@]}" --save-every 3 --resume "$work/dk/step_00000003" \
  --log-json "$work/dresumed.jsonl" >/dev/null || fail "the delayed resume"
expect_refused 2 "save_every 3 -> 2" "${T[@]}" "${delay[@]}" --save-every 2 --resume "$work/dk/step_00000003"
expect_refused 1 "offload-delayed-update needs --offload optimizer" "${T[@]}" --model tiny --zero 3 --offload all --offload-delayed-update
expect_refused 1 "offload-delay-from 2 needs --offload-delayed-update" "${T[@]}" --model tiny --zero 1 --offload optimizer --offload-delay-from 2

python3 - "$work" "$i" <<'PY'
import json, sys
d, n = sys.argv[1], int(sys.argv[2])
def load(p): return [json.loads(l) for l in open(p)]
def steps(rs): return [(r["step"], r["loss"], r["grad_norm"]) for r in rs if r["type"] == "step"]
def final(rs): return (rs[-1].get("param_sum"), rs[-1].get("param_sq"))
for i in range(1, n + 1):
    cfg = open(f"{d}/cfg{i}").read().strip()
    a, b = load(f"{d}/serial{i}.jsonl"), load(f"{d}/overlap{i}.jsonl")
    assert len(steps(a)) == 6 and steps(a) == steps(b), (cfg, steps(a), steps(b))
    assert final(a) == final(b) and final(a)[0] is not None, (cfg, final(a), final(b))
    print(f"{cfg}: overlapped = serial, bit for bit (6 steps, final weights {final(a)[1]:.6f})")
saved, resumed = steps(load(f"{d}/saved.jsonl")), steps(load(f"{d}/resumed.jsonl"))
assert saved[3:] == resumed, (saved[3:], resumed)
assert final(load(f"{d}/saved.jsonl")) == final(load(f"{d}/resumed.jsonl"))
print("saved at step 3 with the updates queued; the resume equals steps 4-6 bit for bit")
# The delay itself: config 11 is config 1 delayed -- the same step 1 (both on the initial
# weights), then another run (step 2 of the delayed one runs on them again).
plain, delayed = steps(load(f"{d}/serial1.jsonl")), steps(load(f"{d}/serial11.jsonl"))
assert "delayed" in open(f"{d}/cfg11").read() and open(f"{d}/cfg11").read().startswith(open(f"{d}/cfg1").read().strip())
assert plain[0] == delayed[0] and all(a[1] != b[1] for a, b in zip(plain[1:], delayed[1:])), (plain, delayed)
print(f"delayed: step 1 equal, steps 2-6 differ (step 2 loss {plain[1][1]:.6f} undelayed, {delayed[1][1]:.6f} delayed)")
saved, resumed = steps(load(f"{d}/dsaved.jsonl")), steps(load(f"{d}/dresumed.jsonl"))
assert saved[3:] == resumed, (saved[3:], resumed)
assert final(load(f"{d}/dsaved.jsonl")) == final(load(f"{d}/dresumed.jsonl"))
print("delayed, saved at step 3 with the update queued: the resume equals steps 4-6 bit for bit")
PY
