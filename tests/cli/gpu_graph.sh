#!/usr/bin/env bash
# tests/cli/gpu_graph.sh -- gpu.graph: --cuda-graph (runtime/trainer/trainer_graph.cpp), the step
# captured as CUDA graphs at the run's third step and replayed, against the same run eager, on
# CUDA (label gpu). Exits 77 (CTest skip) with the reason when no GPU is visible.
#   A. gpt2-style tiny, bf16, dropout 0.1 (the graph's RNG: each replay reads the generator's seed
#      and offset, set per step), 30 steps with an evaluation and a save every 10 (eager work
#      between replays), --deterministic: every step's loss, gradient norm and rate, the
#      evaluations and the final weights' fingerprint equal to the eager run's, bit for bit -- the
#      graph is the eager step's kernels in the eager step's order on the same inputs, and under
#      --deterministic those give the same bits. Its steps make no host sync before the update
#      (but the capture's own, step 3: the eager steps' cached blocks are released first).
#   B. A resume of A's graphed run from its step-10 checkpoint, graphed again: steps 11-30 equal
#      the uninterrupted run's (a checkpoint replays exactly; the graph is captured afresh).
#   C. tiny-llama (RMSNorm, SwiGLU, rope), grad-accum 2 (the fp32 main grads zeroed and summed
#      inside the graph; their hooks hold the AccumulateGrad nodes from the eager steps on, which
#      is why the run keeps to one side stream), 20 steps, --deterministic: bit for bit.
#   D. Without --deterministic (flash attention's backward sums in another order each run):
#      every step's loss within 1e-2 relative of the eager run's, as gpu.kernels_train bounds two
#      bf16 runs; the graphed run's tokens/s printed beside the eager one's (speed is kiln
#      bench's: the device kit's A/B).
source "$(dirname "$0")/common.sh"
need_cuda
export KILN_DEVICE_CHECK=1
cd "$work"
python3 - <<'PY'
import random, struct
random.seed(3)
def shard(name, n):
    toks = [random.randrange(256) for _ in range(n)]
    with open(name, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *toks))
shard("train.bin", 400000)
shard("val.bin", 40000)
PY
A=(train --device cuda --model tiny --precision bf16 --dropout 0.1 --micro-batch 8 --steps 30 --log-every 100 --deterministic
   --data train.bin --val-data val.bin --eval-every 10 --eval-batches 2 --save-every 10)
"$KILN_BIN" "${A[@]}" --save-dir ck_eager --log-json a_eager.jsonl >/dev/null
"$KILN_BIN" "${A[@]}" --save-dir ck_graph --cuda-graph --log-json a_graph.jsonl >/dev/null
"$KILN_BIN" "${A[@]}" --save-dir ck_graph --cuda-graph --resume ck_graph/step_00000010 --log-json b_graph.jsonl >/dev/null
C=(train --device cuda --model tiny-llama --precision bf16 --micro-batch 4 --grad-accum 2 --steps 20 --log-every 100 --deterministic)
"$KILN_BIN" "${C[@]}" --log-json c_eager.jsonl >/dev/null
"$KILN_BIN" "${C[@]}" --cuda-graph --log-json c_graph.jsonl >/dev/null
D=(train --device cuda --model tiny --precision bf16 --micro-batch 16 --steps 30 --log-every 100)
"$KILN_BIN" "${D[@]}" --log-json d_eager.jsonl >/dev/null
"$KILN_BIN" "${D[@]}" --cuda-graph --log-json d_graph.jsonl >/dev/null
python3 - <<'PY'
import json, sys
load = lambda n: [json.loads(l) for l in open(f"{n}.jsonl")]
steps = lambda rs: {r["step"]: r for r in rs if r["type"] == "step"}
evals = lambda rs: [(r["step"], r["val_loss"]) for r in rs if r["type"] == "eval"]
bad = []
for name, n in (("a", 30), ("c", 20)):
    e, g = load(f"{name}_eager"), load(f"{name}_graph")
    if g[0]["config"]["cuda_graph"] is not True or e[0]["config"]["cuda_graph"] is not False: bad.append((name, "cuda_graph not recorded"))
    se, sg = steps(e), steps(g)
    if len(se) != n or len(sg) != n: bad.append((name, "steps", len(se), len(sg)))
    diff = [k for k in se if (se[k]["loss"], se[k]["grad_norm"], se[k]["lr"]) != (sg[k]["loss"], sg[k]["grad_norm"], sg[k]["lr"])]
    if diff: bad.append((name, "steps differ", [(k, se[k]["loss"], sg[k]["loss"]) for k in diff[:5]]))
    if (e[-1]["param_sum"], e[-1]["param_sq"]) != (g[-1]["param_sum"], g[-1]["param_sq"]): bad.append((name, "final weights differ"))
    syncs = sorted({r.get("host_syncs_before_update") for k, r in sg.items() if k != 3})  # 3: the capture (its cache release syncs once)
    if syncs != [0]: bad.append((name, "host syncs before the update", syncs))
    if name == "a" and evals(e) != evals(g): bad.append((name, "evaluations", evals(e), evals(g)))
    print(f"{name}: {n} steps, --cuda-graph == eager bit for bit: {not diff}; loss {se[1]['loss']:.4f} -> {sg[n]['loss']:.4f}; "
          f"evaluations {evals(g)}; tokens/s eager {se[n]['tokens_per_s']:.0f}, graphed {sg[n]['tokens_per_s']:.0f}")
g, b = steps(load("a_graph")), steps(load("b_graph"))
if sorted(b) != list(range(11, 31)) or any(b[k]["loss"] != g[k]["loss"] for k in b):
    bad.append(("resume", [(k, g[k]["loss"], b[k]["loss"]) for k in sorted(b) if b[k]["loss"] != g.get(k, {}).get("loss")][:5]))
else:
    print("b: the graphed run resumed from step 10, graphed again: steps 11-30 == the uninterrupted run")
e, g = steps(load("d_eager")), steps(load("d_graph"))
rel = max(abs(e[k]["loss"] - g[k]["loss"]) / e[k]["loss"] for k in e)
print(f"d: without --deterministic, worst relative loss difference {rel:.2e}; tokens/s (step 30) eager {e[30]['tokens_per_s']:.0f}, "
      f"graphed {g[30]['tokens_per_s']:.0f}")
if rel > 1e-2: bad.append(("d", rel))
if bad:
    sys.exit(f"gpu_graph: {bad}")
PY
echo PASS
