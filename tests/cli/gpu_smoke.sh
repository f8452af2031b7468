#!/usr/bin/env bash
# tests/cli/gpu_smoke.sh -- the training step on a CUDA device (label: gpu). Exits 77 (CTest
# skip) with the reason when no GPU is visible.
source "$(dirname "$0")/common.sh"
need_cuda
# Same seed, same data: the first loss on the GPU equals the CPU's to fp32 kernel differences.
"$KILN_BIN" train --device cpu --steps 1 --log-json "$work/cpu.jsonl" >/dev/null
"$KILN_BIN" train --device cuda --steps 100 --log-every 25 --log-json "$work/gpu.jsonl"
python3 - "$work/cpu.jsonl" "$work/gpu.jsonl" <<'PY'
import json, sys
cpu = [json.loads(l) for l in open(sys.argv[1])]
gpu = [json.loads(l) for l in open(sys.argv[2])]
c0 = [r for r in cpu if r["type"] == "step"][0]["loss"]
steps = [r for r in gpu if r["type"] == "step"]
assert abs(steps[0]["loss"] - c0) < 1e-3 * c0, (steps[0]["loss"], c0)
assert steps[-1]["loss"] < 0.5 * steps[0]["loss"], (steps[0]["loss"], steps[-1]["loss"])
assert steps[-1]["mem_gb"] > 0
print("gpu first loss", steps[0]["loss"], "cpu", c0, "last", steps[-1]["loss"])
PY
echo "PASS"
