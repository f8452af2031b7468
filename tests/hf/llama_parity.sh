#!/usr/bin/env bash
# tests/hf/llama_parity.sh -- kiln's Llama-family decoder computes what transformers' does
# (issue 35's ground truth, the architecture half): the same weights (kiln's, mapped by
# check_llama.py) and tokens give the same logits and loss in LlamaForCausalLM (tiny-llama:
# rotary positions, RMSNorm, SwiGLU, GQA 4 over 2, no biases, untied output layer), in
# Qwen2ForCausalLM (q/k/v biases, tied, eps 1e-6, base 1e6), in Qwen3ForCausalLM (tiny-qwen3: heads
# 64 wide on d 128, so the attention is 256 wide, and the per-head q / k RMSNorms) and in LlamaForCausalLM with
# Llama-3.1's rotary scaling (an original context of 32, so T = 128 spans its three bands).
# Tolerance: a relative 1e-5 on the loss and on the largest logit difference (over the largest
# logit), fp32 on the CPU -- the arithmetic is the same, the kernels are not (at::rms_norm against
# transformers' written-out RMSNorm, fused SDPA against eager attention, the rotary applied
# through other ops), which moves a 4-layer fp32 forward by ~1e-6 at most. And the check can fail:
# layer 0's gate and up swapped must move the loss by more than 1e-3.
# Skipped (exit 77) when KILN_PYTHON cannot import transformers.
set -euo pipefail
: "${KILN_LLAMA_FIXTURE:?KILN_LLAMA_FIXTURE must point at the kiln_llama_fixture program}"
here=$(cd "$(dirname "$0")" && pwd)
py="${KILN_PYTHON:-}"
if [ -z "$py" ] || ! "$py" -c 'import transformers, safetensors' >/dev/null 2>&1; then
  echo "SKIP: transformers/safetensors not importable by KILN_PYTHON='${py}' (launch/setup.sh installs them into .venv)"
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-llama.XXXXXX")
trap 'rm -rf "$work"' EXIT
for arch in llama qwen2 llama31 qwen3; do
  mkdir -p "$work/$arch"
  "$KILN_LLAMA_FIXTURE" "$work/$arch" "$arch" >/dev/null
  "$py" "$here/check_llama.py" "$work/$arch" >"$work/$arch.json"
  "$py" - "$work/$arch.json" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(f"{r['arch']}: kiln loss {r['kiln_loss']:.7f}, transformers {r['loss']:.7f} (relative {r['loss_rel']:.1e}); "
      f"logits within {r['logits_max_rel']:.1e}")
assert r["loss_rel"] <= 1e-5 and r["logits_max_rel"] <= 1e-5, r
PY
done
"$py" "$here/check_llama.py" "$work/llama" --break gate-up >"$work/broken.json"
"$py" - "$work/broken.json" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(f"gate and up swapped in layer 0: loss relative difference {r['loss_rel']:.1e}")
assert r["loss_rel"] > 1e-3, r
PY
echo PASS
