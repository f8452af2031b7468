#!/usr/bin/env bash
# tests/cli/prep_e2e.sh -- text -> shards with `kiln prep` (inputs as a quoted glob), then
# training on them with evaluation; and a raw uint16 token file (nanoGPT's train.bin) through
# --data-format raw, its vocabulary from the tokenizer.json beside it. Documents three ways give
# the same shard: one text file each, a JSONL file (a "text" field per line, Hugging Face
# datasets' export; --jsonl-field for another) and one text file with --separator -- each with
# its last line or document unterminated, and kept whole; a bad JSONL line is refused with its
# file and line.
source "$(dirname "$0")/common.sh"

python3 - "$work" <<'PY'
import sys
d = sys.argv[1]
for k in range(2):
    with open(f"{d}/doc{k}.txt", "w") as f:  # the second without a newline at its end
        f.write(("the quick brown fox jumps over the lazy dog. " * 400) + f"document {k}" + "\n" * (k == 0))
PY
"$KILN_BIN" prep --input "$work/doc*.txt" --out "$work/shards" --shard-tokens 20000 --val-tokens 4000 >"$work/prep.out"
cat "$work/prep.out"
# A quoted glob, as the help says: both documents, counted as input files.
grep -q "^kiln prep: .* tokens from 2 document(s) in 2 input file(s) into .* shard(s)$" "$work/prep.out" || fail "the glob did not name 2 input files"
python3 - "$work" <<'PY'
import json, sys
d = sys.argv[1]
docs = [open(f"{d}/doc{k}.txt").read() for k in range(2)]
# Blank lines between the records, and none after the last: its line has no newline at its end.
open(f"{d}/docs.jsonl", "w").write("\n\n".join(json.dumps({"id": k, "text": t, "body": t}) for k, t in enumerate(docs)))
# The last document without a separator after it.
open(f"{d}/docs.txt", "w").write("<|endoftext|>".join(docs))
# Every byte of both documents, and an end-of-text before each.
open(f"{d}/want_tokens", "w").write(str(sum(len(t.encode()) for t in docs) + 2))
open(f"{d}/bad.jsonl", "w").write(json.dumps({"text": docs[0]}) + "\n" + json.dumps({"title": "x"}) + "\n")
PY
KILN_TEST_PREP_PROGRESS_S=0 "$KILN_BIN" prep --input "$work/doc0.txt,$work/doc1.txt" --out "$work/by_file" >"$work/file.out" 2>"$work/progress.err"
grep -q "^kiln prep: 2/2 file(s), " "$work/progress.err" || { cat "$work/progress.err"; fail "progress line"; }
"$KILN_BIN" prep --input "$work/docs.jsonl" --out "$work/by_jsonl" >"$work/jsonl.out"
"$KILN_BIN" prep --input "$work/docs.jsonl" --jsonl-field body --out "$work/by_field" >/dev/null
"$KILN_BIN" prep --input "$work/docs.txt" --separator "<|endoftext|>" --out "$work/by_separator" >/dev/null
grep -q "tokens from 2 document(s) in 1 input file(s)" "$work/jsonl.out" || { cat "$work/jsonl.out"; fail "JSONL: two documents"; }
# A last line (or document) without a newline at its end is kept, whole: the documents' every byte
# (issue 48: a planted bug that dropped it passed, every test input ending in a newline).
for v in file jsonl; do
  grep -q "^kiln prep: $(cat "$work/want_tokens") tokens from 2 document(s)" "$work/$v.out" ||
    { cat "$work/$v.out"; fail "$v: not every byte of both documents (want $(cat "$work/want_tokens") tokens)"; }
done
for v in by_jsonl by_field by_separator; do
  cmp "$work/by_file/train_000000.bin" "$work/$v/train_000000.bin" || fail "$v: another shard than one file per document"
done
code=0; "$KILN_BIN" prep --input "$work/bad.jsonl" --out "$work/bad" >/dev/null 2>"$work/err" || code=$?
[ "$code" -ne 0 ] && grep -q "bad.jsonl, line 2: no string field 'text'" "$work/err" || { cat "$work/err"; fail "a JSONL line without text"; }
echo "documents: one file each = JSONL (text, --jsonl-field body) = --separator, byte for byte; $(cat "$work/err")"
ls "$work/shards"
[ -f "$work/shards/val_000000.bin" ] || fail "no validation shard"
[ -f "$work/shards/train_000001.bin" ] || fail "expected at least two train shards"
! grep -q "no validation shard" "$work/prep.out" || fail "a validation shard was written, and prep said none"
# Without --val-tokens no validation shard is written: said (it was silent), and --help shows the defaults.
"$KILN_BIN" prep --input "$work/doc0.txt" --out "$work/noval" >"$work/noval.out"
grep -q "^kiln prep: no validation shard (--val-tokens 0, the default)" "$work/noval.out" || { cat "$work/noval.out"; fail "no word on the missing validation shard"; }
[ ! -e "$work/noval/val_000000.bin" ] || fail "a validation shard without --val-tokens"
"$KILN_BIN" prep --help | grep -q "default 0: none" || fail "prep --help shows no default for --val-tokens"

"$KILN_BIN" train --device cpu --steps 40 --eval-every 20 --eval-batches 2 \
  --data "$work/shards/train_*.bin" --val-data "$work/shards/val_000000.bin" --log-json "$work/p.jsonl" >"$work/p.out"
# The eval line and record: perplexity (exp of the val loss) and the evaluation's duration.
grep -Eq "^eval +20 \| val loss [0-9.]+ \| ppl [0-9.]+ \| [0-9.]+ s$" "$work/p.out" || { cat "$work/p.out"; fail "eval line"; }
jsonl_check "$work/p.jsonl" '
for e in (r for r in records if r["type"] == "eval"):
    assert abs(e["perplexity"] - math.exp(e["val_loss"])) < 1e-9 * e["perplexity"] and e["seconds"] > 0, e
'
jsonl_check "$work/p.jsonl" '
evals = [r for r in records if r["type"] == "eval"]
assert [e["step"] for e in evals] == [20, 40], evals
steps = [r for r in records if r["type"] == "step"]
assert steps[-1]["loss"] < 0.5 * steps[0]["loss"], (steps[0]["loss"], steps[-1]["loss"])
assert evals[-1]["val_loss"] < evals[0]["val_loss"] + 0.5
print("prep shards train; val loss", [round(e["val_loss"], 3) for e in evals])
'

# Raw uint16 tokens without a header: refused as a shard, accepted with --data-format raw.
python3 -c "
import struct; t=[(i*7)%300 for i in range(20000)]
open('$work/train.bin','wb').write(struct.pack(f'<{len(t)}H',*t))"
code=0; "$KILN_BIN" train --device cpu --steps 1 --data "$work/train.bin" 2>"$work/err" || code=$?
[ "$code" -eq 3 ] && grep -q "data-format raw" "$work/err" || fail "raw file without --data-format raw: exit $code, $(cat "$work/err")"
# ... with a tokenizer.json of 600 ids beside it (a BPE's, as nanoGPT's meta.pkl gives the vocabulary)
# and no --vocab-size: the model takes the tokenizer's size, and says so (issue 48: the default
# model's 512 refused the data).
python3 - "$work/tokenizer.json" <<'PY'
import json, sys
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))  # GPT-2's bytes_to_unicode
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
vocab = {chr(c): b for b, c in zip(bs, cs)}
vocab.update({f"t{i}": i for i in range(256, 599)})
json.dump({"version": "1.0", "added_tokens": [{"id": 599, "content": "<|endoftext|>", "special": True}],
           "pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "vocab": vocab, "merges": []}}, open(sys.argv[1], "w"))
PY
"$KILN_BIN" train --device cpu --steps 5 --data "$work/train.bin" --data-format raw --log-json "$work/r.jsonl" >"$work/r.out"
grep -qF "kiln: vocab_size 600 from $work/tokenizer.json (no --vocab-size given, and the tiny preset's 512 cannot hold its ids; padded to 640)" \
  "$work/r.out" || { cat "$work/r.out"; fail "the vocabulary from the data's tokenizer is not said"; }
jsonl_check "$work/r.jsonl" '
assert len([r for r in records if r["type"] == "step"]) == 5
assert records[0]["config"]["vocab_size"] == 600 and records[0]["tokenizer"]["vocab_size"] == 600, records[0]["config"]["vocab_size"]
'
echo "PASS"
