#!/usr/bin/env bash
# tests/cli/pytorch_peer.sh -- the PyTorch peers kiln is measured against on a GPU count what kiln
# counts, so the two tokens/s and MFU figures compare like for like:
#   - bench/pytorch_gpt2.py (issue 21): for tiny, gpt2-124m and gpt2-350m its parameter count and
#     FLOPs per token equal the config record of `kiln train --steps 0` (same shape, the padded
#     vocabulary, F = 6 N + 12 L d T);
#   - bench/pytorch_llama.py (issue 49): for tiny-llama the same; for llama3-1b (at the bench's
#     --seq-len 2048), qwen2-0.5b and llama3-8b against `kiln plan --json`, whose model figures are
#     the same GPTConfig::num_params and flops_per_token() the config record writes (checked equal
#     on tiny-llama here): `kiln train --steps 0` allocates the model and its AdamW state
#     (llama3-1b: 58 s and 19 GB on the CPU). The peer builds those on the meta device (--steps 0),
#     its count still the nn.Module's parameters; tiny-llama's count is its materialised CPU run's.
# A 3-step CPU run of each peer (fp32, eager) prints its JSON line with finite losses; the Llama
# one starts near ln(512) (random tokens, 0.02 init) and falls (the same batch every step).
# torch.compile is not run here (inductor on 2 CPU cores takes minutes); it runs on the GPU machine.
# Each peer call is mostly torch's import (about 3 s on 2 cores), so the calls are few.
source "$(dirname "$0")/common.sh"
need_python torch
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$work"
for m in tiny gpt2-124m gpt2-350m; do
  "$py" "$here/bench/pytorch_gpt2.py" --model "$m" --device cpu --steps 0 >"peer_$m.json"
  "$KILN_BIN" train --model "$m" --steps 0 --log-json "kiln_$m.jsonl" >/dev/null
done
"$py" "$here/bench/pytorch_gpt2.py" --model tiny --device cpu --micro-batch 4 --steps 3 --warmup-steps 1 --dtype fp32 >run.json
"$py" "$here/bench/pytorch_llama.py" --model tiny-llama --device cpu --micro-batch 4 --steps 3 --warmup-steps 1 \
  --dtype fp32 >peer_tiny-llama.json
"$KILN_BIN" train --model tiny-llama --steps 0 --log-json kiln_tiny-llama.jsonl >/dev/null
"$KILN_BIN" plan --model tiny-llama --json >plan_tiny-llama.json
# Plans sized to fit (--device-memory-gb): only their model figures are read.
# The three peers' counts in one Python process (torch's import once): the script's own main().
"$py" - "$here/bench" <<'PY'
import contextlib, sys
sys.path.insert(0, sys.argv[1])
import pytorch_llama
for m, seq in [("llama3-1b", ["--seq-len", "2048"]), ("qwen2-0.5b", []), ("llama3-8b", [])]:
    sys.argv = ["pytorch_llama.py", "--model", m, "--device", "cpu", "--steps", "0"] + seq
    with open(f"peer_{m}.json", "w") as f, contextlib.redirect_stdout(f):
        pytorch_llama.main()
PY
for spec in llama3-1b:2048 qwen2-0.5b llama3-8b; do
  m=${spec%%:*} seq=()
  [ "$spec" != "$m" ] && seq=(--seq-len "${spec#*:}")
  "$KILN_BIN" plan --model "$m" "${seq[@]}" --device-memory-gb 100000 --json >"plan_$m.json"
done
python3 - <<'PY'
import json, math
def same(m, peer, kiln, source):
    assert (peer["params"], peer["flops_per_token"]) == (kiln["params"], kiln["flops_per_token"]), (m, source, peer, kiln)
    print(f"{m} (T {peer['seq_len']}): {peer['params']} parameters, {peer['flops_per_token']:.6g} FLOPs per token, as {source} counts")
for m in ["tiny", "gpt2-124m", "gpt2-350m", "tiny-llama"]:
    kiln = json.loads(open(f"kiln_{m}.jsonl").readline())
    assert kiln["params_local"] == kiln["params"], (m, kiln["params_local"], kiln["params"])  # kiln's module, its formula
    same(m, json.load(open(f"peer_{m}.json")), kiln, "kiln train")
def plan(m):
    r = json.load(open(f"plan_{m}.json"))
    return {"params": r["model"]["params"], "flops_per_token": r["compute"]["flops_per_token"]}
kiln = json.loads(open("kiln_tiny-llama.jsonl").readline())
assert plan("tiny-llama") == {"params": kiln["params"], "flops_per_token": kiln["flops_per_token"]}, (plan("tiny-llama"), kiln)
for m in ["llama3-1b", "qwen2-0.5b", "llama3-8b"]:
    same(m, json.load(open(f"peer_{m}.json")), plan(m), "kiln plan")
for f in ["run.json", "peer_tiny-llama.json"]:
    r = json.load(open(f))
    assert r["peer"] == "pytorch eager" and r["steps"] == 3 and r["tokens_per_s"] > 0, r
    assert math.isfinite(r["loss_first"]) and math.isfinite(r["loss_last"]), r
    if r["model"] == "tiny-llama":
        assert abs(r["loss_first"] - math.log(512)) < 0.1 and r["loss_last"] < r["loss_first"] - 0.1, r
    print(f"{r['model']}: 3 steps on the CPU: {r['tokens_per_s']:.0f} tokens/s, loss {r['loss_first']:.3f} -> {r['loss_last']:.3f}")
PY
echo "PASS"
