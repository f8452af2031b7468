#!/usr/bin/env bash
# tests/cli/param_dtype.sh -- 16-bit working weights with fp32 masters (--param-dtype, optim/adamw.h)
# and DDP's reduction dtype (--reduce-dtype, parallel/ddp.h) on the ZeRO-0 layouts (one process,
# DDP, tp, pp); tests/cli/param_dtype_zero.sh has ZeRO's.
#
# 1. Parity, per policy (bf16 and fp16 working weights, each with its compute precision), global
#    batch 16: one process (micro-batch 4 x grad-accum 4), DDP 2 (4 x 2) and DDP 4 (4 x 1); then
#    (1b below) tp 2, pp 2 and dp 2 x tp 2 x pp 2. Every
#    micro-batch of 4 sees the same 16-bit weights and so yields the same 16-bit gradient on every
#    layout; those are summed in fp32 (the main grads) in another order (micro-steps, then the
#    all-reduce: ~1e-7 relative), the fp32 masters move by the same AdamW arithmetic, and the
#    16-bit copies are their rounding. Tolerance: 1e-5 relative on loss and gradient norm per step
#    and on the final weights' fingerprint, ddp_parity.sh's (measured: 0 over 20 steps). A real
#    defect (16-bit accumulation, a lost micro-step, masters not written back) moves them by 1e-3
#    or more. Every run computes with one thread per rank (OMP_NUM_THREADS=1; each DDP rank of 2 or
#    4 on 2 cores gets one anyway): LibTorch's CPU kernels split a bf16 reduction (a bias or
#    LayerNorm gradient) by thread, so 1 and 2 threads round 16-bit gradients differently, 2e-6 at
#    the first step and 1e-4 after 6 -- the CPU's threads, not the layout, which this test is about.
# 2. --reduce-dtype bf16 at DDP 2: the bucket traffic is exactly half (the verdict's unchanged),
#    and the run stays within 1e-2 of the fp32 reduction over 10 steps (20 when measured) on the loss and within 1e-2
#    on every step's gradient norm (each mean gradient rounded once to bf16's 8 bits; measured
#    3.3e-5 and 1.2e-3). The norm is what shows a reduction that sums instead of averaging:
#    clipping and AdamW's normalisation hide a doubled gradient from the loss (planted: 4.5e-5,
#    which passed), not from the norm (planted: 1.005, twice the norm).
# 3. The model-state bytes in the config record: 2 (bf16 weights) + 4 (fp32 main grads) + 12
#    (fp32 master, m, v) per parameter, against 4 + 4 + 8 for fp32 working weights; kiln plan
#    --compare predicts them and comm_bytes exactly.
# 4. Convergence: the tiny model, bf16 working weights against fp32 working weights (both
#    computing in bf16) over 300 steps, and fp16 with the dynamic loss scaler likewise over 60 (the
#    CPU computes fp16 25x slower than fp32: 300 fp16 steps took 145 s of this test; fp16 runs at a
#    context of 64, 60 steps: 1.97436 and 1.97437; the 300-step
#    figures are docs/benchmarks.md's): the mean loss of the last 10 steps within 2%. A master that
#    is not written back leaves the 16-bit run near its first loss (6.2 against 2.0 at step 60).
# 5. Checkpoints hold the fp32 masters: a bf16-weights run saved at step 5 resumes replay-exact
#    (steps 6-10 == the uninterrupted run's), and resumes under fp32 working weights (a policy
#    change: --allow-config-change), whose first loss equals the bf16 run's step 6 within the
#    bf16 rounding of the weights (1e-2).
# 6. The default (auto) is the compute precision's weights; bad combinations: one line, exit 2.
# 7. --main-grads auto against always (below).
# 8. --logits-dtype bf16 against the default fp32 logits (below).
source "$(dirname "$0")/common.sh"
here=$(cd "$(dirname "$0")" && pwd)
: "${MPIEXEC:=mpirun}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
cd "$work"
T=(train --device cpu --log-every 20 --dropout 0)
# 10 steps, in bf16 and in fp16 (fp16 at a context of 64: this CPU computes it 13x slower than bf16;
# the parity is a property of every step and every token: fewer of them only shorten the
# drift a defect has to show in; bf16 ran 20 until a defect planted in
# ZeRO showed in 2, tests/cli/param_dtype_zero.sh).
steps_of() { echo 10; }
shape_of() { if [ "$1" = fp16 ]; then echo --seq-len 64; fi; }

# 1. and 3.
# The single-process references run in the background, one thread each, beside the DDP runs: the
# test holds two cores, and a one-thread run alone leaves one idle (one thread gives the same
# arithmetic whatever runs beside it).
refs=()
for p in bf16 fp16; do
  # shellcheck disable=SC2046
  "$KILN_BIN" "${T[@]}" --precision "$p" --param-dtype "$p" --steps "$(steps_of "$p")" $(shape_of "$p") --micro-batch 4 --grad-accum 4 \
    --log-json "ref_$p.jsonl" >/dev/null & refs+=($!)
done
"$KILN_BIN" "${T[@]}" --steps 10 --precision bf16 --param-dtype fp32 --micro-batch 4 --grad-accum 4 --log-json ref_fp32w.jsonl >/dev/null & refs+=($!)
for p in bf16 fp16; do
  # shellcheck disable=SC2046
  P=(--precision "$p" --param-dtype "$p" --steps "$(steps_of "$p")" $(shape_of "$p"))
  mpi 2 "$KILN_BIN" "${T[@]}" "${P[@]}" --micro-batch 4 --grad-accum 2 --log-json "np2_$p.jsonl" >/dev/null
  mpi 4 "$KILN_BIN" "${T[@]}" "${P[@]}" --micro-batch 4 --grad-accum 1 --log-json "np4_$p.jsonl" >/dev/null
done
for pid in "${refs[@]}"; do wait "$pid" || fail "a single-process reference run"; done
python3 - <<'PY'
import json
load = lambda n: [json.loads(l) for l in open(f"{n}.jsonl")]
steps = lambda run: [r for r in run if r["type"] == "step"]
rel = lambda a, b: abs(a - b) / max(abs(a), 1e-30)
# Tolerances (relative). bf16: 1e-5 on everything (see above). fp16: each backward's gradients are
# scaled by S/K (the loss scale over the micro-steps per rank), and K differs between the layouts
# (4, 2, 1): fp16 gradients below 2^-14 are subnormal, with a precision that depends on the scale,
# so the smallest gradients round differently -- as they do today with fp32 working weights under
# fp16 (measured: 2.4e-4 on the gradient norm, 3e-6 on the loss, over 20 steps; 8.1e-5 and
# 3.8e-6 over 10 at a context of 128; 8.2e-5 and 5.0e-6 over the 10 at 64 run now). Held to 1e-5 on
# the loss, 1e-3 on the norm, 1e-4 on the final fingerprint.
tol = {"bf16": {"loss": 1e-5, "grad_norm": 1e-5, "param": 1e-5}, "fp16": {"loss": 1e-5, "grad_norm": 1e-3, "param": 1e-4}}
for p in ("bf16", "fp16"):
    ref = load(f"ref_{p}")
    c = ref[0]
    assert c["config"]["param_dtype"] == p, c["config"]
    n = c["params_local"]
    # No autocast copies: the weights are already in the compute dtype.
    assert c["model_state"]["device"] == {"params": 2 * n, "grads": 4 * n, "optimizer": 12 * n, "cast_copies": 0}, c["model_state"]
    for name, dp in (("np2", 2), ("np4", 4)):
        run = load(f"{name}_{p}")
        assert run[0]["world"]["dp"] == dp and len(steps(run)) == 10
        worst = {}
        for a, b in zip(steps(ref), steps(run)):
            for key in ("loss", "grad_norm"):
                worst[key] = max(worst.get(key, 0.0), rel(a[key], b[key]))
                assert rel(a[key], b[key]) <= tol[p][key], (p, name, a["step"], key, a[key], b[key])
        for key in ("param_sum", "param_sq"):
            worst["param"] = max(worst.get("param", 0.0), rel(ref[-1][key], run[-1][key]))
            assert rel(ref[-1][key], run[-1][key]) <= tol[p]["param"], (p, name, key)
        print(f"{p} working weights, {name} vs one process: " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))
w = load("ref_fp32w")[0]["model_state"]["device"]
n = load("ref_fp32w")[0]["params_local"]
assert (w["params"], w["grads"], w["optimizer"]) == (4 * n, 4 * n, 8 * n), w
# fp32 weights under bf16 autocast: its cache keeps a 2-byte copy of every block matrix and the
# c_attn / c_fc / c_proj biases (optim/precision.h): every block parameter but the LayerNorms'.
c = load("ref_fp32w")[0]["config"]
d, L = c["d_model"], c["n_layer"]
f = c.get("mlp_hidden") or 4 * d
kv = c.get("n_kv_head") or c["n_head"]
hd = d // c["n_head"]
qkv = (c["n_head"] + 2 * kv) * hd
block_products = d * qkv + qkv + c["n_head"] * hd * d + d + d * f + f + f * d + d
assert w["cast_copies"] == 2 * L * block_products, (w, L, block_products)
print(f"model states per parameter: bf16 weights 2 + 4 + 12 = 18 B, fp32 weights 4 + 4 + 8 = 16 B ({n} parameters), "
      f"plus autocast's copies {w['cast_copies']} B")
PY

# 1b. tp 2, pp 2 and dp 2 x tp 2 x pp 2 (8 ranks), the same global batch of 16. tp splits each
#    matrix product's sum over 2 ranks (each partial sum rounded to 16 bits before the all-reduce)
#    and pp runs each stage's forward in its own autocast scope, so with 16-bit compute these runs
#    differ from one process by more than the order of fp32 additions -- with fp32 working weights
#    today too -- and 16-bit weights (a 16-bit residual stream, and on the CPU 16-bit LayerNorms)
#    carry those roundings further. Measured over 20 steps (loss / grad norm / fingerprint):
#      bf16 compute, fp32 weights: tp 2 4.0e-5 / 1.3e-3 / 7.7e-7, pp 2 2.3e-5 / 1.3e-3 / 3.3e-5
#      bf16 compute, bf16 weights: tp 2 9.4e-5 / 6.6e-3 / 3.4e-5, pp 2 4.1e-5 / 1.9e-3 / 1.4e-5
#      fp16 compute, fp16 weights: tp 2 6.3e-6 / 4.3e-4 / 2.9e-6, pp 2 4.9e-6 / 1.3e-4 / 1.0e-5
#        (over 10 steps: tp 2 5.5e-6 / 1.6e-4 / 6.0e-7, pp 2 1.9e-6 / 1.5e-4 / 2.8e-6; at the
#        context of 64 run now: tp 2 6.9e-6 / 1.2e-4 / 3.3e-6, pp 2 2.8e-6 / 7.4e-5 / 3.3e-6)
#    Held to 5e-4 on the loss, 2e-2 on the gradient norm (late steps' norms are small and most
#    sensitive) and 2e-4 on the fingerprint. The tied-embedding gradient left unsynced under pp 2
#    (a real defect, tried once by hand) moved them by 2.7e-2 / 5.2e-1 / 3.2e-3.
for p in bf16 fp16; do
  # shellcheck disable=SC2046
  P=(--precision "$p" --param-dtype "$p" --micro-batch 4 --steps "$(steps_of "$p")" $(shape_of "$p"))
  mpi 2 "$KILN_BIN" "${T[@]}" "${P[@]}" --grad-accum 4 --tp 2 --log-json "tp2_$p.jsonl" >/dev/null
  mpi 2 "$KILN_BIN" "${T[@]}" "${P[@]}" --grad-accum 4 --pp 2 --log-json "pp2_$p.jsonl" >/dev/null
done
mpi 8 "$KILN_BIN" "${T[@]}" --steps 10 --precision bf16 --param-dtype bf16 --micro-batch 4 --grad-accum 2 --tp 2 --pp 2 --log-json 3d_bf16.jsonl >/dev/null
python3 - <<'PY'
import json
load = lambda n: [json.loads(l) for l in open(f"{n}.jsonl")]
steps = lambda run: [r for r in run if r["type"] == "step"]
rel = lambda a, b: abs(a - b) / max(abs(a), 1e-30)
for p, name, shape in (("bf16", "tp2", (1, 2, 1)), ("bf16", "pp2", (1, 1, 2)), ("fp16", "tp2", (1, 2, 1)), ("fp16", "pp2", (1, 1, 2)),
                       ("bf16", "3d", (2, 2, 2))):
    ref, run = load(f"ref_{p}"), load(f"{name}_{p}")
    w = run[0]["world"]
    assert (w["dp"], w["tp"], w["pp"]) == shape and run[0]["config"]["param_dtype"] == p, w
    assert len(steps(run)) == 10
    worst = {}
    for a, b in zip(steps(ref), steps(run)):
        for key, tol in (("loss", 5e-4), ("grad_norm", 2e-2)):
            worst[key] = max(worst.get(key, 0.0), rel(a[key], b[key]))
            assert rel(a[key], b[key]) <= tol, (p, name, a["step"], key, a[key], b[key])
    for key in ("param_sum", "param_sq"):
        worst["param"] = max(worst.get("param", 0.0), rel(ref[-1][key], run[-1][key]))
        assert rel(ref[-1][key], run[-1][key]) <= 2e-4, (p, name, key, ref[-1][key], run[-1][key])
    print(f"{p} working weights, {name} vs one process: " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))
PY

# 2.
mpi 2 "$KILN_BIN" "${T[@]}" --steps 10 --precision bf16 --param-dtype bf16 --micro-batch 4 --grad-accum 2 --reduce-dtype bf16 \
  --log-json np2_red16.jsonl >/dev/null
python3 - <<'PY'
import json
load = lambda n: [json.loads(l) for l in open(f"{n}.jsonl")]
a, b = load("np2_bf16"), load("np2_red16")
n = a[0]["params_local"]
assert b[0]["config"]["reduce_dtype"] == "bf16"
sa = [r for r in a if r["type"] == "step"]
sb = [r for r in b if r["type"] == "step"]
# comm_bytes counts an all-reduce of B bytes as 2B (a ring's reduce-scatter + all-gather): the
# buckets are 2 x 4n bytes in fp32 and 2 x 2n in bf16; what remains is the verdict, the same.
for x, y in zip(sa, sb):
    assert x["comm_bytes"] - 8 * n == y["comm_bytes"] - 4 * n, (x["step"], x["comm_bytes"], y["comm_bytes"], n)
worst = max(abs(x["loss"] - y["loss"]) / x["loss"] for x, y in zip(sa, sb))
assert worst <= 1e-2, worst
norm = max(abs(x["grad_norm"] - y["grad_norm"]) / x["grad_norm"] for x, y in zip(sa, sb))
assert norm <= 1e-2, [(x["step"], x["grad_norm"], y["grad_norm"]) for x, y in zip(sa, sb)]
print(f"--reduce-dtype bf16: {sa[0]['comm_bytes']} -> {sb[0]['comm_bytes']} bytes per step (the buckets' half); "
      f"losses within {worst:.1e}, gradient norms within {norm:.1e}")
PY

# kiln plan models both (plan/cost_model.cpp): --compare's exact rows, model-state bytes and
# comm_bytes, equal the runs'.
# kiln plan --compare, one call for the seven logs (its --json: one report per --compare, in order).
logs=(ref_bf16 np2_bf16 np2_red16 np4_fp16 tp2_bf16 pp2_fp16 3d_bf16)
"$KILN_BIN" plan $(printf -- "--compare %s.jsonl " "${logs[@]}") --json >cmp.json || fail "kiln plan --compare ${logs[*]}"
python3 "$here/compare_exact.py" cmp.json "${logs[@]}"

# 4.
# Two at a time: each run computes on one thread (OMP_NUM_THREADS=1 above), and the test holds two
# cores (PROCESSORS 2); one thread gives the same arithmetic whatever runs beside it.
pair() {  # pair PRECISION STEPS: its fp32-weights run and its 16-bit-weights run, side by side
  # shellcheck disable=SC2046
  local C=(train --device cpu --steps "$2" --log-every "$2" --micro-batch 4 $(shape_of "$1"))
  "$KILN_BIN" "${C[@]}" --precision "$1" --param-dtype fp32 --log-json "c_$1_fp32w.jsonl" >/dev/null & local a=$!
  "$KILN_BIN" "${C[@]}" --precision "$1" --param-dtype "$1" --log-json "c_$1_$1w.jsonl" >/dev/null & local b=$!
  wait "$a" || fail "$1 fp32-weights convergence run"
  wait "$b" || fail "$1 $1-weights convergence run"
}
pair bf16 300
pair fp16 60
python3 - <<'PY'
import json
def losses(n, steps):
    s = [json.loads(l)["loss"] for l in open(f"{n}.jsonl") if '"type":"step"' in l]
    assert len(s) == steps
    return s
for p, n in (("bf16", 300), ("fp16", 60)):
    la, lb = losses(f"c_{p}_fp32w", n), losses(f"c_{p}_{p}w", n)
    assert la != lb, "the two policies ran the same arithmetic"
    a, b = sum(la[-10:]) / 10, sum(lb[-10:]) / 10
    print(f"{p}: {n} steps, mean of the last 10 losses: fp32 weights {a:.5f}, {p} weights {b:.5f} ({abs(b - a) / a:.3%} apart)")
    assert abs(b - a) <= 0.02 * a
    assert a < 0.5 * la[0], (p, la[0], a)  # and both trained
PY

# 5.
R=(train --device cpu --steps 10 --log-every 20 --precision bf16 --micro-batch 4)
"$KILN_BIN" "${R[@]}" --param-dtype bf16 --log-json full.jsonl >/dev/null
"$KILN_BIN" "${R[@]}" --param-dtype bf16 --save-dir ck --save-every 5 --stop-at-step 8 >/dev/null
"$KILN_BIN" "${R[@]}" --param-dtype bf16 --save-dir ck --resume ck/step_00000005 --log-json resumed.jsonl >/dev/null
"$KILN_BIN" "${R[@]}" --param-dtype fp32 --save-dir ck2 --resume ck/step_00000005 --allow-config-change --log-json fp32w.jsonl >fp32w.out
grep -q "param_dtype" fp32w.out || { cat fp32w.out; fail "the policy change was not reported"; }
python3 - <<'PY'
import json, struct
s = lambda n: {r["step"]: r["loss"] for r in map(json.loads, open(f"{n}.jsonl")) if r["type"] == "step"}
full, resumed, other = s("full"), s("resumed"), s("fp32w")
assert sorted(resumed) == list(range(6, 11)), sorted(resumed)
assert all(resumed[k] == full[k] for k in resumed), [(k, resumed[k], full[k]) for k in resumed if resumed[k] != full[k]]
rel = abs(other[6] - full[6]) / full[6]
assert rel <= 1e-2, (other[6], full[6])
# The checkpoint's weights are fp32 (F32 in model.safetensors) and not all bf16-representable.
raw = open("ck/step_00000005/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
specs = {k: v for k, v in header.items() if k != "__metadata__"}
assert all(v["dtype"] == "F32" for v in specs.values())
k, v = next((k, v) for k, v in specs.items() if k.endswith("c_fc.weight"))
lo, hi = v["data_offsets"]
vals = struct.unpack(f"<{(hi - lo) // 4}f", raw[8 + n + lo:8 + n + hi])
frac = sum(1 for x in vals if (struct.unpack("<I", struct.pack("<f", x))[0] & 0xFFFF) != 0) / len(vals)
assert frac > 0.5, frac
print(f"resume: steps 6-10 == the uninterrupted run; under fp32 weights step 6 within {rel:.1e}; "
      f"checkpoint F32, {frac:.0%} of {k} not bf16-representable (the masters)")
PY

# 7. --main-grads auto (the default): at grad-accum 1 with no data-parallel reduction and no
#    pipeline, AdamW reads the 16-bit gradients autograd leaves instead of fp32 main grads holding
#    0 + float(g) -- the same numbers (float(g) is exact), so the runs are equal bit for bit to
#    --main-grads always: every step's loss and gradient norm and the final fingerprint, bf16, fp16
#    (with the loss scaler) and tp 2 (the norm over tp through the parameters' own gradients). The
#    model-state record says 2 bytes of gradient a parameter instead of 4, and kiln plan --compare
#    predicts it exactly. (A defect that dropped the gradients -- the update reading the masters'
#    empty .grad -- leaves the weights where they started: every later loss differs.)
G=(train --device cpu --log-every 20 --dropout 0 --steps 10 --micro-batch 4)
"$KILN_BIN" "${G[@]}" --precision bf16 --log-json mg_bf16_auto.jsonl >/dev/null & a=$!
"$KILN_BIN" "${G[@]}" --precision bf16 --main-grads always --log-json mg_bf16_always.jsonl >/dev/null
wait "$a" || fail "--main-grads auto, bf16"
"$KILN_BIN" "${G[@]}" --precision fp16 --seq-len 64 --log-json mg_fp16_auto.jsonl >/dev/null & a=$!
"$KILN_BIN" "${G[@]}" --precision fp16 --seq-len 64 --main-grads always --log-json mg_fp16_always.jsonl >/dev/null
wait "$a" || fail "--main-grads auto, fp16"
mpi 2 "$KILN_BIN" "${G[@]}" --precision bf16 --tp 2 --log-json mg_tp2_auto.jsonl >/dev/null
mpi 2 "$KILN_BIN" "${G[@]}" --precision bf16 --tp 2 --main-grads always --log-json mg_tp2_always.jsonl >/dev/null
python3 - <<'PY'
import json
load = lambda n: [json.loads(l) for l in open(f"{n}.jsonl")]
for name in ("bf16", "fp16", "tp2"):
    a, b = load(f"mg_{name}_auto"), load(f"mg_{name}_always")
    assert a[0]["config"]["main_grads"] == "auto" and b[0]["config"]["main_grads"] == "always"
    sa = [(r["step"], r["loss"], r["grad_norm"]) for r in a if r["type"] == "step"]
    sb = [(r["step"], r["loss"], r["grad_norm"]) for r in b if r["type"] == "step"]
    assert len(sa) == 10 and sa == sb, (name, [(x, y) for x, y in zip(sa, sb) if x != y])
    assert (a[-1]["param_sum"], a[-1]["param_sq"]) == (b[-1]["param_sum"], b[-1]["param_sq"]), name
    n = a[0]["params_local"]
    da, db = a[0]["model_state"]["device"], b[0]["model_state"]["device"]
    assert (da["params"], da["grads"], da["optimizer"]) == (2 * n, 2 * n, 12 * n), (name, da)
    assert (db["params"], db["grads"], db["optimizer"]) == (2 * n, 4 * n, 12 * n), (name, db)
    print(f"--main-grads auto == always bit for bit ({name}, 10 steps); gradients {da['grads']} B instead of {db['grads']} B")
PY
logs=(mg_bf16_auto mg_fp16_auto mg_tp2_auto mg_tp2_always)
"$KILN_BIN" plan $(printf -- "--compare %s.jsonl " "${logs[@]}") --json >cmp_mg.json || fail "kiln plan --compare ${logs[*]}"
python3 "$here/compare_exact.py" cmp_mg.json "${logs[@]}"

# 8. --logits-dtype bf16 (models/linear_cross_entropy.h): the loss's logits rounded to bf16, as
#    autocast's plain linear and the PyTorch peers round them. It trains as the default fp32
#    logits do: 100 steps of bf16, the mean of the last 10 losses within 2% (the convergence bound
#    of section 4), the record says which ran, and the runs are not the same arithmetic (one
#    rounding of every logit more).
"$KILN_BIN" train --device cpu --steps 100 --log-every 100 --micro-batch 4 --precision bf16 --log-json lg_fp32.jsonl >/dev/null & a=$!
"$KILN_BIN" train --device cpu --steps 100 --log-every 100 --micro-batch 4 --precision bf16 --logits-dtype bf16 --log-json lg_bf16.jsonl >/dev/null
wait "$a" || fail "the fp32-logits run"
python3 - <<'PY'
import json
load = lambda n: [json.loads(l) for l in open(f"{n}.jsonl")]
a, b = load("lg_fp32"), load("lg_bf16")
assert a[0]["config"]["logits_dtype"] == "fp32" and b[0]["config"]["logits_dtype"] == "bf16"
la = [r["loss"] for r in a if r["type"] == "step"]
lb = [r["loss"] for r in b if r["type"] == "step"]
assert len(la) == len(lb) == 100 and la != lb
ma, mb = sum(la[-10:]) / 10, sum(lb[-10:]) / 10
print(f"--logits-dtype bf16: 100 steps, mean of the last 10 losses {mb:.5f} against fp32 logits' {ma:.5f} ({abs(mb - ma) / ma:.3%} apart); "
      f"step 1 {lb[0]:.6f} vs {la[0]:.6f}")
assert abs(mb - ma) <= 0.02 * ma and mb < 0.5 * lb[0]
PY

# 6. The default policy (auto): the compute precision's working weights.
for p in fp32 bf16 fp16; do
  "$KILN_BIN" train --device cpu --steps 1 --precision "$p" --log-json "default_$p.jsonl" >/dev/null
  python3 - "$p" <<'PY'
import json, sys
p = sys.argv[1]
c = json.loads(open(f"default_{p}.jsonl").readline())
assert c["config"]["param_dtype"] == p, c["config"]["param_dtype"]
n = c["params_local"]
assert c["model_state"]["device"]["params"] == (4 if p == "fp32" else 2) * n, c["model_state"]
print(f"--precision {p} alone: param_dtype {p} (auto)")
PY
done
expect_refused 1 "--param-dtype bf16 keeps the working weights in the compute precision" train --device cpu --steps 1 --param-dtype bf16
expect_refused 1 "--reduce-dtype must be one of bf16, fp32 \\(got 'fp16'\\)" train --device cpu --steps 1 --reduce-dtype fp16
expect_refused 1 "--main-grads must be one of always, auto \\(got 'never'\\)" train --device cpu --steps 1 --main-grads never
echo "PASS"
