#!/usr/bin/env bash
# tests/hf/init_from_llama.sh -- `kiln train --init-from DIR` and `kiln eval --checkpoint DIR` on
# Llama-family directories transformers itself saved (issue 35; runtime/checkpoint/hf_llama.h).
#
# init_from_llama_reference.py saves LlamaForCausalLM (untied), the same sharded (an index and six
# shards), Qwen2ForCausalLM (q/k/v biases, tied), LlamaForCausalLM with Llama-3.1's rope scaling,
# MistralForCausalLM with a 32-token sliding window and MixtralForCausalLM (4 SwiGLU experts, top-2;
# also at ep 2 on 2 ranks), with transformers' loss on kiln's first
# batch (--micro-batch 8: the shard's 8 samples, tests/hf/init_from.sh says why the order does not
# matter). kiln's first loss (dropout 0, before any update) must equal transformers' within a
# relative 1e-5 (same arithmetic, other kernels and summation orders; measured 0 to 6.8e-8): on one
# process for each, under ZeRO-3 on 2 ranks for Qwen2, and for Mistral at --seq-len 32, where its
# window is inert, and at its 64 positions, where the window acts (one process, cp 2 -- the band
# kept across the rank's chunks and the gathered keys --, tp 2 + sp and pp 2).
# `kiln eval --checkpoint llama` gives the same loss. One AdamW step equals PyTorch's, and greedy
# kiln sample equals transformers' generate (with and without the KV cache, tp 2); kiln's own
# checkpoints of the family load in transformers (one file, and sharded with an index; Mixtral's
# experts one by one, as save_pretrained writes them), whose loss on them is the one the saving
# run itself computed with those weights -- not kiln's reload of the same files, which would read
# an export's mistake (gate and up swapped) as the export wrote it. Bad input, one line and exit 2 each:
# Mixtral's router jitter, a rope type kiln lacks (yarn), attention biases without MLP ones, a layer count the
# files do not hold (3, and 1e9: bounded by the files before anything is built), an unexpected
# tensor, a misshapen one; and an index naming a shard outside the directory (a corrupt
# file: exit 3, as for kiln's own), and weights that hold NaN or infinity (exit 3, naming the
# tensor and its shard: --init-from on 2 ranks, kiln eval, kiln sample). kiln eval and kiln sample
# name their own flag, --checkpoint, in their errors on such a directory (they said --init-from).
# Skipped (exit 77) when KILN_PYTHON cannot import transformers and safetensors.
set -euo pipefail
: "${KILN_BIN:?KILN_BIN must point at the kiln binary}"
here=$(cd "$(dirname "$0")" && pwd)
py="${KILN_PYTHON:-}"
if [ -z "$py" ] || ! "$py" -c 'import transformers, safetensors' >/dev/null 2>&1; then
  echo "SKIP: transformers/safetensors not importable by KILN_PYTHON='${py}' (launch/setup.sh installs them into .venv)"
  exit 77
fi
source "$here/../cli/common.sh"
: "${MPIEXEC:=mpirun}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
cd "$work"
"$py" "$here/init_from_llama_reference.py" . >/dev/null 2>ref.err || { cat ref.err; fail "init_from_llama_reference.py"; }

train=("$KILN_BIN" train --device cpu --data data.bin --steps 1 --dropout 0)
for m in llama llama_sharded qwen2 llama31 mixtral; do
  "${train[@]}" --init-from "$m" --micro-batch 8 --log-json "$m.jsonl" >/dev/null
done
mpi 2 "${train[@]}" --init-from mixtral --micro-batch 4 --ep 2 --log-json mixtral_ep2.jsonl >/dev/null
"${train[@]}" --init-from mistral_window --seq-len 32 --micro-batch 16 --log-json mistral_window.jsonl >/dev/null
"${train[@]}" --init-from mistral_window --micro-batch 8 --log-json mistral_window_64.jsonl >/dev/null
mpi 2 "${train[@]}" --init-from mistral_window --micro-batch 8 --cp 2 --log-json mistral_window_cp2.jsonl >/dev/null
mpi 2 "${train[@]}" --init-from mistral_window --micro-batch 8 --tp 2 --sp --log-json mistral_window_tpsp.jsonl >/dev/null
mpi 2 "${train[@]}" --init-from mistral_window --micro-batch 4 --grad-accum 2 --pp 2 --log-json mistral_window_pp2.jsonl >/dev/null
mpi 2 "${train[@]}" --init-from qwen2 --micro-batch 4 --zero 3 --log-json qwen2_z3.jsonl >/dev/null
"$KILN_BIN" eval --checkpoint llama --val-data data.bin --micro-batch 8 --eval-batches 1 --device cpu >eval.txt 2>&1 || { cat eval.txt; fail "kiln eval"; }
"$py" - <<'PY'
import json, re
ref = json.load(open("reference.json"))
first = lambda n: next(json.loads(l) for l in open(f"{n}.jsonl") if json.loads(l)["type"] == "step")["loss"]
for name, want in (("llama", "llama"), ("llama_sharded", "llama"), ("qwen2", "qwen2"), ("llama31", "llama31"),
                   ("mistral_window", "mistral_window"), ("mistral_window_64", "mistral_window_64"),
                   ("mistral_window_cp2", "mistral_window_64"), ("mistral_window_tpsp", "mistral_window_64"),
                   ("mistral_window_pp2", "mistral_window_64"),
                   ("qwen2_z3", "qwen2"), ("mixtral", "mixtral"),
                   ("mixtral_ep2", "mixtral")):
    got = first(name)
    rel = abs(got - ref[want]) / ref[want]
    print(f"{name}: kiln's first loss {got:.7f}, transformers' {ref[want]:.7f} (relative {rel:.1e})")
    assert rel <= 1e-5, (name, got, ref[want])
m = re.search(r"val loss ([0-9.]+)", open("eval.txt").read())
assert m and abs(float(m.group(1)) - ref["llama"]) <= 1e-4 * ref["llama"], (m and m.group(1), ref["llama"])
print(f"kiln eval --checkpoint llama: val loss {m.group(1)} (printed to 4 decimals)")
PY

# One optimizer step from the same state equals a plain PyTorch step on the transformers model:
# kiln's second loss (constant lr, no warm-up, no clipping, AdamW with weight decay on the
# matrices) against llama_step.py's loss after torch.optim.AdamW's step on the same batch, within
# the same 1e-5 (measured: equal for Llama, Qwen2 and Llama-3.1's scaling).
O=(--lr 1e-3 --warmup 0 --lr-schedule constant --grad-clip 0 --weight-decay 0.1 --beta1 0.9 --beta2 0.95 --adam-eps 1e-8)
for m in llama qwen2 llama31 mixtral; do
  # Mixtral: the router's auxiliary loss off, as the plain PyTorch step has none.
  "$KILN_BIN" train --device cpu --data data.bin --steps 2 --dropout 0 --init-from "$m" --micro-batch 8 "${O[@]}" \
    $([ "$m" = mixtral ] && echo --moe-aux-loss-coef 0) --log-json "step_$m.jsonl" >/dev/null
  "$py" "$here/llama_step.py" "$m" data.bin 1e-3 0.1 0.9 0.95 1e-8 2>/dev/null | tail -n 1 >"step_$m.ref"
done
"$py" - <<'PY'
import json
for m in ("llama", "qwen2", "llama31", "mixtral"):
    steps = [r for r in map(json.loads, open(f"step_{m}.jsonl")) if r["type"] == "step"]
    ref = json.loads(open(f"step_{m}.ref").read())
    rel = abs(steps[1]["loss"] - ref["loss_after"]) / ref["loss_after"]
    print(f"{m}: loss after one AdamW step, kiln {steps[1]['loss']:.7f}, PyTorch {ref['loss_after']:.7f} (relative {rel:.1e})")
    assert rel <= 1e-5 and steps[1]["loss"] < steps[0]["loss"], (m, steps[1]["loss"], ref)
PY

# Out: kiln's checkpoints of the family are transformers' layout. Two steps from Llama (written in
# shards: KILN_TEST_HF_SHARD_BYTES=100000 makes the 0.5 MB model a several-file one with its index)
# and from Qwen2 (one file, tied), Llama-3.1's scaling (its rope keys) and Mixtral, the first step's
# weights saved (--save-every 1); transformers loads that step directory with from_pretrained (no
# missing or unexpected key) and its loss on the 8 samples equals the loss the run logged at its
# second step -- those weights, the same 8 samples -- within the same 1e-5.
KILN_TEST_HF_SHARD_BYTES=100000 "$KILN_BIN" train --device cpu --data data.bin --steps 2 --dropout 0 --init-from llama \
  --micro-batch 8 "${O[@]}" --save-dir out_llama --save-every 1 --log-json out_llama.jsonl >/dev/null
for m in qwen2 llama31 mixtral; do
  "$KILN_BIN" train --device cpu --data data.bin --steps 2 --dropout 0 --init-from "$m" --micro-batch 8 "${O[@]}" \
    --save-dir "out_$m" --save-every 1 --log-json "out_$m.jsonl" >/dev/null
done
"$py" - <<'PY'
import json, os, struct
os.environ["TRANSFORMERS_VERBOSITY"] = "error"
import torch
from transformers import AutoModelForCausalLM
raw = open("data.bin", "rb").read()
n = struct.unpack("<256i", raw[:1024])[2]
tokens = torch.tensor(struct.unpack(f"<{n}H", raw[1024:1024 + 2 * n]), dtype=torch.long)
x = torch.stack([tokens[i * 64:i * 64 + 65] for i in range(8)])
for m in ("llama", "qwen2", "llama31", "mixtral"):
    ck = f"out_{m}/step_00000001"
    files = sorted(os.listdir(ck))
    if m == "llama":
        assert "model.safetensors.index.json" in files and sum(f.startswith("model-0") for f in files) > 1, files
    else:
        assert "model.safetensors" in files and "model.safetensors.index.json" not in files, files
    model, info = AutoModelForCausalLM.from_pretrained(ck, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=x[:, :64]).logits.float()
    hf = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)).item()
    kiln = next(r for r in map(json.loads, open(f"out_{m}.jsonl")) if r["type"] == "step" and r["step"] == 2)["loss"]
    rel = abs(hf - kiln) / hf
    shards = sum(f.startswith("model") and f.endswith(".safetensors") for f in files)
    print(f"{m}: kiln's step-1 checkpoint ({shards} safetensors file(s)) loaded by transformers: loss {hf:.7f}, "
          f"the run's own at step 2 {kiln:.7f} ({rel:.1e})")
    assert rel <= 1e-5, (m, hf, kiln)
PY

# Greedy kiln sample equals transformers' generate(do_sample=False) token for token, with and
# without the KV cache and at tp 2: kiln starts every prompt with <|endoftext|> (as the
# text-generation pipeline's prefix does), so generate gets [eot] + kiln's prompt ids.
G=(sample --device cpu --temperature 0 --max-new-tokens 24 --prompt "the quick" --json)
for m in llama qwen2; do
  "$KILN_BIN" "${G[@]}" --checkpoint "$m" 2>/dev/null | tail -n 1 >"gen_$m.json"
  "$KILN_BIN" "${G[@]}" --checkpoint "$m" --no-kv-cache 2>/dev/null | tail -n 1 >"gen_${m}_nocache.json"
  mpi 2 "$KILN_BIN" "${G[@]}" --checkpoint "$m" --tp 2 2>/dev/null | tail -n 1 >"gen_${m}_tp2.json"
done
"$py" - <<'PY'
import json, os
os.environ["TRANSFORMERS_VERBOSITY"] = "error"
import torch
from transformers import AutoModelForCausalLM
for m in ("llama", "qwen2"):
    k = json.loads(open(f"gen_{m}.json").read())
    model = AutoModelForCausalLM.from_pretrained(m, dtype=torch.float32).eval()
    prompt = [0] + k["prompt_ids"]
    ids = torch.tensor([prompt])  # the attention mask given: else generate takes the leading 0 for padding
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False, eos_token_id=None,
                         pad_token_id=0)
    want = out[0, len(prompt):].tolist()
    for variant in ("", "_nocache", "_tp2"):
        got = json.loads(open(f"gen_{m}{variant}.json").read())["ids"]
        # kiln ends a sample at <|endoftext|> (id 0), which generate (eos off here) goes past.
        assert got == want[:len(got)] and (len(got) == len(want) or want[len(got)] == 0), (m, variant, got, want)
    print(f"{m}: greedy kiln sample = transformers' generate, {len(got)} tokens"
          f"{'' if len(got) == len(want) else ' up to its end-of-text'} (cache, no cache, tp 2)")
PY

# Bad input.
refused() {  # refused NAME REGEX [CODE]: kiln train --init-from NAME exits CODE (2) with one matching line
  local code=0 want=${3:-2}
  "${train[@]}" --init-from "$1" --micro-batch 8 >/dev/null 2>err.txt || code=$?
  [ "$code" -eq "$want" ] && [ "$(grep -c 'kiln: error' err.txt)" -eq 1 ] && grep -Eq "kiln: error: .*$2" err.txt || { cat err.txt; fail "$1: want exit $want, '$2'"; }
  echo "refused: $(grep 'kiln: error' err.txt)"
}
edit() {  # edit NAME FROM PYTHON: a copy of model FROM with config.json changed by PYTHON (c: the dict)
  cp -r "$2" "$1"
  "$py" -c "import json; c = json.load(open('$1/config.json')); $3; json.dump(c, open('$1/config.json', 'w'))"
}
edit jitter mixtral "c['router_jitter_noise'] = 0.1"
refused jitter "'router_jitter_noise' is 0.1; kiln's router has no jitter"
edit yarn llama "c['rope_parameters'] = {'rope_type': 'yarn', 'rope_theta': 10000.0, 'factor': 4.0}"
refused yarn "rope_type \"yarn\"; kiln implements \"default\" and \"llama3\""
edit attn_bias llama "c['attention_bias'] = True"
refused attn_bias "'attention_bias' is true and 'mlp_bias' false"
edit layers3 llama "c['num_hidden_layers'] = 3"
refused layers3 "says num_hidden_layers 3 but the model's files hold 2 layer\\(s\\)"
edit huge llama "c['num_hidden_layers'] = 1000000000"  # untrusted: bounded by the files before anything is built
refused huge "says num_hidden_layers 1000000000 but the model's files hold 2 layer\\(s\\)"
cp -r llama extra
"$py" -c "
from safetensors.torch import load_file, save_file
import torch
t = load_file('extra/model.safetensors'); t['model.extra.weight'] = torch.zeros(4)
save_file(t, 'extra/model.safetensors', metadata={'format': 'pt'})"
refused extra "unexpected tensor 'model.extra.weight'"
edit wide llama "c['intermediate_size'] = 192"
refused wide "tensor 'model.layers.0.mlp.gate_proj.weight' has shape \\[176, 64\\], this model expects \\[192, 64\\]"
cp -r llama_sharded escape
"$py" -c "import json; p = 'escape/model.safetensors.index.json'; j = json.load(open(p)); k = next(iter(j['weight_map'])); j['weight_map'][k] = '../x.safetensors'; json.dump(j, open(p, 'w'))"
refused escape "maps to \"../x.safetensors\", not a file name of the directory" 3  # a corrupt file: exit 3
# kiln eval and kiln sample on such a directory: their own flag in the error.
code=0; "$KILN_BIN" eval --checkpoint yarn --val-data data.bin --device cpu >/dev/null 2>err.txt || code=$?
[ "$code" -eq 2 ] && grep -q "^kiln: error: --checkpoint yarn: config.json's 'rope_parameters' has rope_type" err.txt || { cat err.txt; fail "eval yarn"; }
code=0; "$KILN_BIN" sample --checkpoint yarn --device cpu >/dev/null 2>err.txt || code=$?
[ "$code" -eq 2 ] && grep -q "^kiln: error: --checkpoint yarn: config.json's 'rope_parameters' has rope_type" err.txt || { cat err.txt; fail "sample yarn"; }
echo "refused (kiln eval, kiln sample): $(grep 'kiln: error' err.txt)"
# Weights that hold NaN or infinity: refused at load, naming the tensor and its file.
cp -r llama_sharded nan_sharded
shard=$(python3 "$here/../cli/plant_nonfinite.py" nan_sharded model.layers.1.mlp.up_proj.weight | cut -d' ' -f1)
code=0; mpi 2 "${train[@]}" --init-from nan_sharded --micro-batch 4 --zero 3 >/dev/null 2>err.txt || code=$?
[ "$code" -eq 3 ] && [ "$(grep -c 'kiln: error' err.txt)" -eq 1 ] &&
  grep -q "kiln: error: --init-from nan_sharded: tensor 'model.layers.1.mlp.up_proj.weight' of $shard holds NaN or infinity" err.txt ||
  { cat err.txt; fail "NaN in a shard, 2 ranks"; }
echo "refused (2 ranks): $(grep 'kiln: error' err.txt)"
code=0; "$KILN_BIN" eval --checkpoint nan_sharded --val-data data.bin --device cpu >/dev/null 2>err.txt || code=$?
[ "$code" -eq 3 ] && grep -q "^kiln: error: --checkpoint nan_sharded: tensor 'model.layers.1.mlp.up_proj.weight' of $shard holds NaN" err.txt ||
  { cat err.txt; fail "eval: NaN in a shard"; }
cp -r llama nan_llama && python3 "$here/../cli/plant_nonfinite.py" nan_llama model.norm.weight inf >/dev/null
code=0; "$KILN_BIN" sample --checkpoint nan_llama --device cpu >/dev/null 2>err.txt || code=$?
[ "$code" -eq 3 ] && [ "$(wc -l <err.txt)" -eq 1 ] && grep -q "^kiln: error: kiln sample: nan_llama: tensor 'model.norm.weight' of model.safetensors holds NaN" err.txt ||
  { cat err.txt; fail "sample: infinity in the weights"; }
echo "refused (kiln sample): $(cat err.txt)"
echo PASS
