#!/usr/bin/env bash
# tests/cli/zero_checkpoint.sh -- ZeRO checkpoints across stages and dp sizes, and ZeRO-3 with
# activation checkpointing (label mpi). Global batch 8 sequences throughout.
#   reference   ZeRO-0 at 2 ranks (micro-batch 2 x grad-accum 2), 20 steps, checkpoints at 10 and 20
#   A           ZeRO-3 at 4 ranks (2 x 1) to step 10, then ZeRO-1 at 2 ranks (2 x 2) to step 20
#   B           ZeRO-3 --offload all at 2 ranks resumed from the reference's step-10 checkpoint
#   AC          ZeRO-3 at 2 ranks with --activation-checkpointing full, and selective
# Checked: steps 11-20 (A, B) or 1-20 (AC) against the reference within a relative 1e-5 (the
# parity tolerance, tests/cli/zero_parity.sh), and the consolidated step-20 weights
# (model.safetensors, read without numpy) against the reference's within 1e-5 absolute.
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
T=(train --device cpu --model tiny --steps 20 --log-every 100 --micro-batch 2 --keep-last 0)

mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 2 --save-dir "$work/ref" --save-every 10 --log-json "$work/ref.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 1 --zero 3 --stop-at-step 10 --save-dir "$work/a" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 2 --zero 1 --save-dir "$work/a" --log-json "$work/a.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 2 --zero 3 --offload all --resume "$work/ref/step_00000010" \
  --save-dir "$work/b" --log-json "$work/b.jsonl" >/dev/null
for ac in full selective; do
  mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 2 --zero 3 --activation-checkpointing "$ac" --log-json "$work/ac_$ac.jsonl" >/dev/null
done

python3 - "$work" "$(dirname "$0")" <<'PY'
import sys
d, here = sys.argv[1], sys.argv[2]
sys.path.insert(0, here)
from zero_expect import load, compare, max_weight_diff, steps
ref = load(f"{d}/ref.jsonl")
for name, start in (("a", 11), ("b", 11), ("ac_full", 1), ("ac_selective", 1)):
    run = load(f"{d}/{name}.jsonl")
    assert sorted(steps(run)) == list(range(start, 21)), (name, sorted(steps(run)))
    worst = compare(ref, run, name, 1e-5, first=start)
    line = f"{name}: steps {start}-20 within {worst:.1e} of ZeRO-0"
    if start > 1:
        assert run[0]["resumed_from"], name
        w = max_weight_diff(f"{d}/ref/step_00000020/model.safetensors", f"{d}/{name}/step_00000020/model.safetensors")
        assert w <= 1e-5, (name, w)
        line += f"; step-20 weights within {w:.1e}"
    print(line)
PY
echo "PASS"
