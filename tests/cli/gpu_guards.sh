#!/usr/bin/env bash
# tests/cli/gpu_guards.sh -- the health guards on CUDA (issue 48; labels gpu, mpi): two ranks sharing
# one GPU through the MPI backend (NCCL refuses two ranks on one GPU).
#   - stragglers: rank 1 slowed on the device (test-only KILN_TEST_SLOW_RANK=1:x2: a spin kernel on
#     its compute stream, twice its own compute, from step 2) under tp 2, whose all-reduces make
#     rank 0 wait inside its forward and backward: every step from 2 names rank 1, rank 0's
#     compute_wait_ms is above 0, and the summary names rank 1 (distributed/wait_clock.h);
#   - --check-replicas on CUDA tensors: a bit flipped in rank 1's last parameter after step 2 is
#     found at step 2's check (exit 4, naming ln_f.bias); and the check's hash takes at most a
#     chunk of memory: gpt2-124m at dp 2 with --check-replicas 1 peaks within 64 MB of the same
#     run without it (an int64 copy of the 38.6M-element embedding was 309 MB).
# Exits 77 (CTest skip) with the reason when no GPU is visible.
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
need_cuda
mpi2() { timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe --bind-to none -np 2 "$@"; }
T=(train --device cuda --backend mpi --log-every 100)

KILN_TEST_SLOW_RANK=1:x2 mpi2 -x KILN_TEST_SLOW_RANK "$KILN_BIN" "${T[@]}" --model tiny --tp 2 --micro-batch 4 --steps 8 \
  --log-json "$work/slow.jsonl" >"$work/slow.out" || fail "the slowed run: $(tail -3 "$work/slow.out")"
grep -q "^kiln: straggler: rank 1 (pipeline stage 0)" "$work/slow.out" || fail "no straggler line: $(cat "$work/slow.out")"
python3 - "$work/slow.jsonl" <<'PY' || fail "stragglers on CUDA"
import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if r["type"] == "step" and r["step"] >= 2]
assert all(r["slowest_rank"] == 1 for r in steps), [(r["slowest_rank"], r["slowest_compute_ms"], r["compute_wait_ms"]) for r in steps]
assert all(r["compute_wait_ms"] > 0 for r in steps), [r["compute_wait_ms"] for r in steps]
print("stragglers on CUDA (tp 2, a device-side delay): every step names rank 1; rank 0 waited "
      + ", ".join(f"{r['compute_wait_ms']:.1f}" for r in steps) + " ms in its forward and backward")
PY

code=0
KILN_TEST_FLIP_BIT=1:2:last mpi2 -x KILN_TEST_FLIP_BIT "$KILN_BIN" "${T[@]}" --model tiny --micro-batch 4 --steps 4 \
  --check-replicas 2 >/dev/null 2>"$work/flip.err" || code=$?
[ "$code" -eq 4 ] && grep -q "step 2: the replicas' weights disagree.*ln_f.bias differs on rank(s) 0, 1" "$work/flip.err" ||
  fail "a flipped bit on CUDA: exit $code, $(cat "$work/flip.err")"
echo "replica check on CUDA: $(grep '^kiln: error' "$work/flip.err" | cut -c1-140)"

G=("${T[@]}" --model gpt2-124m --seq-len 64 --micro-batch 1 --steps 3)
mpi2 "$KILN_BIN" "${G[@]}" --log-json "$work/plain.jsonl" >/dev/null || fail "gpt2-124m at dp 2"
mpi2 "$KILN_BIN" "${G[@]}" --check-replicas 1 --log-json "$work/checked.jsonl" >/dev/null || fail "gpt2-124m with --check-replicas 1"
python3 - "$work" <<'PY' || fail "the replica check's memory"
import json, sys
peak = lambda n: max(r["mem_gb"] for r in map(json.loads, open(f"{sys.argv[1]}/{n}.jsonl")) if r["type"] == "step")
a, b = peak("plain"), peak("checked")
assert b - a <= 0.064, (a, b)
print(f"replica check's memory: peak {b:.3f} GB against {a:.3f} GB without it")
PY
echo "PASS"
