#!/usr/bin/env bash
# tests/cli/activation_checkpointing.sh -- --activation-checkpointing end to end (labels cli, mpi).
# With dropout on, `full` and `selective` train exactly as `none` does: the recomputation
# replays the RNG state, and the same kernels run on the same inputs, so the losses and the
# final weights are bit-identical (==), in one process and under DDP at 2 ranks (where the
# gradient hooks fire inside the recomputation's nested backward).
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }

T=(train --device cpu --model tiny --dropout 0.2 --micro-batch 4 --steps 8 --warmup 2 --log-every 100)
for mode in none full selective; do
  "$KILN_BIN" "${T[@]}" --activation-checkpointing "$mode" --log-json "$work/$mode.jsonl" >/dev/null
  mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 2 --activation-checkpointing "$mode" --log-json "$work/np2_$mode.jsonl" >/dev/null
done
python3 - "$work" <<'PY'
import json, sys
d = sys.argv[1]
load = lambda n: [json.loads(l) for l in open(f"{d}/{n}.jsonl")]
for prefix in ("", "np2_"):
    ref = load(prefix + "none")
    for mode in ("full", "selective"):
        run = load(prefix + mode)
        assert run[0]["config"]["activation_checkpointing"] == mode
        a = [(r["loss"], r["grad_norm"]) for r in ref if r["type"] == "step"]
        b = [(r["loss"], r["grad_norm"]) for r in run if r["type"] == "step"]
        assert len(a) == 8 and a == b, (prefix, mode, a, b)
        assert (ref[-1]["param_sum"], ref[-1]["param_sq"]) == (run[-1]["param_sum"], run[-1]["param_sq"])
    print(f"{prefix or '1 process '}: full and selective bit-identical to none over 8 steps with dropout 0.2")
PY
echo "PASS"
