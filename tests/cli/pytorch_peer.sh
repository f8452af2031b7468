#!/usr/bin/env bash
# tests/cli/pytorch_peer.sh -- bench/pytorch_gpt2.py, the PyTorch peer kiln is measured against on a
# GPU (issue 21), counts what kiln counts: for tiny, gpt2-124m and gpt2-350m its parameter count and
# FLOPs per token equal the config record of `kiln train --steps 0` (same shape, the padded
# vocabulary, F = 6 N + 12 L d T), so the two tokens/s and MFU figures compare like for like. A
# 3-step CPU run (fp32, eager) prints its JSON line with finite losses. torch.compile is not run
# here (inductor on 2 CPU cores takes minutes); it runs on the GPU machine.
source "$(dirname "$0")/common.sh"
need_python torch
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$work"
for m in tiny gpt2-124m gpt2-350m; do
  "$py" "$here/bench/pytorch_gpt2.py" --model "$m" --device cpu --steps 0 >"peer_$m.json"
  "$KILN_BIN" train --model "$m" --steps 0 --log-json "kiln_$m.jsonl" >/dev/null
  python3 - "$m" <<'PY'
import json, sys
m = sys.argv[1]
peer = json.load(open(f"peer_{m}.json"))
kiln = json.loads(open(f"kiln_{m}.jsonl").readline())
assert peer["params"] == kiln["params"], (m, peer["params"], kiln["params"])
assert peer["flops_per_token"] == kiln["flops_per_token"], (m, peer["flops_per_token"], kiln["flops_per_token"])
print(f"{m}: {peer['params']} parameters, {peer['flops_per_token']:.6g} FLOPs per token, as kiln counts")
PY
done
"$py" "$here/bench/pytorch_gpt2.py" --model tiny --device cpu --micro-batch 4 --steps 3 --warmup-steps 1 --dtype fp32 >run.json
python3 - <<'PY'
import json, math
r = json.load(open("run.json"))
assert r["peer"] == "pytorch eager" and r["steps"] == 3 and r["tokens_per_s"] > 0, r
assert math.isfinite(r["loss_first"]) and math.isfinite(r["loss_last"]), r
print(f"3 steps on the CPU: {r['tokens_per_s']:.0f} tokens/s, loss {r['loss_first']:.3f} -> {r['loss_last']:.3f}")
PY
echo "PASS"
