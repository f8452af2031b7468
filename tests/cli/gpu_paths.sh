#!/usr/bin/env bash
# tests/cli/gpu_paths.sh -- what only a GPU can check (labels gpu, mpi). Exits 77 (CTest skip)
# with the reason when no GPU is visible.
#   NCCL as a world of one: `mpirun -np 1 kiln train --backend nccl` (communicator, DDP wrapper,
#     NCCL all-reduce on its own stream) matches the plain single-process run within a relative
#     1e-6 (a world of one averages over one rank: the same fp32 values, so only the order of
#     work on the streams could differ).
#   bf16 and fp16 on CUDA train (the loss falls) and fp16 starts without overflow at 2^16.
#   Activation checkpointing on CUDA: full and selective give the losses of none (dropout on:
#     the CUDA RNG state is replayed) and full lowers the peak memory.
#   GQA's attention kernel (issue 34, defect 3; models/gpt.h grouped_attention): with 2 kv heads
#     for 4 query heads, no layout runs SDPA's math kernel -- fp32 (flash refuses it), bf16
#     (flash), and context parallelism's masked attention (cp 2, two ranks over MPI on the one
#     GPU) -- read from the profiles' host operators (aten::_scaled_dot_product_*); the kernel
#     each got is printed for docs/sequence_parallel.md.
#   --deterministic makes replay bit-identical on CUDA (issue 34, defect 6; docs/checkpoints.md):
#     bf16 with dropout, 10 steps straight against 5 + a resume, steps 6-10 and the weights `==`.
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
need_cuda
T=(train --device cuda --model tiny --micro-batch 8 --steps 30 --log-every 30)
"$KILN_BIN" "${T[@]}" --log-json "$work/plain.jsonl" >/dev/null
timeout 300 "$MPIEXEC" --allow-run-as-root -np 1 "$KILN_BIN" "${T[@]}" --backend nccl --log-json "$work/nccl.jsonl" >/dev/null
for p in bf16 fp16; do
  "$KILN_BIN" "${T[@]}" --precision "$p" --log-json "$work/$p.jsonl" >/dev/null
done
A=(train --device cuda --model tiny --dropout 0.1 --micro-batch 16 --steps 5 --log-every 5)
for m in none full selective; do
  "$KILN_BIN" "${A[@]}" --activation-checkpointing "$m" --log-json "$work/ac_$m.jsonl" >/dev/null
done
G=(train --device cuda --model tiny --n-head 4 --n-kv-head 2 --micro-batch 4 --steps 3 --log-every 3 --profile-start 2 --profile-steps 1)
"$KILN_BIN" "${G[@]}" --profile "$work/gqa_fp32.trace.json" >/dev/null
"$KILN_BIN" "${G[@]}" --precision bf16 --profile "$work/gqa_bf16.trace.json" >/dev/null
timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe --bind-to none -np 2 "$KILN_BIN" "${G[@]}" --backend mpi --cp 2 \
  --precision bf16 --profile "$work/gqa_cp2.trace.json" >/dev/null
D=(train --device cuda --model tiny --dropout 0.1 --precision bf16 --micro-batch 8 --steps 10 --log-every 10 --deterministic)
"$KILN_BIN" "${D[@]}" --log-json "$work/det_straight.jsonl" >/dev/null
"$KILN_BIN" "${D[@]}" --stop-at-step 5 --save-dir "$work/det" >/dev/null
"$KILN_BIN" "${D[@]}" --save-dir "$work/det" --log-json "$work/det_resumed.jsonl" >/dev/null
python3 - "$work" <<'PY'
import json, sys
d = sys.argv[1]
load = lambda n: [json.loads(l) for l in open(f"{d}/{n}.jsonl")]
a, b = load("det_straight"), load("det_resumed")
assert a[0]["config"]["deterministic"] is True, a[0]["config"].get("deterministic")
sa = {r["step"]: (r["loss"], r["grad_norm"]) for r in a if r["type"] == "step"}
sb = {r["step"]: (r["loss"], r["grad_norm"]) for r in b if r["type"] == "step"}
assert sorted(sb) == list(range(6, 11)), sorted(sb)
assert all(sa[k] == sb[k] for k in sb), [(k, sa[k], sb[k]) for k in sb if sa[k] != sb[k]]
assert a[-1]["param_sq"] == b[-1]["param_sq"], (a[-1]["param_sq"], b[-1]["param_sq"])
print("--deterministic: replay on CUDA bit-identical (steps 6-10 and the weights' sum of squares)")
PY
python3 - "$work" <<'PY'
import re, sys
d = sys.argv[1]
for name in ("gqa_fp32", "gqa_bf16", "gqa_cp2"):
    kernels = sorted(set(re.findall(r'"name": ?"(aten::_scaled_dot_product_[a-z_]+?)(?:_backward)?"', open(f"{d}/{name}.trace.json").read())))
    print(f"{name}: SDPA ran {kernels}")
    assert kernels, name
    assert not any("math" in k for k in kernels), (name, kernels)
PY
python3 - "$work" <<'PY'
import json, sys
d = sys.argv[1]
load = lambda n: [json.loads(l) for l in open(f"{d}/{n}.jsonl")]
steps = lambda rs: [r for r in rs if r["type"] == "step"]
plain, nccl = load("plain"), load("nccl")
assert nccl[0]["world"]["backend"] == "nccl", nccl[0]["world"]
rel = lambda a, b: abs(a - b) / abs(a)
worst = max(rel(a[k], b[k]) for a, b in zip(steps(plain), steps(nccl)) for k in ("loss", "grad_norm"))
worst = max(worst, rel(plain[-1]["param_sq"], nccl[-1]["param_sq"]))
print(f"NCCL world of one matches the plain run within {worst:.1e}")
assert worst <= 1e-6, worst
for p in ("bf16", "fp16"):
    s = steps(load(p))
    assert s[-1]["loss"] < s[0]["loss"] - 1.0, (p, s[0]["loss"], s[-1]["loss"])
    assert not any(r["skipped"] for r in s[:3]) or p == "fp16"
    print(f"{p}: loss {s[0]['loss']:.3f} -> {s[-1]['loss']:.3f}, skipped {sum(r['skipped'] for r in s)}")
ac = {m: load("ac_" + m) for m in ("none", "full", "selective")}
for m in ("full", "selective"):
    a = [r["loss"] for r in steps(ac["none"])]; b = [r["loss"] for r in steps(ac[m])]
    print(f"activation checkpointing {m}: losses within {max(rel(x, y) for x, y in zip(a, b)):.1e} of none")
    assert max(rel(x, y) for x, y in zip(a, b)) <= 1e-5, (m, a, b)
peak = {m: ac[m][-1]["peak_mem_gb"] for m in ac}
assert peak["full"] < peak["none"], peak
print("activation checkpointing on CUDA: losses equal; peak GB", peak)
PY
echo "PASS"
