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
#   - SentencePiece's kind (issue 51, part 3), two ways: Llama 2's layout (<unk> <s> </s>, the 256
#     byte tokens <0x00>..<0xFF>, spaces spelled U+2581 by the normalizer, byte fallback, the decoder
#     chain Replace / ByteFallback / Fuse / Strip) and the library's SentencePieceBPETokenizer
#     (Metaspace pre-tokenizer and decoder, no byte fallback). For each, kiln prep's ids are the
#     library's, each document opened by <s>; tiny-llama trains on them; the checkpoint names <s>,
#     </s> and <unk> in tokenizer_config.json and config.json; kiln sample encodes a prompt with
#     characters outside the vocabulary (byte fallback) to the library's ids, and the text of each
#     of 6 samples at temperature 1 (random-ish ids from a barely trained model: byte tokens whose
#     runs are not UTF-8, the leading space, special tokens) is exactly the library's decode of
#     its ids; where KILN_PYTHON has transformers, AutoTokenizer on the checkpoint encodes the prompt
#     and decodes the samples alike. A decoder kiln does not know is refused with one line
#     (tests/test_tokenizer.cpp).
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
# Llama 2's layout: <unk> <s> </s>, the byte tokens, then the learned pieces and their merges.
import json
from tokenizers import normalizers
base = Tokenizer(models.BPE(unk_token="<unk>"))
base.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
base.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"]))
spec = json.loads(base.to_str())
vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
for b in range(256):
    vocab[f"<0x{b:02X}>"] = 3 + b
for t, _ in sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1]):
    vocab.setdefault(t, len(vocab))
merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in spec["model"]["merges"]]
llama2 = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
llama2.normalizer = base.normalizer
llama2.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
llama2.add_special_tokens(["<unk>", "<s>", "</s>"])
llama2.save("llama2.json")
for name in ("sp", "llama2"):
    open(f"{name}.size", "w").write(str(Tokenizer.from_file(f"{name}.json").get_vocab_size()))
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
# SentencePiece's kind: prep, train, the checkpoint's files, sample's ids and text against the library.
prompt="the quick Ω héllo 🙂"
for kind in llama2 sp; do
  "$KILN_BIN" prep --input "doc*.txt" --out "${kind}_shards" --tokenizer "$kind.json" --val-tokens 200 >/dev/null
  "$KILN_BIN" train --device cpu --model tiny-llama --vocab-size "$(cat "$kind.size")" --data "${kind}_shards/train_*.bin" \
    --steps 20 --save-dir "ck_$kind" >/dev/null
  "$KILN_BIN" sample --checkpoint "ck_$kind" --device cpu --prompt "$prompt" --temperature 1 --num-samples 6 --seed 11 \
    --max-new-tokens 40 --json >"sample_$kind.json" 2>/dev/null || fail "kiln sample ($kind)"
  "$py" - "$kind" "ck_$kind/$(cat "ck_$kind/latest")" "$prompt" <<'PY'
import glob, json, struct, sys
from tokenizers import Tokenizer
kind, ck, prompt = sys.argv[1:4]
tok = Tokenizer.from_file(f"{kind}.json")
bos, eos, unk = tok.token_to_id("<s>"), tok.token_to_id("</s>"), tok.token_to_id("<unk>")
want = []
for path in sorted(glob.glob("doc*.txt")):
    want += [bos] + tok.encode(open(path, encoding="utf-8").read(), add_special_tokens=False).ids
got = []
for path in (f"{kind}_shards/val_000000.bin", f"{kind}_shards/train_000000.bin"):
    raw = open(path, "rb").read()
    n = struct.unpack("<256i", raw[:1024])[2]
    got += list(struct.unpack(f"<{n}H", raw[1024:1024 + 2 * n]))
assert got == want, (kind, len(got), len(want), got[:10], want[:10])
t = json.load(open(f"{ck}/tokenizer_config.json"))
assert (t["bos_token"], t["eos_token"], t.get("unk_token")) == ("<s>", "</s>", "<unk>"), t
c = json.load(open(f"{ck}/config.json"))
assert (c["bos_token_id"], c["eos_token_id"]) == (bos, eos), (c["bos_token_id"], c["eos_token_id"])
samples = [json.loads(line) for line in open(f"sample_{kind}.json") if line.startswith("{")]
assert len(samples) == 6, len(samples)
enc = tok.encode(prompt, add_special_tokens=False).ids
fallback = sum(1 for i in enc if (tok.id_to_token(i) or "").startswith("<0x"))
for s in samples:
    assert s["prompt_ids"] == enc, (s["prompt_ids"], enc)
    assert s["text"] == tok.decode(s["ids"]), (kind, s["ids"], s["text"], tok.decode(s["ids"]))
ids = sum((s["ids"] for s in samples), [])
byte_ids = sum(1 for i in ids if (tok.id_to_token(i) or "").startswith("<0x"))
print(f"{kind}: prep's {len(got)} ids are the library's (<s> = {bos} first); the prompt's {len(enc)} ids too "
      f"({fallback} by byte fallback); 6 samples' text = the library's decode ({len(ids)} ids, {byte_ids} byte tokens)")
try:
    import transformers
except ImportError:
    transformers = None
if transformers is not None:  # transformers' AutoTokenizer on the checkpoint as it is
    transformers.utils.logging.set_verbosity_error()
    at = transformers.AutoTokenizer.from_pretrained(ck)
    assert at.encode(prompt, add_special_tokens=False) == enc, (at.encode(prompt, add_special_tokens=False), enc)
    assert (at.bos_token, at.eos_token, at.unk_token) == ("<s>", "</s>", "<unk>"), (at.bos_token, at.eos_token, at.unk_token)
    for s in samples:
        assert at.decode(s["ids"], skip_special_tokens=True) == s["text"], (at.decode(s["ids"], skip_special_tokens=True), s["text"])
    print(f"{kind}: AutoTokenizer on the checkpoint encodes the prompt and decodes the samples as kiln does")
PY
done
echo PASS
