#!/usr/bin/env bash
# tests/cli/gpu_kernels.sh -- gpu.kernels_train: the model trained with kiln's fused kernels
# (kernels/) against the composite ops they replace (--kernels reference), on CUDA (labels gpu,
# mpi). Exits 77 (CTest skip) with the reason when no GPU is visible. gpu.kernels checks each
# kernel alone; this checks them in place, in the layouts that reshape their inputs:
#   gpt2-style tiny (LayerNorm, GELU; and with --gelu-epilogue) and tiny-llama (RMSNorm, SwiGLU,
#   rope), bf16, 50 steps;
#   tiny-moe (the experts' SwiGLU), bf16, 20 steps; tiny fp32, 50 steps;
#   tp 2 + sp (norms over a rank's rows; two ranks on the one GPU over MPI), tiny-llama, 20 steps;
#   full activation checkpointing with the fused kernels equal to none (the recomputed forward
#   is the same kernels on the same inputs);
#   kiln sample --kernels fused against reference on a tiny-llama fp32 checkpoint: the record says
#   "fused", and the 24 greedy ids are the reference's (fp32 norms in another order: 1e-6 apart,
#   far below a trained model's margins between its top two logits).
# Bounds: the first 5 steps within the suite's 16-bit tolerances (moe.sh: loss 5e-4, gradient
# norm 2e-2 relative); every step's loss within 1e-2 relative (two bf16 roundings of one
# model drift apart over steps); fp32 within 1e-4 relative every step (the kernels compute in
# fp32 as the composite ops do, in another order). The fused runs record "kernels": "fused" and
# their steps make no host sync before the update (KILN_DEVICE_CHECK's count, as gpu.sync_moe).
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
need_cuda
export KILN_DEVICE_CHECK=1
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe --bind-to none -np "$np" "$KILN_BIN" "$@"; }
both() {  # NAME ARGS...: the run fused and reference
  local name=$1; shift
  for k in fused reference; do "$@" --kernels "$k" --log-json "$work/${name}_$k.jsonl" >/dev/null; done
}
K=train
both gpt2 "$KILN_BIN" $K --device cuda --model tiny --precision bf16 --micro-batch 8 --steps 50 --log-every 100
"$KILN_BIN" $K --device cuda --model tiny --precision bf16 --micro-batch 8 --steps 50 --log-every 100 --kernels fused \
  --gelu-epilogue --log-json "$work/gelu_fused.jsonl" >/dev/null
cp "$work/gpt2_reference.jsonl" "$work/gelu_reference.jsonl"
both llama "$KILN_BIN" $K --device cuda --model tiny-llama --precision bf16 --micro-batch 8 --steps 50 --log-every 100
both moe "$KILN_BIN" $K --device cuda --model tiny-moe --precision bf16 --micro-batch 4 --steps 20 --log-every 100
both fp32 "$KILN_BIN" $K --device cuda --model tiny --precision fp32 --micro-batch 8 --steps 50 --log-every 100
both tpsp mpi 2 $K --device cuda --backend mpi --model tiny-llama --precision bf16 --micro-batch 4 --steps 20 --log-every 100 --tp 2 --sp
"$KILN_BIN" $K --device cuda --model tiny-llama --precision bf16 --micro-batch 8 --steps 10 --log-every 100 \
  --activation-checkpointing full --log-json "$work/ac_full.jsonl" >/dev/null
"$KILN_BIN" $K --device cuda --model tiny-llama --precision fp32 --micro-batch 8 --steps 30 --log-every 100 \
  --save-dir "$work/ck_llama" >/dev/null
for k in fused reference; do
  "$KILN_BIN" sample --checkpoint "$work/ck_llama" --device cuda --prompt "the" --temperature 0 --max-new-tokens 24 \
    --kernels "$k" --json >"$work/sample_$k.json" 2>/dev/null
done
python3 - "$work" <<'PY'
import json, sys
d = sys.argv[1]
sf, sr = json.load(open(f"{d}/sample_fused.json")), json.load(open(f"{d}/sample_reference.json"))
assert (sf["kernels"], sr["kernels"]) == ("fused", "reference"), (sf["kernels"], sr["kernels"])
assert sf["ids"] == sr["ids"], (sf["ids"], sr["ids"])
print(f"kiln sample --kernels fused: {len(sf['ids'])} greedy ids = the reference's")
load = lambda n: [json.loads(l) for l in open(f"{d}/{n}.jsonl")]
steps = lambda rs: [r for r in rs if r["type"] == "step"]
bad = []
for name, n, tol in (("gpt2", 50, 1e-2), ("gelu", 50, 1e-2), ("llama", 50, 1e-2), ("moe", 20, 1e-2), ("fp32", 50, 1e-4), ("tpsp", 20, 1e-2)):
    f, r = load(f"{name}_fused"), load(f"{name}_reference")
    if name == "gelu" and f[0]["config"]["gelu_epilogue"] is not True: bad.append((name, "gelu_epilogue not recorded"))
    if f[0]["kernels"] != "fused" or r[0]["kernels"] != "reference":
        bad.append((name, "recorded kernels", f[0]["kernels"], r[0]["kernels"]))
    sf, sr = steps(f), steps(r)
    rel = [abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(sf, sr)]
    gn = [abs(a["grad_norm"] - b["grad_norm"]) / abs(b["grad_norm"]) for a, b in zip(sf[:5], sr[:5])]
    syncs = [a.get("host_syncs_before_update") for a in sf]
    print(f"{name}: loss {sr[0]['loss']:.4f} -> fused {sf[-1]['loss']:.4f} / reference {sr[-1]['loss']:.4f}; "
          f"worst relative loss difference {max(rel):.2e} (steps 1-5: {max(rel[:5]):.2e}), grad norm steps 1-5 {max(gn):.2e}; "
          f"fused host syncs before the update {sorted(set(syncs))}; "
          f"tokens/s fused {sf[-1]['tokens_per_s']:.0f} reference {sr[-1]['tokens_per_s']:.0f}")
    if len(sf) != n or len(sr) != n: bad.append((name, "steps", len(sf), len(sr)))
    if max(rel) > tol: bad.append((name, "loss", max(rel), tol))
    if tol > 1e-4 and (max(rel[:5]) > 5e-4 or max(gn) > 2e-2): bad.append((name, "first steps", max(rel[:5]), max(gn)))
    if not sf[-1]["loss"] < 0.9 * sf[0]["loss"]: bad.append((name, "fused loss did not fall", sf[0]["loss"], sf[-1]["loss"]))
    if any(s != 0 for s in syncs if s is not None) or all(s is None for s in syncs): bad.append((name, "host syncs", syncs))
a, b = steps(load("ac_full")), steps(load("llama_fused"))[:10]
rel = max(abs(x["loss"] - y["loss"]) / y["loss"] for x, y in zip(a, b))
print(f"full activation checkpointing, fused: worst relative loss difference to none {rel:.2e}")
if rel > 1e-6: bad.append(("activation checkpointing", rel))
if bad:
    sys.exit(f"gpu_kernels: {bad}")
PY
echo "PASS"
