#!/usr/bin/env bash
# tests/cli/bad_input.sh -- every bad input ends with one line on stderr naming the problem
# and a non-zero exit code that is kiln's own (2 config, 3 data), never a crash or a hang.
source "$(dirname "$0")/common.sh"

# Shards made by hand: llm.c header (256 int32: magic, version, count) + uint16 tokens.
python3 - "$work" <<'PY'
import struct, sys
d = sys.argv[1]
def shard(name, magic=20240520, version=1, count=None, tokens=range(1000)):
    tokens = list(tokens)
    head = [magic, version, len(tokens) if count is None else count] + [0] * 253
    with open(f"{d}/{name}", "wb") as f:
        f.write(struct.pack("<256i", *head))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))
shard("badmagic.bin", magic=12345)
shard("badversion.bin", version=7)
shard("badsize.bin", count=5000)
shard("oov.bin", tokens=[600 if i % 10 == 0 else i % 500 for i in range(5000)])
with open(f"{d}/bad.json", "w") as f: f.write('{"steps": 3,')
PY

expect_fail() {  # expect_fail REGEX ARGS...
  local regex=$1; shift
  local code=0
  timeout 120 "$KILN_BIN" "$@" >"$work/out" 2>"$work/err" || code=$?
  local lines; lines=$(wc -l <"$work/err")
  if [ "$code" -ne 2 ] && [ "$code" -ne 3 ]; then
    cat "$work/err" >&2; fail "kiln $* exited $code (want 2 or 3)"
  fi
  [ "$lines" -eq 1 ] || { cat "$work/err" >&2; fail "kiln $*: $lines lines on stderr (want 1)"; }
  grep -Eq "^kiln: error: .*$regex" "$work/err" || { cat "$work/err" >&2; fail "kiln $*: stderr does not match '$regex'"; }
  echo "ok ($code): kiln $* -> $(cat "$work/err")"
}

T=(train --device cpu --steps 2)
expect_fail "unknown flag '--no-such-flag'" "${T[@]}" --no-such-flag 3
expect_fail "unknown model 'gpt-9'" "${T[@]}" --model gpt-9
expect_fail "unknown flag '--micro-batc' \(did you mean '--micro-batch'\?\)" "${T[@]}" --micro-batc 2
expect_fail "unknown model 'gpt2-124' \(did you mean 'gpt2-124m'\?\)" "${T[@]}" --model gpt2-124
expect_fail "unknown command 'trian' \(did you mean 'train'\?\)" trian
expect_fail "--micro-batch must be at least 1 \(got 0\)" "${T[@]}" --micro-batch 0
expect_fail "--tp 2 x --pp 1 needs 2 ranks: launch with mpirun -np 2" "${T[@]}" --tp 2
expect_fail "--input: no file matches '$work/nothing\*.txt'" prep --input "$work/nothing*.txt" --out "$work/p"
mkdir -p "$work/shards"
expect_fail "--data $work/shards is a directory; pass the files in it, e.g. --data '$work/shards/train_\*.bin'" "${T[@]}" --data "$work/shards"
# ... with the pattern the directory's files and the flag suggest: kiln prep reads text, not
# shards (it suggested 'corpus/train_*.bin' as prep's input), and --val-data the val_ shards.
mkdir -p "$work/corpus" && echo "a document" >"$work/corpus/a.md" && echo "another" >"$work/corpus/b.md"
expect_fail "--input $work/corpus is a directory; pass the files in it, e.g. --input '$work/corpus/\*.md'" prep --input "$work/corpus" --out "$work/p"
expect_fail "--val-data $work/shards is a directory; pass the files in it, e.g. --val-data '$work/shards/val_\*.bin'" "${T[@]}" --val-data "$work/shards"
expect_fail "no file matches '$work/missing.bin'" "${T[@]}" --data "$work/missing.bin"
# ... naming the flag it came from (a missing --val-data file was reported as --data's).
expect_fail "--val-data: no file matches '$work/missing_val.bin'" "${T[@]}" --val-data "$work/missing_val.bin"
expect_fail "badmagic.bin: bad magic 12345" "${T[@]}" --data "$work/badmagic.bin"
expect_fail "badversion.bin: .*version 7" "${T[@]}" --data "$work/badversion.bin"
expect_fail "badsize.bin: .*size" "${T[@]}" --data "$work/badsize.bin"
expect_fail "oov.bin: token 600 .*outside the vocabulary" "${T[@]}" --data "$work/oov.bin"
expect_fail "--n-head 5 does not divide --d-model 128" "${T[@]}" --n-head 5
expect_fail "--n-kv-head 3 does not divide --n-head 4" "${T[@]}" --n-kv-head 3
expect_fail "malformed JSON" "${T[@]}" --config "$work/bad.json"
# A --config key's typo gets the suggestion a flag's gets (it got none).
echo '{"micro_batc": 2}' >"$work/typo.json"
expect_fail "--config $work/typo.json: unknown key 'micro_batc' \(did you mean 'micro_batch'\?\)" "${T[@]}" --config "$work/typo.json"
expect_fail "--micro-batch: 'x' is not an integer" "${T[@]}" --micro-batch x
expect_fail "fewer than seq_len\+1" "${T[@]}" --data "$work/oov.bin" --seq-len 8192
expect_fail "--log-json .*cannot open" "${T[@]}" --log-json /nonexistent-dir/run.jsonl
expect_fail "--backend mpi needs MPI: launch with mpirun" "${T[@]}" --backend mpi
expect_fail "--offload all needs --zero 3" "${T[@]}" --zero 1 --offload all
expect_fail "--keep-best follows the validation loss: give --val-data and --eval-every N" "${T[@]}" --keep-best
expect_fail "--early-stop follows the validation loss" "${T[@]}" --early-stop 3
expect_fail "--offload optimizer needs ZeRO" "${T[@]}" --offload optimizer
expect_fail "--device-memory-cap-gb needs a CUDA device" "${T[@]}" --device-memory-cap-gb 24
# --cuda-graph (runtime/trainer/trainer_graph.cpp): a GPU's, one process; what a replay cannot redo
# is refused with its reason.
expect_fail "--cuda-graph needs a CUDA device \(this run computes on cpu\)" "${T[@]}" --cuda-graph
expect_fail "--cuda-graph does not go with --precision fp16: the loss scale changes on the host" "${T[@]}" --cuda-graph --precision fp16
expect_fail "--cuda-graph does not go with --zero 1" "${T[@]}" --cuda-graph --zero 1
expect_fail "--cuda-graph does not go with --tp, --pp, --cp or --ep: the graph runs one process" "${T[@]}" --cuda-graph --tp 2
expect_fail "--cuda-graph does not go with --activation-checkpointing full" "${T[@]}" --cuda-graph --activation-checkpointing full
expect_fail "--cuda-graph does not go with an MoE model" "${T[@]}" --cuda-graph --model tiny-moe
expect_fail "--cuda-graph does not go with --on-nonfinite skip" "${T[@]}" --cuda-graph --on-nonfinite skip
expect_fail "--logits-dtype bf16 rounds the products of bf16 operands: give --precision bf16 \\(got --precision fp32\\)" "${T[@]}" --logits-dtype bf16
echo "PASS"
