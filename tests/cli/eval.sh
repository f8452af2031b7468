#!/usr/bin/env bash
# tests/cli/eval.sh -- `kiln eval --checkpoint DIR`: the validation loss of a checkpoint, on the
# layout it was trained on and on others, equals the eval record the training run wrote at that
# step: bit for bit on one rank (the same arithmetic), within 1e-5 on tp 2, pp 2 and ZeRO-3 (the
# sums' order changes), and within 2e-2 in bf16 (autocast rounding); bad input refused. It needs
# the weights only: a checkpoint without its optimizer state evaluates the same (it once refused,
# "optimizer.safetensors is missing"), and its model file is still checked against the CRC-32.
# --keep-best and --early-stop follow the validation loss: at --lr 0 it never falls after the first
# evaluation, so --early-stop 2 ends the run two evaluations later (exit 0, not a stop to resume),
# and --keep-best's checkpoint of the first one survives --keep-last 1; while it falls, best
# follows the newest evaluation; a resume carries the best so far.
# Weights that hold a NaN or an infinity (their CRC-32 right: saved so) are refused at load with one
# line naming the tensor and the file, exit 3, by kiln eval, --resume (AdamW's state too) and
# --init-from alike (eval printed "val loss -nan" and exited 0; --init-from stopped at step 1); a
# corrupt checkpoint's hint names kiln eval's own flag, --checkpoint (it said --resume).
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
cd "$work"
python3 -c "
import random; random.seed(1)
words = 'the quick brown fox jumps over a lazy dog while kiln trains models on many nodes'.split()
open('a.txt', 'w').write(' '.join(random.choice(words) for _ in range(60000)))"
"$KILN_BIN" prep --input a.txt --out shards --val-tokens 20000 >/dev/null
"$KILN_BIN" train --device cpu --steps 20 --eval-every 20 --eval-batches 4 --data "shards/train_*.bin" \
  --val-data shards/val_000000.bin --save-dir ck --log-json train.jsonl >/dev/null

"$KILN_BIN" eval --checkpoint ck --log-json one.jsonl | tee one.out
grep -Eq "^kiln eval: ck/step_00000020 \(step 20\), 4 micro-batches of 8 sequences" one.out || fail "eval header"
grep -Eq "^eval +20 \| val loss [0-9.]+ \| ppl [0-9.]+ \| [0-9.]+ s$" one.out || fail "eval line"
grep -Fq "4 micro-batches of 8 sequences (32 of the 156 samples of --val-data)" one.out || fail "eval header: the set's coverage"
# --eval-batches 0 reads the validation set once (its whole micro-batches); more than the set is
# said to repeat samples (it did so silently).
"$KILN_BIN" eval --checkpoint ck --eval-batches 0 >all.out
grep -Fq "19 micro-batches of 8 sequences (152 of the 156 samples of --val-data)" all.out || { cat all.out; fail "--eval-batches 0"; }
"$KILN_BIN" eval --checkpoint ck --eval-batches 20 >over.out
grep -Fq "20 micro-batches of 8 sequences -- more than the 156 samples of --val-data: samples repeat" over.out || { cat over.out; fail "no word on repeated samples"; }
# --help shows the flags an evaluation is about, not kiln train's ~80 (all still accepted).
"$KILN_BIN" eval --help >help.out
grep -q -- "--val-data" help.out && grep -q -- "--eval-batches" help.out && ! grep -q -- "--lr-schedule" help.out &&
  [ "$(wc -l <help.out)" -lt 40 ] || { cat help.out; fail "kiln eval --help"; }
cp -r ck/step_00000020 weights && rm weights/optimizer.safetensors
"$KILN_BIN" eval --checkpoint weights --log-json weights.jsonl >/dev/null || fail "eval of a checkpoint without optimizer state"
mpi 2 "$KILN_BIN" eval --checkpoint ck --tp 2 --log-json tp2.jsonl >/dev/null
mpi 2 "$KILN_BIN" eval --checkpoint ck --pp 2 --log-json pp2.jsonl >/dev/null
mpi 2 "$KILN_BIN" eval --checkpoint ck/step_00000020 --zero 3 --log-json z3.jsonl >/dev/null
"$KILN_BIN" eval --checkpoint ck --precision bf16 --log-json bf16.jsonl >/dev/null
python3 - <<'PY'
import json
ev = lambda p: [json.loads(l) for l in open(p) if '"type":"eval"' in l][-1]
want = ev("train.jsonl")["val_loss"]
one = ev("one.jsonl")
assert one["step"] == 20 and one["val_loss"] == want, (one, want)
assert ev("weights.jsonl")["val_loss"] == want, ev("weights.jsonl")
print("weights only (no optimizer.safetensors): the same val loss")
for name, tol in (("tp2", 1e-5), ("pp2", 1e-5), ("z3", 1e-5), ("bf16", 2e-2)):
    got = ev(f"{name}.jsonl")["val_loss"]
    assert abs(got - want) <= tol * want, (name, got, want)
    print(f"{name}: val loss {got:.6f} (training's {want:.6f}, tolerance {tol:g} relative)")
print(f"one rank: {one['val_loss']} = the training run's eval at step 20, bit for bit; ppl {one['perplexity']:.2f}")
PY

# --keep-best / --early-stop.
B=(train --device cpu --steps 12 --eval-every 2 --eval-batches 2 --data "shards/train_*.bin" --val-data shards/val_000000.bin
   --save-every 2 --keep-last 1 --keep-best)
"$KILN_BIN" "${B[@]}" --lr 0 --warmup 0 --early-stop 2 --save-dir flat --log-json flat.jsonl >flat.out || fail "early stop: exit $?"
grep -q "^kiln: early stop after step 6: no val loss below .* (step 2) in 2 evaluations (--early-stop), best checkpoint flat/step_00000002" flat.out || { cat flat.out; fail "early stop line"; }
[ "$(cat flat/best)" = step_00000002 ] && [ -d flat/step_00000002 ] && [ -d flat/step_00000006 ] && [ ! -d flat/step_00000004 ] || { ls flat; fail "--keep-best with --keep-last 1"; }
# Resumed, the patience already spent stays spent: the next evaluation (step 8) ends it again.
"$KILN_BIN" "${B[@]}" --lr 0 --warmup 0 --early-stop 2 --save-dir flat --log-json flat_resumed.jsonl >flat2.out || fail "resumed early stop: exit $?"
grep -q "^kiln: early stop after step 8: no val loss below .* (step 2) in 3 evaluations" flat2.out || { cat flat2.out; fail "the best was not carried by the checkpoint"; }
"$KILN_BIN" "${B[@]}" --steps 8 --save-dir falling --log-json falling.jsonl >/dev/null
"$KILN_BIN" "${B[@]}" --steps 10 --save-dir falling --log-json falling.jsonl >/dev/null
python3 - <<'PY'
import json
flat = [json.loads(l) for l in open("flat.jsonl")]
s = [r for r in flat if r["type"] == "summary"][-1]
assert s["early_stopped"] == 6 and s["stopped"] is None and s["best"]["step"] == 2, s
assert max(r["step"] for r in flat if r["type"] == "step") == 6
runs = [json.loads(l) for l in open("falling.jsonl")]
evals = [r for r in runs if r["type"] == "eval"]
assert all(b["val_loss"] < a["val_loss"] for a, b in zip(evals, evals[1:])), [e["val_loss"] for e in evals]
best = [r for r in runs if r["type"] == "summary"][-1]["best"]
assert best["step"] == 10 and best["val_loss"] == evals[-1]["val_loss"], (best, evals[-1])
assert open("falling/best").read().strip() == "step_00000010"
print(f"--early-stop 2 at --lr 0: ended after step 6, best step 2 kept beside --keep-last 1; falling val loss: best follows it to step 10 across a resume")
PY

refuse() {  # refuse [--code N] REGEX ARGS...: `kiln ARGS` exits N (2) with one matching line; ARGS without a command: eval
  local want=2; [ "$1" = --code ] && { want=$2; shift 2; }
  local regex=$1; shift
  case "$1" in train|eval|sample) ;; *) set -- eval "$@" ;; esac
  local code=0
  "$KILN_BIN" "$@" >/dev/null 2>err || code=$?
  [ "$code" -eq "$want" ] && [ "$(wc -l <err)" -eq 1 ] && grep -Eq "kiln: error: .*$regex" err || { cat err; fail "$* (want exit $want, '$regex')"; }
  echo "refused: $(cat err)"
}
refuse "give --checkpoint" --val-data shards/val_000000.bin
refuse "no trainer_state.json" --checkpoint shards
"$KILN_BIN" train --device cpu --steps 2 --save-dir nodata >/dev/null
refuse "had no --val-data" --checkpoint nodata
printf 'x' | dd of=weights/model.safetensors bs=1 seek=100 conv=notrunc 2>/dev/null
code=0; "$KILN_BIN" eval --checkpoint weights >/dev/null 2>err || code=$?
[ "$code" -ne 0 ] && grep -q "model.safetensors is corrupt" err || { cat err; fail "a flipped byte of a weights-only checkpoint"; }
echo "refused: $(cat err)"
# A corrupt checkpoint beside older ones: the hint names kiln eval's --checkpoint.
cp -r flat flat_corrupt
printf 'x' | dd of=flat_corrupt/step_00000008/model.safetensors bs=1 seek=100 conv=notrunc 2>/dev/null
refuse --code 3 "model.safetensors is corrupt .*older checkpoints beside it: step_00000002 \(--checkpoint flat_corrupt/step_00000002\)$" --checkpoint flat_corrupt
# Non-finite weights and AdamW state, saved so (the CRC-32 recorded over them).
plant() { python3 "$(dirname "$0")/plant_nonfinite.py" "$@" >/dev/null; }
cp -r ck nan && plant nan/step_00000020 transformer.h.1.mlp.c_fc.weight
cp -r ck inf && plant inf/step_00000020 transformer.h.0.attn.c_attn.bias inf
cp -r ck nan_adam && plant nan_adam/step_00000020 exp_avg_sq/h.0.attn.c_attn.weight
R=(--data "shards/train_*.bin" --steps 21)
refuse --code 3 "checkpoint nan/step_00000020: tensor 'transformer.h.1.mlp.c_fc.weight' of model.safetensors holds NaN or infinity" --checkpoint nan
refuse --code 3 "checkpoint nan/step_00000020: tensor 'transformer.h.1.mlp.c_fc.weight' of model.safetensors holds NaN or infinity" train "${R[@]}" --device cpu --resume nan
refuse --code 3 "--init-from inf/step_00000020: tensor 'transformer.h.0.attn.c_attn.bias' of model.safetensors holds NaN or infinity" train "${R[@]}" --device cpu --init-from inf
refuse --code 3 "tensor 'exp_avg_sq/h.0.attn.c_attn.weight' of optimizer.safetensors holds NaN or infinity" train "${R[@]}" --device cpu --resume nan_adam
echo PASS
