#!/usr/bin/env bash
# tests/cli/train_e2e.sh -- `kiln train` end to end on the CPU: the loss falls, every record
# carries the contract's fields, --steps 0 reports the parameter count, and gradient
# accumulation is the same arithmetic as a larger micro-batch.
source "$(dirname "$0")/common.sh"

# The issue's acceptance run: tiny, 300 steps, synthetic data.
"$KILN_BIN" train --model tiny --device cpu --steps 300 --log-every 50 --log-json "$work/run.jsonl" | tee "$work/run.out"
# The console: each step line says the tokens seen, the time elapsed and the ETA (none on the last
# step); the run closes with a human summary of the JSONL summary record.
grep -Eq "^step +150/300 \| .* \| 153.6K tok \| [0-9]+:[0-9]{2} elapsed, ETA [0-9]+:[0-9]{2}$" "$work/run.out" || fail "step line"
grep -Eq "^step +300/300 \| .* \| 307.2K tok \| [0-9]+:[0-9]{2} elapsed$" "$work/run.out" || fail "last step line"
python3 - "$work/run.jsonl" "$work/run.out" <<'PY'
import json, sys
s = [json.loads(l) for l in open(sys.argv[1])][-1]
out = open(sys.argv[2]).read()
want = [f"steps 1-300 (300 updates, 0 skipped), 307.2K tokens seen",
        f"loss {s['final_loss']:.4f} (mean of the last 10: {s['mean_loss_last10']:.4f})",
        f"TFLOP/s/device; peak memory {s['peak_mem_gb']:.2f} GB"]
assert "kiln: done in " in out, out[-500:]
for w in want:
    assert w in out, (w, out[-500:])
print("console summary matches the summary record")
PY
jsonl_check "$work/run.jsonl" '
types = [r["type"] for r in records]
assert types[0] == "config" and types[-1] == "summary", types[:2] + types[-2:]
steps = [r for r in records if r["type"] == "step"]
assert len(steps) == 300, len(steps)
need = "step loss lr grad_norm loss_scale skipped tokens_per_s step_ms tflops mfu mem_gb comm_bytes comm_ms tokens_seen elapsed_s".split()
for r in steps:
    missing = [k for k in need if k not in r]
    assert not missing, (r["step"], missing)
assert [r["step"] for r in steps] == list(range(1, 301))
assert [r["tokens_seen"] for r in steps] == [1024 * k for k in range(1, 301)]
assert all(a["elapsed_s"] < b["elapsed_s"] for a, b in zip(steps, steps[1:]))
first, last10 = steps[0]["loss"], sum(r["loss"] for r in steps[-10:]) / 10
print(f"first loss {first:.4f}, mean of last 10 {last10:.4f}")
assert abs(first - math.log(512)) < 0.2, first
assert last10 <= 0.5 * first, (first, last10)
assert records[0]["params"] == 875264, records[0]["params"]
'

# --steps 0: build, write the config record, exit.
"$KILN_BIN" train --model gpt2-124m --device cpu --steps 0 --log-json "$work/c.jsonl"
jsonl_check "$work/c.jsonl" '
assert records[0]["type"] == "config"
assert records[0]["params"] == 124475904, records[0]["params"]
assert not [r for r in records if r["type"] == "step"]
'

# The same global batch as 1 x 8 or 2 x 4 sequences: the same losses (only the summation
# order differs: relative 1e-5 in fp32).
"$KILN_BIN" train --device cpu --steps 10 --micro-batch 8 --grad-accum 1 --log-json "$work/a1.jsonl" >/dev/null
"$KILN_BIN" train --device cpu --steps 10 --micro-batch 4 --grad-accum 2 --log-json "$work/a2.jsonl" >/dev/null
python3 - "$work/a1.jsonl" "$work/a2.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p) if '"type":"step"' in l] for p in sys.argv[1:3])
assert len(a) == len(b) == 10
for i, (x, y) in enumerate(zip(a, b)):
    assert abs(x - y) <= 1e-5 * abs(x), (i + 1, x, y)
print("grad-accum 2 x 4 matches 1 x 8 over 10 steps")
PY
echo "PASS"
