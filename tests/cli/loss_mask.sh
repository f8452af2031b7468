#!/usr/bin/env bash
# tests/cli/loss_mask.sh -- training and evaluation on data with a target mask (data/target_mask.h;
# what kiln prep --chat writes beside its shards: tests/hf/chat.sh) in every layout (label mpi).
# The loss is the sum over the global batch's trained targets divided by their count (models/gpt.h,
# loss_targets_per_term), so every layout that trains on the same global batch takes the same loss.
# tiny-llama, fp32, kiln prep's byte-level shard of short documents, with a mask written here: runs
# of trained and untrained targets (about a third trained), and one stretch of 600 untrained tokens
# (whole micro-batches with no trained target: a rank then puts one row through weighted 0).
# Global batch 8 sequences, 8 steps, evaluation every 4 steps on a masked validation shard:
#   - one process (micro-batch 4 x grad-accum 2) is the reference; the same data without its
#     mask (the shards copied without their .mask files) is more than 1e-2 away within the 8
#     steps (at step 1 the untrained model's loss is ~ln V for every target alike), so the mask is read;
#   - dp 2 (DDP, 4 x 1), ZeRO-2 at dp 2, tp 2 + sp, cp 2, pp 2 (1F1B, 2 x 4) and dp 2 with
#     --document-mask (against one process with it) equal it: every step's loss and gradient norm,
#     the evaluations' val_loss and the final weights' fingerprint within 1e-5 relative, the
#     parallel layouts' parity bound (tests/cli/sequence_parallel.sh: the same products summed in
#     another order, ~1e-7). A denominator taken per micro-batch or per rank instead of over the
#     global batch moves the loss by ~1e-2 with runs this uneven;
#   - every step record's loss_tokens is the step's trained targets: above 0, below its tokens,
#     the same in every layout;
#   - --cuda-graph is refused on masked data (one line, exit 2); a mask whose size disagrees with
#     its shard is refused naming the file (a corrupt file: exit 3).
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
cd "$work"
python3 - <<'PY'
import json, random
random.seed(11)
words = "the quick brown fox jumps over a lazy dog while kiln trains models on many nodes".split()
with open("docs.jsonl", "w") as f:
    for _ in range(3000):
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(random.randrange(2, 12)))}) + "\n")
PY
"$KILN_BIN" prep --input docs.jsonl --out shards --val-tokens 6000 >/dev/null
mkdir plain && cp shards/*.bin shards/tokenizer.json plain/
python3 - <<'PY'
import random, struct
random.seed(3)
for name in ("train_000000", "val_000000"):
    with open(f"shards/{name}.bin", "rb") as f:
        count = struct.unpack("<3i", f.read(12))[2]
    mask = bytearray()
    while len(mask) < count:  # runs: a prompt (untrained), then an answer (trained)
        mask += bytes(random.randrange(5, 40)) + bytes([1]) * random.randrange(3, 20)
    mask = mask[:count]
    if name == "train_000000":
        mask[2000:2600] = bytes(600)  # whole micro-batches without a trained target
    header = struct.pack("<3i", 20261129, 1, count) + bytes(1024 - 12)
    open(f"shards/{name}.mask", "wb").write(header + bytes(mask))
    print(f"{name}: {sum(mask)} of {count} targets trained")
PY
# evaluation over the same 16 sequences: 4 batches of 4, or (pp 2's micro-batch of 2) 8 of 2
T=(train --device cpu --model tiny-llama --seq-len 64 --steps 8 --log-every 100 --dropout 0 --val-data shards/val_000000.bin
   --eval-every 4)
"$KILN_BIN" "${T[@]}" --data shards/train_000000.bin --micro-batch 4 --grad-accum 2 --eval-batches 4 --log-json one.jsonl >/dev/null & a=$!
"$KILN_BIN" "${T[@]/shards\/val/plain/val}" --data plain/train_000000.bin --micro-batch 4 --grad-accum 2 --eval-batches 4 --log-json plain.jsonl >/dev/null
wait "$a" || fail "the one-process run"
"$KILN_BIN" "${T[@]}" --data shards/train_000000.bin --micro-batch 4 --grad-accum 2 --eval-batches 4 --document-mask --log-json one_doc.jsonl >/dev/null
D=(--data shards/train_000000.bin)
mpi 2 "$KILN_BIN" "${T[@]}" "${D[@]}" --micro-batch 4 --grad-accum 1 --eval-batches 4 --log-json dp2.jsonl >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" "${D[@]}" --micro-batch 4 --grad-accum 1 --zero 2 --eval-batches 4 --log-json zero2.jsonl >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" "${D[@]}" --micro-batch 4 --grad-accum 2 --tp 2 --sp --eval-batches 4 --log-json tpsp.jsonl >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" "${D[@]}" --micro-batch 4 --grad-accum 2 --cp 2 --eval-batches 4 --log-json cp2.jsonl >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" "${D[@]}" --micro-batch 2 --grad-accum 4 --pp 2 --eval-batches 8 --log-json pp2.jsonl >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" "${D[@]}" --micro-batch 4 --grad-accum 1 --document-mask --eval-batches 4 --log-json dp2_doc.jsonl >/dev/null
python3 - <<'PY'
import json
load = lambda n: [json.loads(l) for l in open(f"{n}.jsonl")]
steps = lambda rs: [r for r in rs if r["type"] == "step"]
evals = lambda rs: [r["val_loss"] for r in rs if r["type"] == "eval"]
rel = lambda a, b: abs(a - b) / max(abs(a), 1e-30)
one, plain = load("one"), load("plain")
gap = max(rel(a["loss"], b["loss"]) for a, b in zip(steps(one), steps(plain)))
assert gap > 1e-2, f"the mask changed nothing ({gap:.1e} at most)"
assert "loss_tokens" not in steps(plain)[0], "loss_tokens on unmasked data"
for s in steps(one):
    assert 0 < s["loss_tokens"] < s["tokens"], (s["step"], s["loss_tokens"], s["tokens"])
assert len(evals(one)) == 2
for name, ref in (("dp2", one), ("zero2", one), ("tpsp", one), ("cp2", one), ("pp2", one), ("dp2_doc", load("one_doc"))):
    run = load(name)
    worst = 0.0
    assert len(steps(run)) == 8, name
    for a, b in zip(steps(ref), steps(run)):
        assert a["loss_tokens"] == b["loss_tokens"], (name, a["step"], a["loss_tokens"], b["loss_tokens"])
        for key in ("loss", "grad_norm"):
            worst = max(worst, rel(a[key], b[key]))
            assert rel(a[key], b[key]) <= 1e-5, (name, a["step"], key, a[key], b[key])
    for a, b in zip(evals(ref), evals(run)):
        worst = max(worst, rel(a, b))
        assert rel(a, b) <= 1e-5, (name, "val_loss", a, b)
    for key in ("param_sum", "param_sq"):
        worst = max(worst, rel(ref[-1][key], run[-1][key]))
        assert rel(ref[-1][key], run[-1][key]) <= 1e-5, (name, key)
    print(f"masked targets: {name} == one process within {worst:.1e} (8 steps, 2 evaluations)")
print(f"the unmasked run is up to {gap:.1e} away")
PY
expect_refused 1 "--cuda-graph does not take data with a target mask" "${T[@]}" "${D[@]}" --cuda-graph
head -c 1500 shards/val_000000.mask > short.mask && mv short.mask shards/val_000000.mask  # a corrupt file: exit 3
code=0; "$KILN_BIN" "${T[@]}" "${D[@]}" >/dev/null 2>err || code=$?
[ "$code" -eq 3 ] && [ "$(grep -c 'kiln: error' err)" -eq 1 ] &&
  grep -q "kiln: error: .*val_000000.mask: a target mask of 1500 bytes beside a shard of 6000 tokens" err || { cat err >&2; fail "a short mask (want exit 3)"; }
echo "refused: $(grep 'kiln: error' err)"
echo PASS
