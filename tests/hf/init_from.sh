#!/usr/bin/env bash
# tests/hf/init_from.sh -- `kiln train --init-from DIR` (runtime/checkpoint/init_from.h) starts from the weights
# of a model transformers itself created and saved, and from kiln's own checkpoints.
#
# 1. init_from_reference.py makes a GPT2LMHeadModel (save_pretrained), a shard of 8 samples, and
#    transformers' loss on them. kiln's first batch (--micro-batch 8, or 4 on each of 2 dp ranks)
#    is exactly those 8 samples, so kiln's first loss (the JSONL log's first step record, dropout 0,
#    before any update) must equal transformers' loss. Tolerance: 1e-5 relative, as
#    tests/hf/transformers_parity.sh justifies it (same arithmetic, other kernels and summation
#    orders: ~1e-7 relative per operation, ~1e-6 at most in the loss; measured 0). tp 2, pp 2 and
#    ZeRO-3 on 2 ranks are held to the same 1e-5: tp splits each matmul's sum over two ranks and
#    all-reduces it, pp and ZeRO-3 average two equal halves' mean losses -- orders of summation,
#    a few ulps (measured: 6.8e-8 for each). --seq-len 32 against the 64-position model takes wpe's first 32 rows,
#    which is what transformers does with 32-token inputs. The check can fail: the same file with
#    one square matrix transposed (no shape check sees it), and another batch (the windows moved
#    by one token), must both differ from transformers' loss by more than 1e-3, a hundred times
#    the tolerance.
#    `kiln eval --checkpoint hf` reads the same directory (a pretrained model's perplexity before
#    fine-tuning, issue 38): its val loss on the 8 samples equals transformers' loss within the same
#    1e-5 on 1 rank and tp 2 (measured: equal); without --val-data it is refused with one line.
# 2. A kiln checkpoint as --init-from (its save directory, whose latest is taken): the step count
#    restarts at 1, the first loss equals `kiln eval` of those weights on the same 8 samples
#    (1e-6 relative: both kiln forwards on one rank in fp32, but each step visits the 8 samples in
#    its own permuted order, so the mean sums in another order; measured 8.3e-8), and the
#    trajectory is not a resume's (measured: 1.3e-2 apart at the second step):
#    the resume of the same checkpoint has the same loss at its first step and a different one at
#    its second (AdamW's moments and step count start fresh). The learning rate is held constant
#    (--min-lr = --lr, --warmup 0), so the schedule cannot be what differs. A save directory that
#    holds a checkpoint makes the same command resume it (resume wins; the console says so).
# 3. Bad input: one line `kiln: error: ...`, exit 2 (3 for a corrupt checkpoint file, or weights
#    that hold NaN or infinity: refused at load naming the tensor), on 1 rank and under mpirun.
#    kiln eval on such a directory names its own flag, --checkpoint (it said --init-from).
#
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
"$py" "$here/init_from_reference.py" . >/dev/null 2>ref.err || { cat ref.err; fail "init_from_reference.py"; }

# 1. transformers' model, kiln's first loss.
train=("$KILN_BIN" train --device cpu --data data.bin --steps 1 --dropout 0)
"${train[@]}" --init-from hf --micro-batch 8 --log-json one.jsonl >one.out
grep -q "^kiln: weights from hf (--init-from: fresh optimizer, step 0" one.out || { cat one.out; fail "console: weights from"; }
"${train[@]}" --init-from hf --micro-batch 16 --seq-len 32 --log-json t32.jsonl >/dev/null
mpi 2 "${train[@]}" --init-from hf --micro-batch 8 --tp 2 --log-json tp2.jsonl >/dev/null
mpi 2 "${train[@]}" --init-from hf --micro-batch 4 --grad-accum 2 --pp 2 --log-json pp2.jsonl >/dev/null
mpi 2 "${train[@]}" --init-from hf --micro-batch 4 --zero 3 --log-json z3.jsonl >/dev/null
"${train[@]}" --init-from broken --micro-batch 8 --log-json broken.jsonl >/dev/null
"$py" - <<'PY'
import json
ref = json.load(open("reference.json"))
def log(p):
    return [json.loads(l) for l in open(p)]
def first(p):
    return [r for r in log(p) if r["type"] == "step"][0]
def rel(a, b):
    return abs(a - b) / abs(b)
cfg = log("one.jsonl")[0]
assert cfg["type"] == "config" and cfg["config"]["init_from"] == "hf" and cfg["initialised_from"] == "hf", cfg
c = cfg["config"]
assert (c["n_layer"], c["n_head"], c["d_model"], c["seq_len"], c["vocab_size"], c["dropout"]) == (2, 4, 64, 64, 300, 0.0), c
s = first("one.jsonl")
assert s["step"] == 1, s
want = ref["loss_T64"]
print(f"1 rank:    kiln {s['loss']:.9f}, transformers {want:.9f}, relative difference {rel(s['loss'], want):.1e}")
assert rel(s["loss"], want) <= 1e-5
for name, key in (("t32", "loss_T32"), ("tp2", "loss_T64"), ("pp2", "loss_T64"), ("z3", "loss_T64")):
    got, want = first(f"{name}.jsonl")["loss"], ref[key]
    print(f"{name + ':':10s} kiln {got:.9f}, transformers {want:.9f}, relative difference {rel(got, want):.1e}")
    assert rel(got, want) <= 1e-5, name
# The check can fail.
broken, shifted = first("broken.jsonl")["loss"], ref["loss_T64_shift"]
print(f"transposed c_proj: kiln {broken:.6f} vs {ref['loss_T64']:.6f} ({rel(broken, ref['loss_T64']):.1e}); "
      f"another batch: transformers {shifted:.6f} vs kiln {s['loss']:.6f} ({rel(s['loss'], shifted):.1e})")
assert rel(broken, ref["loss_T64"]) > 1e-3 and rel(s["loss"], shifted) > 1e-3
PY

"$KILN_BIN" eval --checkpoint hf --val-data data.bin --micro-batch 8 --eval-batches 1 --log-json eval_hf.jsonl >eval_hf.out
grep -q "^kiln eval: hf (step 0)" eval_hf.out || { cat eval_hf.out; fail "kiln eval of a Hugging Face directory: header"; }
mpi 2 "$KILN_BIN" eval --checkpoint hf --val-data data.bin --micro-batch 8 --eval-batches 1 --tp 2 --log-json eval_hf_tp2.jsonl >/dev/null
"$py" - <<'PY'
import json
want = json.load(open("reference.json"))["loss_T64"]
for name in ("eval_hf", "eval_hf_tp2"):
    got = [json.loads(l) for l in open(f"{name}.jsonl") if '"type":"eval"' in l][-1]["val_loss"]
    assert abs(got - want) <= 1e-5 * want, (name, got, want)
    print(f"{name}: kiln eval of the Hugging Face directory {got:.7f} = transformers' {want:.7f} within 1e-5")
PY
code=0; "$KILN_BIN" eval --checkpoint hf >/dev/null 2>err || code=$?
[ "$code" -eq 2 ] && grep -q "is a Hugging Face model directory, with no run to take --val-data from" err || { cat err; fail "kiln eval hf without --val-data"; }

# 2. A kiln checkpoint as --init-from.
run=("$KILN_BIN" train --device cpu --data data.bin --micro-batch 8 --dropout 0 --lr 1e-3 --min-lr 1e-3 --warmup 0)
"${run[@]}" --init-from hf --steps 6 --stop-at-step 3 --save-dir ck --log-json a.jsonl >/dev/null
"$KILN_BIN" eval --checkpoint ck --val-data data.bin --micro-batch 8 --eval-batches 1 --log-json e.jsonl >/dev/null
"${run[@]}" --init-from ck --steps 3 --log-json b.jsonl >b.out
grep -q "^kiln: weights from ck/step_00000003 (--init-from" b.out || { cat b.out; fail "console: weights from the checkpoint"; }
# The same command as the first run's, without --stop-at-step: the save dir holds a checkpoint, so it resumes.
"${run[@]}" --init-from hf --steps 6 --save-dir ck --log-json r.jsonl >r.out
grep -q "^kiln: --init-from hf not used: resuming ck/step_00000003 (--init-from seeds only a fresh run)" r.out ||
  { cat r.out; fail "console: resume wins over --init-from"; }
"$py" - <<'PY'
import json
def log(p):
    return [json.loads(l) for l in open(p)]
def steps(p):
    return {r["step"]: r["loss"] for r in log(p) if r["type"] == "step"}
def rel(a, b):
    return abs(a - b) / abs(b)
ev = [r for r in log("e.jsonl") if r["type"] == "eval"][-1]["val_loss"]
b, r = steps("b.jsonl"), steps("r.jsonl")
cfg = log("b.jsonl")[0]
assert cfg["start_step"] == 0 and cfg["resumed_from"] is None and cfg["initialised_from"] == "ck/step_00000003", cfg
assert sorted(b) == [1, 2, 3], b
rc = [x for x in log("r.jsonl") if x["type"] == "config"][-1]
assert rc["resumed_from"] == "ck/step_00000003" and rc["initialised_from"] is None, rc
print(f"from the checkpoint: step 1 loss {b[1]:.9f}, kiln eval of it {ev:.9f} ({rel(b[1], ev):.1e})")
assert rel(b[1], ev) <= 1e-6
print(f"resume: step 4 loss {r[4]:.9f} (= init-from's step 1: {rel(r[4], b[1]):.1e}); "
      f"step 5 {r[5]:.6f} vs init-from's step 2 {b[2]:.6f} ({rel(r[5], b[2]):.1e}: fresh AdamW)")
assert rel(r[4], b[1]) <= 1e-6 and rel(r[5], b[2]) > 1e-4
PY

# 3. Bad input.
refuse() {  # refuse NP EXIT REGEX ARGS...
  local np=$1 want=$2 regex=$3; shift 3
  local code=0
  if [ "$np" -eq 1 ]; then "$KILN_BIN" train --device cpu --data data.bin --steps 1 "$@" >/dev/null 2>err || code=$?
  else  # no kill grace (tests/cli/common.sh, expect_refused)
    OMPI_MCA_odls_base_sigkill_timeout=0 mpi "$np" "$KILN_BIN" train --device cpu --data data.bin --steps 1 "$@" >/dev/null 2>err || code=$?
  fi
  [ "$code" -eq "$want" ] && [ "$(grep -c '^kiln: error' err)" -eq 1 ] && grep -Eq "^kiln: error: .*$regex" err ||
    { cat err; fail "$* (want exit $want, one line '$regex')"; }
  echo "refused: $(grep '^kiln: error' err)"
}
edit_config() {  # edit_config DIR PYTHON: a copy of hf/ whose config.json `c` the Python edits
  mkdir -p "$1" && cp hf/model.safetensors "$1/"
  "$py" -c "import json; c = json.load(open('hf/config.json')); $2; json.dump(c, open('$1/config.json', 'w'))"
}
refuse 1 2 "--init-from nowhere: no such directory" --init-from nowhere
# A model type kiln reads neither as GPT-2 nor as the Llama family (tests/hf/init_from_llama.sh).
edit_config neox "c['model_type'] = 'gpt_neox'"
refuse 1 2 "'model_type' is \"gpt_neox\", not \"gpt2\"" --init-from neox
# A GPT-2 file under the Llama family's type: its architectures entry does not match.
edit_config llama "c['model_type'] = 'llama'"
refuse 1 2 "'architectures' names \"GPT2LMHeadModel\"; kiln reads LlamaForCausalLM weights" --init-from llama
refuse 1 2 "--n-layer 4 contradicts its config.json \(n_layer 2\)" --init-from hf --n-layer 4
refuse 1 2 "--model gpt2-124m's n-layer 12 contradicts" --init-from hf --model gpt2-124m
refuse 1 2 "--seq-len 128 is longer than its n_positions 64" --init-from hf --seq-len 128
edit_config invidx "c['scale_attn_by_inverse_layer_idx'] = True"
refuse 1 2 "'scale_attn_by_inverse_layer_idx' is true" --init-from invidx
edit_config relu "c['activation_function'] = 'relu'"
refuse 1 2 "'activation_function' is \"relu\"" --init-from relu
edit_config eps "c['layer_norm_epsilon'] = 1e-6"
refuse 1 2 "'layer_norm_epsilon' is 1e-06" --init-from eps
edit_config drops "c['attn_pdrop'] = 0.2"
refuse 1 2 "dropouts differ .* give --dropout P" --init-from drops
"$KILN_BIN" train --device cpu --data data.bin --steps 0 --init-from drops --dropout 0.1 >/dev/null  # --dropout wins
edit_config wide "c['n_embd'] = 128"
refuse 1 2 "--init-from wide: checkpoint tensor 'transformer.wte.weight' has shape \[300, 64\], this model expects \[300, 128\]" --init-from wide
refuse 2 2 "--init-from wide: checkpoint tensor" --init-from wide --tp 2
# A config.json that disagrees with its weights is found from the safetensors header, before the
# model is built (n_layer 100000 over a file of 2 blocks took 74 s and 20 GB to be refused; 1e9
# ended in the OOM killer): one line, at once. The limit on address space turns a regression into
# a failed allocation here rather than the machine's OOM killer.
edit_config deep "c['n_layer'] = 1000000000"
(ulimit -v 12000000; refuse 1 2 "--init-from deep: config.json says n_layer 1000000000 but model.safetensors holds 2 block\(s\)" --init-from deep)
edit_config vocab "c['vocab_size'] = 400"
refuse 1 2 "--init-from vocab: checkpoint tensor 'transformer.wte.weight' has shape \[300, 64\], this model expects \[400, 64\]" --init-from vocab
# A tokenizer with more ids than the model's vocabulary: one answer, that it does not fit the
# model -- not "give --vocab-size 320 or more", which --init-from then refuses (issue 38, defect 7).
mkdir -p bpe && "$py" "$here/make_tokenizer.py" bpe >/dev/null 2>bpe.err || { cat bpe.err; fail "make_tokenizer.py"; }
refuse 1 2 "the tokenizer bpe/tok/tokenizer.json has 320 ids, more than the 300 of the model --init-from hf starts from .* does not fit that model" \
  --init-from hf --tokenizer bpe/tok/tokenizer.json
! grep -q -- "--vocab-size 320" err || { cat err; fail "advises --vocab-size, which --init-from refuses"; }
mkdir -p nocfg && cp hf/model.safetensors nocfg/
refuse 1 2 "--init-from nocfg: no config.json there" --init-from nocfg
mkdir -p bin && cp hf/config.json bin/ && : >bin/pytorch_model.bin
refuse 1 2 "holds pytorch_model.bin but no model.safetensors" --init-from bin
cp -r ck/step_00000003 corrupt
"$py" -c "
f = open('corrupt/model.safetensors', 'r+b'); f.seek(-4, 2); b = f.read(1); f.seek(-4, 2); f.write(bytes([b[0] ^ 1]))"
refuse 2 3 "--init-from corrupt: model.safetensors is corrupt" --init-from corrupt --zero 3 --micro-batch 4
cp -r hf nanhf && python3 "$here/../cli/plant_nonfinite.py" nanhf transformer.h.1.attn.c_attn.weight >/dev/null
refuse 2 3 "--init-from nanhf: tensor 'transformer.h.1.attn.c_attn.weight' of model.safetensors holds NaN or infinity" --init-from nanhf --tp 2
eval_refused() {  # eval_refused EXIT REGEX DIR: kiln eval --checkpoint DIR exits EXIT with one matching line
  local code=0
  "$KILN_BIN" eval --checkpoint "$3" --val-data data.bin --device cpu >/dev/null 2>err || code=$?
  [ "$code" -eq "$1" ] && [ "$(grep -c '^kiln: error' err)" -eq 1 ] && grep -Eq "^kiln: error: $2" err ||
    { cat err; fail "eval --checkpoint $3 (want exit $1, one line '$2')"; }
  echo "refused: $(grep '^kiln: error' err)"
}
eval_refused 3 "--checkpoint nanhf: tensor 'transformer.h.1.attn.c_attn.weight' of model.safetensors holds NaN or infinity" nanhf
eval_refused 2 "--checkpoint wide: checkpoint tensor 'transformer.wte.weight' has shape" wide
echo PASS
