#!/usr/bin/env bash
# tests/hf/tokenizer.sh -- a real tokenizer, and the tokenizer travels with the weights (issue 20,
# part 3): `kiln prep --tokenizer` / `--vocab --merges`, training on BPE shards, and checkpoints
# that transformers' AutoTokenizer and text-generation pipeline take as they are.
#
# 1. make_tokenizer.py trains a byte-level BPE (320 ids) on four UTF-8 documents with Hugging
#    Face's tokenizers. kiln prep encodes them with its tokenizer.json, and again with its
#    vocab.json + merges.txt: the shards are byte-identical, and their ids are exactly the
#    library's own encoding of each document after <|endoftext|>. tokenizer.json lies beside them.
# 2. A tiny model (--vocab-size 320: the tokenizer's ids, nothing the tokenizer cannot decode)
#    trains on the BPE shards: the loss falls below half of its start. The config record names the
#    tokenizer; the checkpoint holds tokenizer.json (the prep's, byte for byte),
#    tokenizer_config.json, and config.json with bos = eos = the tokenizer's end-of-text id.
# 3. transformers, unchanged: AutoTokenizer.from_pretrained(checkpoint) encodes as the library
#    does; pipeline("text-generation", model=checkpoint) continues a prompt greedily, and its text
#    is exactly the decoding of GPT2LMHeadModel's greedy ids (tests/hf/greedy_generate.py, the full
#    forward each step) on end-of-text + the prompt's ids (config.json's prefix). kiln sample
#    --temperature 0 on 1 rank and on tp 2 gives the same ids from the same context, and the
#    pipeline's text, and the pipeline's calls warn of nothing (a max_length in
#    generation_config.json made every call that gives max_new_tokens warn: issue 48); README's
#    pipeline line with transformers' defaults stays within the context (generation_config.json's
#    max_new_tokens); kiln eval on 1 rank and tp 2 agree within 1e-5 relative (tp splits
#    each matmul's sum over two ranks: a few ulps, as tests/cli/eval.sh states).
# 4. The byte-level default travels too: a synthetic run's checkpoint and a run on `kiln prep`'s
#    byte-level shards carry the byte-level tokenizer.json; AutoTokenizer encodes UTF-8 text to its
#    bytes; config.json's eos is 256; the pipeline runs on it. --sample-every decodes BPE samples.
# 5. Bad input, one line and exit 2: a missing tokenizer file, a WordPiece tokenizer, a tokenizer
#    without <|endoftext|>, --vocab without --merges, --tokenizer with --vocab, text that is not
#    UTF-8, no Python for the tokenizers library, a tokenizer larger than --vocab-size, and
#    --sample-every on data whose tokenizer is unknown.
#
# Skipped (exit 77) when KILN_PYTHON cannot import transformers and tokenizers.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../cli/common.sh"
need_python transformers tokenizers
: "${MPIEXEC:=mpirun}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
refused() {  # refused REGEX ARGS...: kiln ARGS on one process exits 2 with one matching error line
  local regex=$1; shift
  local code=0
  "$KILN_BIN" "$@" >/dev/null 2>"$work/err" || code=$?
  [ "$code" -eq 2 ] && [ "$(grep -c . "$work/err")" -eq 1 ] && grep -Eq "^kiln: error: .*$regex" "$work/err" ||
    { cat "$work/err" >&2; fail "$* (want exit 2 and one line '$regex', got exit $code)"; }
  echo "refused: $(cat "$work/err")"
}
cd "$work"
"$py" "$here/make_tokenizer.py" . 2>make.err || { cat make.err; fail "make_tokenizer.py"; }

# 1. kiln prep through the tokenizers library, two ways; the library's ids.
"$KILN_BIN" prep --input "doc*.txt" --out bpe --tokenizer tok/tokenizer.json --val-tokens 2000 >prep.out
cat prep.out
grep -q "^kiln prep: tokenizer bpe (320 ids, end-of-text 0) in bpe/tokenizer.json" prep.out || fail "prep's tokenizer line"
"$KILN_BIN" prep --input "doc*.txt" --out bpe2 --vocab tok/vocab.json --merges tok/merges.txt --val-tokens 2000 >/dev/null
for f in val_000000.bin train_000000.bin; do cmp "bpe/$f" "bpe2/$f" || fail "--vocab/--merges shards differ from --tokenizer's ($f)"; done
cmp bpe/tokenizer.json tok/tokenizer.json || fail "bpe/tokenizer.json is not the tokenizer prep was given"
# The same documents as JSONL and as one file with --separator, through the tokenizers library:
# the same shards (tools/bpe_tokenizer.py splits them by data/prep.cpp's rules).
"$py" -c "
import glob, json
docs = [open(p, encoding='utf-8').read() for p in sorted(glob.glob('doc*.txt'))]
open('docs.jsonl', 'w', encoding='utf-8').write(''.join(json.dumps({'text': t}) + '\n' for t in docs))
open('docs.sep', 'w', encoding='utf-8').write('@@@'.join(docs))"
KILN_TEST_PREP_PROGRESS_S=0 "$KILN_BIN" prep --input docs.jsonl --out bpe_jsonl --tokenizer tok/tokenizer.json --val-tokens 2000 >/dev/null 2>progress.err
grep -q "^kiln prep: 1/1 file(s), " progress.err || { cat progress.err; fail "the BPE path's progress line (the tool's per-file line, read as it came)"; }
"$KILN_BIN" prep --input docs.sep --separator @@@ --out bpe_sep --tokenizer tok/tokenizer.json --val-tokens 2000 >/dev/null
for v in bpe_jsonl bpe_sep; do
  for f in val_000000.bin train_000000.bin; do cmp "bpe/$f" "$v/$f" || fail "$v: $f differs from one file per document"; done
done
echo "BPE: JSONL and --separator documents give the shards of one file per document"
"$py" - <<'PY'
import glob, struct
from tokenizers import Tokenizer
tok = Tokenizer.from_file("tok/tokenizer.json")
eot = tok.token_to_id("<|endoftext|>")
want = []
for path in sorted(glob.glob("doc*.txt")):
    want += [eot] + tok.encode(open(path, encoding="utf-8").read(), add_special_tokens=False).ids
got = []
for path in ["bpe/val_000000.bin", "bpe/train_000000.bin"]:
    data = open(path, "rb").read()
    magic, version, n = struct.unpack("<3i", data[:12])
    assert magic == 20240520 and version == 1, (magic, version)
    got += list(struct.unpack(f"<{n}H", data[1024:]))
assert got == want, "the shards are not the library's encoding"
text = open("doc0.txt", encoding="utf-8").read()
print(f"prep: {len(got)} ids = tokenizers' encoding of 4 documents ({len(text.encode())} bytes -> "
      f"{len(tok.encode(text).ids)} ids for doc0)")
PY

# 2. Training on BPE shards; the checkpoint carries the tokenizer.
model=(--device cpu --n-layer 2 --seq-len 64 --vocab-size 320 --micro-batch 8 --lr 3e-3)
"$KILN_BIN" train "${model[@]}" --steps 100 --data "bpe/train_*.bin" --val-data bpe/val_000000.bin --save-dir ck \
  --log-json train.jsonl --sample-every 50 >train.out
[ "$(grep -c '^sample at step' train.out)" -eq 2 ] || { cat train.out; fail "--sample-every 50 over 100 steps: want 2 samples"; }
jsonl_check train.jsonl '
c = records[0]
assert c["tokenizer"] == {"kind": "bpe", "vocab_size": 320, "eot": 0, "source": "bpe/tokenizer.json"}, c["tokenizer"]
s = [r for r in records if r["type"] == "step"]
first, last = s[0]["loss"], s[-1]["loss"]
print(f"BPE shards: loss {first:.3f} -> {last:.3f} in {len(s)} steps")
assert s[-1]["loss"] < 0.5 * s[0]["loss"]
samples = [r for r in records if r["type"] == "sample"]
assert len(samples) == 2 and all(len(x["text"]) > 0 for x in samples), samples
'
ckpt=ck/step_00000100
cmp "$ckpt/tokenizer.json" tok/tokenizer.json || fail "the checkpoint's tokenizer.json is not the data's"
[ -f "$ckpt/tokenizer_config.json" ] || fail "no tokenizer_config.json in the checkpoint"

# 3. transformers on the checkpoint as it is; kiln sample and kiln eval on 1 rank and tp 2.
prompt="the quick brown"
"$KILN_BIN" sample --checkpoint ck --prompt "$prompt" --temperature 0 --max-new-tokens 24 --json >s1.json
mpi 2 "$KILN_BIN" sample --checkpoint ck --prompt "$prompt" --temperature 0 --max-new-tokens 24 --tp 2 --json >s2.json
"$py" - "$ckpt" "$prompt" "$here/greedy_generate.py" <<'PY'
import json, logging, subprocess, sys, warnings
import transformers
from transformers import AutoTokenizer, pipeline
from tokenizers import Tokenizer
transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_warning()
said = []  # what transformers warns of
class Keep(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage())
logging.getLogger("transformers").addHandler(Keep())
ckpt, prompt, greedy = sys.argv[1:4]
lib = Tokenizer.from_file("tok/tokenizer.json")
cfg = json.load(open(f"{ckpt}/config.json"))
assert cfg["bos_token_id"] == cfg["eos_token_id"] == 0 == lib.token_to_id("<|endoftext|>"), cfg
at = AutoTokenizer.from_pretrained(ckpt)
text = open("doc1.txt", encoding="utf-8").read()[:2000]
assert at.encode(text) == lib.encode(text, add_special_tokens=False).ids, "AutoTokenizer encodes otherwise"
assert at.eos_token_id == 0 and at.decode(at.encode(text)) == text
ids = at.encode(prompt)
def transformers_greedy(context, n):
    out = subprocess.run([sys.executable, greedy, ckpt, json.dumps(context), str(n), "320"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["ids"]
# The pipeline, unchanged: its greedy text is the decoding of the model's greedy ids from the
# context kiln sample gives it, end-of-text then the prompt (config.json's prefix).
assert cfg["prefix"] == "<|endoftext|>", cfg.get("prefix")
gen = pipeline("text-generation", model=ckpt)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    said.clear()
    got = gen(prompt, max_new_tokens=24, do_sample=False)[0]["generated_text"]
    said += [str(x.message) for x in w]
assert not said, said
hf = transformers_greedy([0] + ids, 24)
want = prompt + at.decode(hf)
assert got == want, (got, want)
print(f"pipeline: {got!r}")
# kiln sample: transformers' greedy ids from end-of-text + the prompt, on 1 rank and on tp 2;
# its text is the pipeline's greedy text (README says so; issue 38, defect 4).
s1, s2 = json.load(open("s1.json")), json.load(open("s2.json"))
assert s1["prompt_ids"] == ids, (s1["prompt_ids"], ids)
assert s1["ids"] == hf == s2["ids"], (s1["ids"], hf, s2["ids"])
assert s1["text"] == at.decode(hf) == s2["text"], (s1["text"], at.decode(hf))
assert prompt + s1["text"] == got, (prompt + s1["text"], got)
print(f"kiln sample (1 rank, tp 2) = transformers' greedy ids = the pipeline's text: {prompt!r} + {s1['text']!r}")
# README's line as written, transformers' defaults (sampling, no length given): it stops within
# the context (generation_config.json's max_new_tokens, a quarter of it; the pipeline's default
# of 256 ran past the 64 positions: IndexError), greedily too, and for a prompt of 3/4 of it.
g = json.load(open(f"{ckpt}/generation_config.json"))
assert g["max_new_tokens"] == 16 and "max_length" not in g and g["eos_token_id"] == g["pad_token_id"] == g["bos_token_id"] == 0, g
out = gen(prompt)[0]["generated_text"]
assert isinstance(out, str) and out.startswith(prompt), out
full = gen(prompt, do_sample=False, return_tensors=True)[0]["generated_token_ids"]
assert full[0] == 0 and full[1:len(ids) + 1] == ids and len(full) <= 64, (full, ids)
long = prompt
while len(at.encode(long + " " + prompt)) <= 47:
    long += " " + prompt
full = gen(long, do_sample=False, return_tensors=True)[0]["generated_token_ids"]
assert len(full) <= 64, len(full)
print(f"pipeline(prompt) with transformers' defaults: ran; greedy to {len(full)} ids from a prompt of "
      f"{len(at.encode(long))} (end-of-text first), within the context of 64")
PY
"$KILN_BIN" eval --checkpoint ck --log-json e1.jsonl >/dev/null
mpi 2 "$KILN_BIN" eval --checkpoint ck --tp 2 --log-json e2.jsonl >/dev/null
python3 - <<'PY'
import json
def val(p):
    return [json.loads(l) for l in open(p) if '"type":"eval"' in l][-1]["val_loss"]
a, b = val("e1.jsonl"), val("e2.jsonl")
print(f"kiln eval: 1 rank {a:.7f}, tp 2 {b:.7f}")
assert abs(a - b) <= 1e-5 * abs(a), (a, b)
PY
# kiln sample and kiln eval on a Hugging Face directory (issue 38): save_pretrained's files
# alone -- config.json, model.safetensors, the tokenizer -- give the checkpoint's greedy ids and
# its val loss; without tokenizer.json, sample refuses with one line.
mkdir -p hfdir
transformers_dir="$ckpt"
"$py" -c "
import sys
from transformers import AutoTokenizer, GPT2LMHeadModel
GPT2LMHeadModel.from_pretrained('$transformers_dir').save_pretrained('hfdir')
AutoTokenizer.from_pretrained('$transformers_dir').save_pretrained('hfdir')"
[ ! -e hfdir/trainer_state.json ] || fail "hfdir holds kiln state"
"$KILN_BIN" sample --checkpoint hfdir --prompt "$prompt" --temperature 0 --max-new-tokens 24 --json >s_hf.json
"$KILN_BIN" eval --checkpoint hfdir --val-data bpe/val_000000.bin --eval-batches 2 --micro-batch 4 --log-json e_hf.jsonl >/dev/null
"$KILN_BIN" eval --checkpoint "$ckpt" --val-data bpe/val_000000.bin --eval-batches 2 --micro-batch 4 --log-json e_ck.jsonl >/dev/null
python3 - <<'PY'
import json
s1, sh = json.load(open("s1.json")), json.load(open("s_hf.json"))
assert sh["ids"] == s1["ids"] and sh["step"] == 0, (sh, s1)
val = lambda p: [json.loads(l) for l in open(p) if '"type":"eval"' in l][-1]["val_loss"]
a, h = val("e_ck.jsonl"), val("e_hf.jsonl")
assert abs(a - h) <= 1e-6 * abs(a), (a, h)
print(f"a Hugging Face directory: kiln sample gives the checkpoint's greedy ids, kiln eval its val loss ({h:.7f})")
PY
rm hfdir/tokenizer.json
refused "hfdir is a Hugging Face model directory without tokenizer.json" sample --checkpoint hfdir

# 4. The byte-level tokenizer travels the same way: synthetic data, and kiln prep's default.
"$KILN_BIN" train --device cpu --n-layer 1 --seq-len 32 --steps 2 --save-dir syn >/dev/null
"$KILN_BIN" prep --input "doc*.txt" --out bytes --val-tokens 1000 >/dev/null
"$KILN_BIN" train --device cpu --n-layer 1 --seq-len 32 --steps 2 --data "bytes/train_*.bin" --save-dir byt --log-json byt.jsonl >/dev/null
cmp syn/step_00000002/tokenizer.json bytes/tokenizer.json || fail "the synthetic run's tokenizer is not kiln prep's byte-level one"
cmp byt/step_00000002/tokenizer.json bytes/tokenizer.json || fail "the byte-level shards' checkpoint lacks their tokenizer"
jsonl_check byt.jsonl 'assert records[0]["tokenizer"] == {"kind": "byte", "vocab_size": 257, "eot": 256, "source": "bytes/tokenizer.json"}, records[0]["tokenizer"]'
"$py" - <<'PY'
import json
import transformers
from transformers import AutoTokenizer, pipeline
transformers.utils.logging.disable_progress_bar()
d = "syn/step_00000002"
assert json.load(open(f"{d}/config.json"))["eos_token_id"] == 256
at = AutoTokenizer.from_pretrained(d)
text = "héllo wörld 日本 <tab>\t\n"
assert at.encode(text) == list(text.encode("utf-8")), at.encode(text)
assert at.decode(at.encode(text)) == text and at.eos_token_id == 256
out = pipeline("text-generation", model=d)("kiln", max_new_tokens=4, do_sample=False)[0]["generated_text"]
assert isinstance(out, str) and out.startswith("kiln"), out
out = pipeline("text-generation", model=d)("kiln")[0]["generated_text"]  # README's line: within the 32 positions
assert isinstance(out, str) and out.startswith("kiln"), out
print(f"byte-level checkpoint: AutoTokenizer gives UTF-8 bytes; pipeline: {out!r}")
PY

# 5. Bad input.
refused "tokenizer nope.json: no such file|prep: nope.json: no such file" prep --input doc0.txt --out x1 --tokenizer nope.json
refused "prep: wordpiece.json: .*byte-level BPE.*WordPiece" prep --input doc0.txt --out x2 --tokenizer wordpiece.json
refused "no <\|endoftext\|> token" prep --input doc0.txt --out x3 --tokenizer noeot.json
refused "--vocab and --merges go together" prep --input doc0.txt --out x4 --vocab tok/vocab.json
refused "not both" prep --input doc0.txt --out x5 --tokenizer tok/tokenizer.json --vocab tok/vocab.json --merges tok/merges.txt
refused "latin1.txt: not UTF-8" prep --input latin1.txt --out x6 --tokenizer tok/tokenizer.json
KILN_PYTHON=/nonexistent/python refused "needs Python with the tokenizers package" prep --input doc0.txt --out x7 --tokenizer tok/tokenizer.json
refused "has 320 ids: --vocab-size 300 cannot hold them" train --device cpu --steps 1 --vocab-size 300 --data "bpe/train_*.bin"
refused "byte-level BPE" train --device cpu --steps 1 --data "bpe/train_*.bin" --tokenizer wordpiece.json
cp bpe/train_000000.bin bare.bin
refused "sample-every needs the data's tokenizer" train --device cpu --steps 1 --vocab-size 320 --data bare.bin --sample-every 1
for d in x1 x2 x3 x4 x5 x6 x7; do [ ! -e "$d" ] || fail "a refused prep left $d behind"; done
echo "PASS"
