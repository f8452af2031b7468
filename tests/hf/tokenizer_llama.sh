#!/usr/bin/env bash
# tests/hf/tokenizer_llama.sh -- the Llama family's tokenizers (issue 35; data/hf_tokenizer.h),
# made here with Hugging Face's tokenizers library (no download):
#   - Llama 3's kind: byte-level BPE behind a Split pre-tokenizer on Llama 3's regex, with
#     <|begin_of_text|>, <|end_of_text|>, <|eot_id|> and no <|endoftext|>. kiln prep encodes the
#     documents through the library and opens each with <|begin_of_text|>: the shards' ids are the
#     library's, document by document. tiny-llama trains on them; its checkpoint carries the
#     tokenizer.json as it was, config.json's bos (<|begin_of_text|>) and eos (<|end_of_text|>,
#     <|eot_id|>) name its tokens, and kiln sample encodes a prompt
#     to the library's ids. Where KILN_PYTHON has transformers, its text-generation pipeline on the
#     checkpoint as it is continues the prompt greedily with kiln sample's text: config.json's
#     prefix puts <|begin_of_text|> first, as kiln sample does (without it they differed, issue 48),
#     and the pipeline's calls warn of nothing (generation_config.json's max_new_tokens and pad).
#   - SentencePiece's kind (Metaspace; Llama 2's and Mistral's): refused with one line, exit 2, by
#     kiln prep (the library's path) and kiln train --tokenizer (kiln's own reader).
# Skipped (exit 77) when KILN_PYTHON cannot import tokenizers.
set -euo pipefail
: "${KILN_BIN:?KILN_BIN must point at the kiln binary}"
here=$(cd "$(dirname "$0")" && pwd)
py="${KILN_PYTHON:-}"
if [ -z "$py" ] || ! "$py" -c 'import tokenizers' >/dev/null 2>&1; then
  echo "SKIP: tokenizers not importable by KILN_PYTHON='${py}' (launch/setup.sh installs it into .venv)"
  exit 77
fi
source "$here/../cli/common.sh"
cd "$work"
"$py" - <<'PY'
import random
from tokenizers import Regex, SentencePieceBPETokenizer, Tokenizer, decoders, models, pre_tokenizers, trainers
random.seed(5)
words = "the quick brown fox jumps over a lazy dog while kiln trains models héllo 日本".split()
docs = [" ".join(random.choice(words) for _ in range(400)) + f"\ndoc {k}\n" for k in range(3)]
for k, d in enumerate(docs):
    open(f"doc{k}.txt", "w", encoding="utf-8").write(d)
pat = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
       r"\s+(?!\S)|\s+")
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pat), behavior="isolated", invert=False),
                                             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                        special_tokens=["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]))
tok.save("llama3.json")
sp = SentencePieceBPETokenizer()
sp.train_from_iterator(docs, vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"])
sp.save("sp.json")
PY
"$KILN_BIN" prep --input "doc*.txt" --out shards --tokenizer llama3.json --val-tokens 200 >prep.out
grep -q "^kiln prep: tokenizer bpe (324 ids, end-of-text 0)" prep.out || { cat prep.out; fail "prep's tokenizer line"; }
"$py" - <<'PY'
import glob, struct
from tokenizers import Tokenizer
tok = Tokenizer.from_file("llama3.json")
bos = tok.token_to_id("<|begin_of_text|>")
want = []
for path in sorted(glob.glob("doc*.txt")):
    want += [bos] + tok.encode(open(path, encoding="utf-8").read()).ids
got = []
for path in ("shards/val_000000.bin", "shards/train_000000.bin"):
    raw = open(path, "rb").read()
    n = struct.unpack("<256i", raw[:1024])[2]
    got += list(struct.unpack(f"<{n}H", raw[1024:1024 + 2 * n]))
assert got == want, (len(got), len(want), got[:10], want[:10])
print(f"kiln prep with Llama 3's kind: {len(got)} ids, the library's, each of the 3 documents opened by <|begin_of_text|> ({bos})")
PY
"$KILN_BIN" train --device cpu --model tiny-llama --vocab-size 324 --data "shards/train_*.bin" --steps 3 --save-dir ck >/dev/null
ck="ck/$(cat ck/latest)"
cmp "$ck/tokenizer.json" llama3.json || fail "the checkpoint's tokenizer.json is not the one the data was made with"
"$KILN_BIN" sample --checkpoint ck --device cpu --prompt "the quick" --temperature 0 --max-new-tokens 16 --json >sample.json 2>/dev/null ||
  fail "kiln sample"
"$py" - "$ck" <<'PY'
import json, sys
from tokenizers import Tokenizer
c = json.load(open(f"{sys.argv[1]}/config.json"))
g = json.load(open(f"{sys.argv[1]}/generation_config.json"))
tok = Tokenizer.from_file("llama3.json")
bos, ends = tok.token_to_id("<|begin_of_text|>"), [tok.token_to_id("<|end_of_text|>"), tok.token_to_id("<|eot_id|>")]
# documents open with <|begin_of_text|>; generate stops at <|end_of_text|> or <|eot_id|>, as kiln sample does
assert (c["bos_token_id"], c["eos_token_id"], c["model_type"]) == (bos, ends, "llama"), c
assert (g["bos_token_id"], g["eos_token_id"]) == (bos, ends), g
t = json.load(open(f"{sys.argv[1]}/tokenizer_config.json"))  # Llama 3's own: bos opens, eos ends, no unk
assert (t["bos_token"], t["eos_token"], "unk_token" in t) == ("<|begin_of_text|>", "<|end_of_text|>", False), t
s = json.loads(open("sample.json").read().strip().splitlines()[-1])
want = Tokenizer.from_file("llama3.json").encode("the quick").ids
assert s["prompt_ids"] == want, (s["prompt_ids"], want)
print(f"checkpoint: tokenizer.json as given, bos {bos} and eos {ends} in config.json and generation_config.json; "
      f"kiln sample's prompt ids {want} are the library's")
PY
if "$py" -c 'import transformers' >/dev/null 2>&1; then
  "$py" - "$ck" <<'PY'
import json, logging, sys, warnings
import transformers
from transformers import pipeline
transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_warning()
said = []
class Keep(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage())
logging.getLogger("transformers").addHandler(Keep())
ck = sys.argv[1]
s = json.loads(open("sample.json").read().strip().splitlines()[-1])
assert json.load(open(f"{ck}/config.json"))["prefix"] == "<|begin_of_text|>"
gen = pipeline("text-generation", model=ck)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    said.clear()
    ids = gen("the quick", max_new_tokens=16, do_sample=False, return_tensors=True)[0]["generated_token_ids"]
    text = gen("the quick", max_new_tokens=16, do_sample=False)[0]["generated_text"]
    said += [str(x.message) for x in w]
# The pipeline's context is kiln sample's, <|begin_of_text|> (0) first; both stop at an end token.
assert ids[:1 + len(s["prompt_ids"])] == [0] + s["prompt_ids"], (ids, s["prompt_ids"])
got = ids[1 + len(s["prompt_ids"]):]
assert got[:len(s["ids"])] == s["ids"] and len(got) - len(s["ids"]) <= 1, (got, s["ids"])
assert text == "the quick" + s["text"], (text, s["text"])
assert not said, said
print(f"transformers' pipeline: greedy text {text!r} = kiln sample's, no warning")
PY
else
  echo "transformers: not importable by KILN_PYTHON='${py}'; the pipeline's comparison skipped"
fi
code=0
"$KILN_BIN" prep --input "doc*.txt" --out sp_shards --tokenizer sp.json >/dev/null 2>err.txt || code=$?
[ "$code" -eq 2 ] && [ "$(grep -c 'kiln: error' err.txt)" -eq 1 ] && grep -q "a SentencePiece-based tokenizer" err.txt || { cat err.txt; fail "prep: SentencePiece not refused"; }
echo "refused: $(cat err.txt)"
code=0
"$KILN_BIN" train --device cpu --model tiny-llama --tokenizer sp.json --steps 1 >/dev/null 2>err.txt || code=$?
[ "$code" -eq 2 ] && grep -q "kiln: error: .*a SentencePiece-based tokenizer" err.txt || { cat err.txt; fail "train: SentencePiece not refused"; }
echo "refused: $(grep 'kiln: error' err.txt)"
echo PASS
