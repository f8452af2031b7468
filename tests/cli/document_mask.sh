#!/usr/bin/env bash
# tests/cli/document_mask.sh -- --document-mask (models/gpt.h: attention within each document of a
# packed sample, documents opened by the tokenizer's end-of-text token) in training (label mpi).
# tiny-llama (rotary positions), fp32, kiln prep's shard of 4000 short documents (the byte
# tokenizer: 256 opens each; about 3 in a sample), global batch 8 sequences, 10 steps:
#   - one process (micro-batch 4 x grad-accum 2) is the reference; it is not the unmasked run
#     (step 1's loss differs: the mask changes what each position sees);
#   - dp 2 (DDP, 4 x 1), tp 2 + sp (4 x 2), cp 2 (4 x 2: the rank's query chunks against the
#     gathered keys, GPT's document_mask_at) and pp 2 (1F1B, 2 x 4, with full recomputation: every
#     stage sets the documents of the micro-batch it runs, and a recomputed block sees its own
#     micro-batch's, not the one a later forward set) equal it: every step's loss and gradient norm
#     and the final weights' fingerprint within 1e-5 relative, the parallel layouts' parity bound
#     (tests/cli/sequence_parallel.sh): the same products summed in another order (~1e-7). A mask
#     that leaked across a document, or fell on the wrong rows or keys, moves the loss by far more
#     (the unmasked run is ~1e-2 away at step 1);
#   - --document-positions restart (rotary positions from 0 at every document): one process is the
#     reference for dp 2, tp 2 + sp and cp 2 (the positions taken at each rank's rows), within
#     1e-5; under the mask rotary attention sees relative positions only, so restart and continue
#     differ by rounding alone (checked: within 1e-4);
#   - the record says document_mask and document_positions; restart without --document-mask, and
#     on learned positions (tiny), is refused with one line, exit 2.
# That a document's positions then compute what the document alone computes is unit.test_model's
# (GPT.DocumentMaskKeepsDocumentsApart, GPT.DocumentPositionsRestart).
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
cd "$work"
python3 - <<'PY'
import json, random
random.seed(5)
words = "the quick brown fox jumps over a lazy dog while kiln trains models on many nodes".split()
with open("docs.jsonl", "w") as f:  # 4000 short documents (2-12 words: about 3 a sample of 128 bytes)
    for _ in range(4000):
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(random.randrange(2, 12)))}) + "\n")
PY
"$KILN_BIN" prep --input docs.jsonl --out shards >/dev/null  # the byte tokenizer: end-of-text 256 before every document
T=(train --device cpu --model tiny-llama --data shards/train_000000.bin --steps 10 --log-every 100 --dropout 0)
"$KILN_BIN" "${T[@]}" --document-mask --micro-batch 4 --grad-accum 2 --log-json one.jsonl >/dev/null & a=$!
"$KILN_BIN" "${T[@]}" --micro-batch 4 --grad-accum 2 --log-json plain.jsonl >/dev/null
wait "$a" || fail "the one-process --document-mask run"
mpi 2 "$KILN_BIN" "${T[@]}" --document-mask --micro-batch 4 --grad-accum 1 --log-json dp2.jsonl >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --document-mask --micro-batch 4 --grad-accum 2 --tp 2 --sp --log-json tpsp.jsonl >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --document-mask --micro-batch 4 --grad-accum 2 --cp 2 --log-json cp2.jsonl >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --document-mask --micro-batch 2 --grad-accum 4 --pp 2 --activation-checkpointing full --log-json pp2.jsonl >/dev/null
R=(--document-mask --document-positions restart)
"$KILN_BIN" "${T[@]}" "${R[@]}" --micro-batch 4 --grad-accum 2 --log-json one_r.jsonl >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" "${R[@]}" --micro-batch 4 --grad-accum 1 --log-json dp2_r.jsonl >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" "${R[@]}" --micro-batch 4 --grad-accum 2 --tp 2 --sp --log-json tpsp_r.jsonl >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" "${R[@]}" --micro-batch 4 --grad-accum 2 --cp 2 --log-json cp2_r.jsonl >/dev/null
python3 - <<'PY'
import json
load = lambda n: [json.loads(l) for l in open(f"{n}.jsonl")]
steps = lambda rs: [r for r in rs if r["type"] == "step"]
rel = lambda a, b: abs(a - b) / max(abs(a), 1e-30)
one, plain = load("one"), load("plain")
assert one[0]["config"]["document_mask"] is True and plain[0]["config"]["document_mask"] is False
gap = rel(steps(one)[0]["loss"], steps(plain)[0]["loss"])
assert gap > 1e-4, f"the mask changed nothing at step 1 ({gap:.1e})"
one_r = load("one_r")
assert one_r[0]["config"]["document_positions"] == "restart" and one[0]["config"]["document_positions"] == "continue"
drift = max(rel(a["loss"], b["loss"]) for a, b in zip(steps(one), steps(one_r)))
assert drift <= 1e-4, f"restart and continue differ by {drift:.1e}: more than rounding under the mask"
for name, ref in (("dp2", one), ("tpsp", one), ("cp2", one), ("pp2", one), ("dp2_r", one_r), ("tpsp_r", one_r), ("cp2_r", one_r)):
    run = load(name)
    assert run[0]["config"]["document_mask"] is True
    worst = 0.0
    for a, b in zip(steps(ref), steps(run)):
        for key in ("loss", "grad_norm"):
            worst = max(worst, rel(a[key], b[key]))
            assert rel(a[key], b[key]) <= 1e-5, (name, a["step"], key, a[key], b[key])
    for key in ("param_sum", "param_sq"):
        worst = max(worst, rel(ref[-1][key], run[-1][key]))
        assert rel(ref[-1][key], run[-1][key]) <= 1e-5, (name, key)
    assert len(steps(run)) == 10
    print(f"--document-mask {name} == one process within {worst:.1e} (10 steps); unmasked step 1 is {gap:.1e} away")
print(f"--document-positions restart against continue: {drift:.1e} (rounding)")
PY
expect_refused 1 "--document-positions restart counts positions within documents: give --document-mask" "${T[@]}" --document-positions restart
expect_refused 1 "--document-positions restart turns rotary positions" "${T[@]/tiny-llama/tiny}" "${R[@]}"
echo PASS
