#!/usr/bin/env bash
# tests/cli/checkpoint_replay.sh -- resume by replay on sharded layouts (label mpi): 20 steps
# straight against 10 steps, a save, a resume on the same layout and 10 more. Steps 11-20 (loss,
# gradient norm) and the final weights' fingerprint must be bit-identical (==): the checkpoint is
# gathered and scattered one tensor at a time (runtime/checkpoint/consolidate.h) and holds every bit of the
# state, so nothing may differ. Layouts: dp 2 x pp 2 under ZeRO-1, dp 2 x tp 2 under ZeRO-3,
# and ZeRO-3 with --offload all at dp 2 (its gradients added on the host by a worker thread),
# dropout on.
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
T=(train --device cpu --model tiny --dropout 0.1 --micro-batch 2 --warmup 5 --steps 20 --log-every 100)

names=()
for cfg in "4 --pp 2 --zero 1 --grad-accum 4" "4 --tp 2 --zero 3 --grad-accum 2" "2 --zero 3 --offload all --grad-accum 2"; do
  read -r np flags <<<"$cfg"
  name=$(echo "$flags" | tr -d ' -')
  # shellcheck disable=SC2086
  mpi "$np" "$KILN_BIN" "${T[@]}" $flags --log-json "$work/$name.straight.jsonl" >/dev/null || fail "$name: straight run"
  # shellcheck disable=SC2086
  mpi "$np" "$KILN_BIN" "${T[@]}" $flags --stop-at-step 10 --save-dir "$work/$name" >/dev/null || fail "$name: first half"
  # shellcheck disable=SC2086
  mpi "$np" "$KILN_BIN" "${T[@]}" $flags --save-dir "$work/$name" --log-json "$work/$name.resumed.jsonl" >/dev/null ||
    fail "$name: resumed half"
  names+=("$name")
done
python3 - "$work" "${names[@]}" <<'PY'
import json, sys
d = sys.argv[1]
for name in sys.argv[2:]:
    load = lambda k: [json.loads(l) for l in open(f"{d}/{name}.{k}.jsonl")]
    a, b = load("straight"), load("resumed")
    sa = {r["step"]: r for r in a if r["type"] == "step"}
    sb = {r["step"]: r for r in b if r["type"] == "step"}
    assert sorted(sb) == list(range(11, 21)), (name, sorted(sb))
    for s in sb:
        for key in ("loss", "grad_norm", "lr"):
            assert sb[s][key] == sa[s][key], (name, s, key, sa[s][key], sb[s][key])
    assert (a[-1]["param_sum"], a[-1]["param_sq"]) == (b[-1]["param_sum"], b[-1]["param_sq"]), name
    ld = [r for r in b if r["type"] == "resume"]
    assert len(ld) == 1 and ld[0]["step"] == 10, (name, ld)
    print(f"{name}: steps 11-20 and the final weights bit-identical after a save and a resume")
PY
echo "PASS"
