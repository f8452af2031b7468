#!/usr/bin/env bash
# tests/cli/plan.sh -- `kiln plan` end to end (labels cli, mpi): the breakdown and --json of one
# layout, --params totals, --search, bad input, and --compare against real `kiln train` runs:
# the model-state bytes and comm_bytes kiln predicts must EQUAL what the runs report (they are
# accounting, not estimates; plan/compare.h).
#
# ZeRO runs (--zero 1|2|3, --offload, --zero-accum), tensor-parallel runs (alone, with DDP and
# full recomputation, with ZeRO-3) and pipeline-parallel runs (pp 2; pp 3, whose default split
# 1,2,1 puts the extra block on the middle stage; dp 2 x pp 2 under ZeRO-1; tp 2 x pp 2) are
# compared in the last blocks. A run's log is rank 0's, so a pipeline run checks stage 0's
# figures, and every stage's block count. Sequence parallelism (tp 2 --sp in fp32; with dp 2,
# ZeRO-1, bf16 and full recomputation) and context parallelism (cp 2 in bf16 under ZeRO-3; cp 4
# at seq 256; cp 2 x tp 2 as a plan suggests it) are compared too, and Mixture-of-Experts runs
# (tiny-moe: one process, DDP dp 2 in bf16, ZeRO-1 dp 2, tp 2, pp 2; and with --ep 2 at dp 2,
# dp 2 x tp 2, ZeRO-1 at dp 4 and pp 2 x ZeRO-1, where comm_bytes less ep_comm_bytes is exact,
# ep_comm_bytes exact from the step's logged rows, and those rows set beside the plan's balanced
# estimate). Last, the command a plan
# suggests runs its layout as pasted (model, precision, layout, batch).
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
plan() { timeout 120 "$KILN_BIN" plan "$@"; }

# ---- one layout: text and JSON -----------------------------------------------------------------
plan --model gpt2-124m --gpu h200 --gpus-per-node 1 --micro-batch 16 >"$work/one.txt"
for want in "memory per device" "communication per step" "step time" "MFU" "120 P^2 / R"; do
  grep -q "$want" "$work/one.txt" || { cat "$work/one.txt"; fail "plan text lacks '$want'"; }
done
plan --model gpt2-124m --gpu h200 --gpus-per-node 1 --micro-batch 16 --json >"$work/one.json"
plan --model gpt2-1.5b --gpu h100 --nodes 2 --zero 1 --activation-checkpointing selective --micro-batch 4 \
  --grad-accum 2 --json >"$work/z1.json"
python3 - "$work" <<'PY'
import json, sys
d = sys.argv[1]
p = json.load(open(f"{d}/one.json"))
assert p["type"] == "plan"
P = p["model"]["params"]
assert P == 124475904, P
st = p["stages"][0]
ms = st["model_state"]["device"]
# ZeRO-0, bf16 by default with its default working weights (--param-dtype auto: bf16, fp32
# masters): 2 + 4 + 12 bytes per parameter, unpadded, and no autocast copies
assert (ms["params"], ms["grads"], ms["optimizer"], ms["cast_copies"]) == (2 * P, 4 * P, 12 * P, 0), ms
assert st["comm_bytes"] == 0 and st["comm"] == []          # one device, no communicator
t = p["time"]
# nothing to wait for: the step is compute only, so MFU is the achieved fraction
assert t["exposed_comm_s"] == 0 and t["bubble_s"] == 0
assert abs(t["mfu"] - p["cluster"]["achieved"]) < 1e-12, t
assert p["memory"]["fits"] is True
tr = p["training"]
assert tr["compute_optimal"] and abs(tr["seconds"] - 120 * tr["params"] ** 2 / tr["cluster_flops"]) < 1e-6 * tr["seconds"]
assert p["run"]["steps"] > 0 and p["run"]["seconds"] > 0 and p["run"]["energy_j"] > 0

z = json.load(open(f"{d}/z1.json"))
assert z["layout"]["dp"] == 16 and z["layout"]["zero"] == 1
st = z["stages"][0]
dev = st["model_state"]["device"]
pp_, n = st["psi_padded"], 16
assert pp_ % (64 * n) == 0 and pp_ >= st["psi"]
assert (dev["params"], dev["grads"], dev["optimizer"]) == (2 * pp_, 4 * pp_, 12 * pp_ // n), dev
assert st["comm_bytes"] == 4 * pp_ + 2 * pp_ + 24, (st["comm_bytes"], pp_)  # fp32 reduce-scatter, bf16 all-gather
links = {c["link"] for c in st["comm"]}
assert links == {"inter-node"}, links                     # dp 16 spans the two nodes
assert z["time"]["hfu"] > z["time"]["mfu"]                # selective recomputation counted in HFU only
print("one layout: text and JSON consistent (ZeRO-0 16 B/param, ZeRO-1 on padded units, comm_bytes, MFU)")
PY

# ---- --params: totals only -----------------------------------------------------------------------
plan --params 7e9 --gpu h100 --nodes 64 --tokens 2e12 --json >"$work/totals.json"
python3 - "$work/totals.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))["training"]
assert t["flops"] == 6 * 7e9 * 2e12, t
R = 512 * 989e12 * 0.4
assert abs(t["cluster_flops"] - R) < 1e-6 * R and abs(t["seconds"] - t["flops"] / R) < 1e-9 * t["seconds"]
assert abs(t["energy_j"] - t["seconds"] * 512 * 700) < 1e-9 * t["energy_j"]
print("--params: T = 6PD, t = T/R, E = t x devices x W")
PY

# ---- --search ---------------------------------------------------------------------------------
plan --model gpt2-1.5b --gpu h100 --nodes 2 --search --global-batch 256 --top 6 >"$work/search.txt"
grep -q "^#1 " "$work/search.txt" && grep -q "why: " "$work/search.txt" || { cat "$work/search.txt"; fail "search text"; }
plan --model gpt2-1.5b --gpu h100 --nodes 2 --search --global-batch 256 --top 6 --json >"$work/search.json"
python3 - "$work/search.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
best = r["best"]
assert 1 <= len(best) <= 6 and r["fitting"] >= len(best)
assert r["candidates"] == r["invalid"] + r["over_device_memory"] + r["over_host_memory"] + r["fitting"], r
for b in best:
    assert b["memory"]["fits"] and b["memory"]["peak_device_bytes"] <= b["cluster"]["device_memory_bytes"], b["layout"]
    assert b["reason"]
# fastest first, to the microsecond (closer is a tie, broken by what the model does not see)
steps = [round(b["time"]["step_s"] * 1e6) for b in best]
assert steps == sorted(steps), steps
print(f"--search: {r['candidates']} tried, {r['fitting']} fit; top {len(best)} fit and are fastest first")
PY

# ---- bad input: one line, exit 2 -----------------------------------------------------------------
expect_fail() {  # expect_fail REGEX ARGS...
  local regex=$1; shift
  local code=0
  timeout 60 "$KILN_BIN" plan "$@" >"$work/out" 2>"$work/err" || code=$?
  [ "$code" -eq 2 ] || { cat "$work/err" >&2; fail "kiln plan $* exited $code (want 2)"; }
  [ "$(wc -l <"$work/err")" -eq 1 ] || { cat "$work/err" >&2; fail "kiln plan $*: not one line on stderr"; }
  [ ! -s "$work/out" ] || fail "kiln plan $*: wrote to stdout"
  grep -Eq "^kiln: error: .*$regex" "$work/err" || { cat "$work/err" >&2; fail "kiln plan $*: stderr does not match '$regex'"; }
  echo "ok: kiln plan $* -> $(cat "$work/err")"
}
printf 'not json\n' >"$work/junk.jsonl"
expect_fail "give a model"
expect_fail "unknown flag '--bogus'" --model tiny --bogus 1
expect_fail "unknown model 'gpt-9'" --model gpt-9
expect_fail "unknown --gpu 'tpu'" --model tiny --gpu tpu
expect_fail "--tp 3 x --pp 1 does not divide the cluster's 8 devices" --model tiny --tp 3
expect_fail "--tp 8 does not divide --n-head 4" --model tiny --tp 8
expect_fail "does not match the cluster's 8" --model tiny --dp 2
expect_fail "--offload all needs --zero 3" --model tiny --zero 1 --offload all
expect_fail "--micro-batch: 'x' is not an integer" --model tiny --micro-batch x
expect_fail "--zero does not go with --search" --model tiny --search --zero 1
expect_fail "--model does not go with --params" --params 1e9 --model tiny
expect_fail "--compare $work/missing.jsonl: cannot open" --compare "$work/missing.jsonl"
expect_fail "not a JSON record" --compare "$work/junk.jsonl"
expect_fail "no layout fits" --model gpt2-1.5b --gpu v100 --gpus-per-node 1 --device-memory-gb 0.5 --search
expect_fail "--pp-split '1,2' gives 2 stage\(s\) holding 3 block\(s\)" --model tiny --gpus-per-node 2 --pp 2 --pp-split 1,2
expect_fail "--pp 8 is larger than the model's 4 blocks" --model tiny --pp 8
expect_fail "--pp-split does not go with --compare" --compare "$work/junk.jsonl" --pp-split 2,2
expect_fail "--sp splits the sequence over the tensor-parallel group: it needs --tp 2 or more" --model tiny --sp
expect_fail "--cp 3 needs the sequence length \(128\) to divide into 2 x cp = 6 chunks" --model tiny --gpus-per-node 3 --cp 3
expect_fail "--cp 3 with --sp needs the sequence length \(126\) to divide into 2 x cp x tp = 12 blocks" --model tiny --seq-len 126 --gpus-per-node 6 --cp 3 --tp 2 --sp
expect_fail "--sp does not go with --search" --model tiny --search --sp
expect_fail "--top-k must be in \[1, --n-experts 2\]" --model tiny --n-experts 2 --top-k 3
expect_fail "--ep 4 must divide the data-parallel size \(dp 2 of 2 ranks\)" --model tiny-moe --gpus-per-node 2 --ep 4
expect_fail "--ep 2 divides the experts of an MoE model" --model tiny --gpus-per-node 2 --ep 2

# ---- pipeline layouts: kiln's split of the blocks, ZeRO-2 allowed -----------------------------------
plan --model gpt2-124m --gpus-per-node 5 --pp 5 --micro-batch 4 --grad-accum 8 --zero 2 --json >"$work/pp5.json"
plan --model gpt2-124m --gpus-per-node 4 --pp 4 --pp-split 4,4,3,1 --micro-batch 4 --grad-accum 8 >"$work/pp4.txt"
grep -q "pipeline stages" "$work/pp4.txt" && grep -q -- "--pp-split 4,4,3,1" "$work/pp4.txt" || { cat "$work/pp4.txt"; fail "pp text"; }
python3 - "$work/pp5.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
st = p["stages"]
# 12 blocks over 5 stages: 2 each, the 2 extra ones to the middle stages 1 and 2
assert [s["blocks"] for s in st] == [2, 3, 3, 2, 2], [s["blocks"] for s in st]
# ZeRO units: stage 0 [wte], [wpe], blocks; a middle stage blocks only; the last [wte copy], [ln_f], blocks
V, d, T = 50304, 768, 1024
assert st[0]["units"][:2] == [V * d, T * d] and len(st[0]["units"]) == 4, st[0]["units"]
assert len(st[1]["units"]) == 3 and st[4]["units"][:2] == [V * d, 2 * d], (st[1]["units"], st[4]["units"])
print("pipeline layout: gpt2-124m over 5 stages holds 2,3,3,2,2 blocks; ZeRO-2 with pp planned")
PY

# ---- --compare against real runs: ZeRO-0 and DDP --------------------------------------------------
# The checker: every exact row equal (parameters, FLOPs, tokens, model-state bytes, comm_bytes,
# ZeRO's padded count).
check_compare() {  # check_compare LOG
  "$KILN_BIN" plan --compare "$1" >"$1.txt" & local text=$!  # the text and the JSON side by side: each is mostly LibTorch's start-up
  "$KILN_BIN" plan --compare "$1" --json >"$1.cmp.json"
  wait "$text" || fail "kiln plan --compare $1 (the text) exited non-zero"
  python3 - "$1" <<'PY'
import json, sys
log = sys.argv[1]
c = json.load(open(log + ".cmp.json"))
cfg = json.loads(open(log).readline())
rows = {r["name"]: r for r in c["rows"]}
for name in ("params", "flops_per_token", "tokens_per_step"):
    assert rows[name]["equal"], rows[name]
assert "model_state" in cfg, "no model_state in the config record"
for place in ("device", "host"):
    for kind in ("params", "grads", "optimizer"):
        r = rows[f"model_state.{place}.{kind}"]
        assert r["equal"] and r["measured"] == r["predicted"], r
comm = rows["comm_bytes"]
assert comm["measured"] is not None and comm["measured"] == comm["predicted"] and comm["equal"], comm
assert c["exact_ok"], [r for r in c["rows"] if r["exact"] and r["equal"] is False]  # padded_params too
print(f"  {log.split('/')[-1]}: comm_bytes {comm['measured']}, model state equal; "
      f"peak memory {rows['peak_memory']['rel_error']:+.2%}")
PY
}

T=(train --device cpu --model tiny --steps 3 --log-every 100)
"$KILN_BIN" "${T[@]}" --micro-batch 2 --log-json "$work/single.jsonl" >/dev/null
mpi 1 "$KILN_BIN" "${T[@]}" --micro-batch 2 --backend mpi --log-json "$work/np1.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 2 --log-json "$work/ddp2.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --micro-batch 2 --grad-accum 1 --dropout 0.1 --activation-checkpointing selective \
  --precision bf16 --log-json "$work/ddp2_sel.jsonl" >/dev/null
echo "--compare, ZeRO-0 / DDP:"
for log in single np1 ddp2 ddp2_sel; do check_compare "$work/$log.jsonl"; done
grep -q "comm_bytes" "$work/ddp2.jsonl.txt" || fail "compare text lacks comm_bytes"
python3 - "$work" <<'PY'
import json, sys
d = sys.argv[1]
rows = lambda n: {r["name"]: r for r in json.load(open(f"{d}/{n}.jsonl.cmp.json"))["rows"]}
assert rows("single")["comm_bytes"]["measured"] == 0 == rows("single")["comm_bytes"]["predicted"]
# a world of one under mpirun with --backend: the DDP wrapper all-reduces the gradients as at
# dp 2 (2 x 4 Psi), but the step's 16-byte verdict stays local
assert rows("np1")["comm_bytes"]["predicted"] == rows("ddp2")["comm_bytes"]["predicted"] - 16 > 0
PY

# ---- --compare against ZeRO runs -----------------------------------------------------------------
echo "--compare, ZeRO:"
Z=(train --device cpu --model tiny --steps 2 --log-every 100 --micro-batch 2)
for np in 2 4; do
  for cfg in "1 none reduce" "2 none reduce" "2 none local" "3 none reduce" "3 none local" \
             "1 optimizer reduce" "2 optimizer local" "3 optimizer reduce" "3 all reduce" "3 all local"; do
    read -r zero offload accum <<<"$cfg"
    log="$work/z${zero}_${offload}_${accum}_np${np}.jsonl"
    mpi "$np" "$KILN_BIN" "${Z[@]}" --grad-accum 2 --zero "$zero" --offload "$offload" --zero-accum "$accum" \
      --log-json "$log" >/dev/null
    check_compare "$log"
  done
done

# ---- --compare against tensor-parallel runs --------------------------------------------------------
echo "--compare, tensor parallel:"
mpi 2 "$KILN_BIN" "${Z[@]}" --grad-accum 2 --tp 2 --log-json "$work/tp2.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${Z[@]}" --grad-accum 2 --tp 2 --activation-checkpointing full --log-json "$work/tp2dp2_ac.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${Z[@]}" --grad-accum 2 --tp 2 --zero 3 --log-json "$work/tp2dp2_z3.jsonl" >/dev/null
for log in tp2 tp2dp2_ac tp2dp2_z3; do check_compare "$work/$log.jsonl"; done

# ---- --compare against pipeline-parallel runs ------------------------------------------------------
# Stage 0's comm_bytes (kiln's rule, tests/cli/pipeline.sh): its K activations sent on, its tied
# wte gradient sent to the last stage (the dp shard under ZeRO), the world's 24-byte verdict, plus
# ZeRO-1's 8 Psi' or tp's (1 + 4 L_0) 2A per micro-batch; model state of its own units.
echo "--compare, pipeline parallel:"
mpi 2 "$KILN_BIN" "${Z[@]}" --grad-accum 2 --pp 2 --log-json "$work/pp2.jsonl" >/dev/null
mpi 3 "$KILN_BIN" "${Z[@]}" --grad-accum 3 --pp 3 --log-json "$work/pp3.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${Z[@]}" --grad-accum 2 --pp 2 --zero 1 --log-json "$work/dp2pp2_z1.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${Z[@]}" --grad-accum 2 --pp 2 --tp 2 --log-json "$work/tp2pp2.jsonl" >/dev/null
for log in pp2 pp3 dp2pp2_z1 tp2pp2; do check_compare "$work/$log.jsonl"; done
grep -q "predicted for rank 0, the rank that wrote the log: pipeline stage 0 of 3, holding 1 of the 4 blocks" "$work/pp3.jsonl.txt" || { cat "$work/pp3.jsonl.txt"; fail "pp3 compare text"; }
python3 - "$work" <<'PY'
import json, sys
d = sys.argv[1]
rows = lambda n: {r["name"]: r for r in json.load(open(f"{d}/{n}.jsonl.cmp.json"))["rows"]}
# the split is checked stage by stage: pp 3 over 4 blocks is 1, 2, 1
r = rows("pp3")
assert [r[f"pipeline.stage_{s}.blocks"]["measured"] for s in range(3)] == [1, 2, 1], r
# tiny, micro-batch 2: A = 2 x 128 x 128 x 4 = 131,072; wte 512 x 128 x 4 = 262,144
A, wte = 131072, 262144
assert rows("pp2")["comm_bytes"]["measured"] == 2 * A + wte + 24
assert rows("pp3")["comm_bytes"]["measured"] == 3 * A + wte + 24
print("pipeline: pp 3's split 1,2,1 and the comm_bytes of pp 2 / pp 3 by hand")
PY

# ---- --compare against sequence- and context-parallel runs -------------------------------------
# sp: plain tp's traffic, plus c_attn's, c_fc's and the head's inputs gathered again in backward
# (their rows are what they keep), plus the replicated parameters' gradients all-reduced over tp
# in every backward. cp: K and V gathered once per layer and forward, their gradient reduce-
# scattered once, DDP / ZeRO over dp x cp (plan/cost_model.h, section 4).
echo "--compare, sequence and context parallel:"
mpi 2 "$KILN_BIN" "${Z[@]}" --grad-accum 2 --tp 2 --sp --log-json "$work/sp2.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${Z[@]}" --grad-accum 2 --tp 2 --sp --zero 1 --precision bf16 --param-dtype fp32 \
  --activation-checkpointing full --log-json "$work/sp2dp2_z1_full.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${Z[@]}" --grad-accum 2 --cp 2 --zero 3 --precision bf16 --log-json "$work/cp2_z3_bf16.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${Z[@]}" --grad-accum 2 --cp 2 --pp 2 --log-json "$work/cp2_pp2.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${Z[@]}" --grad-accum 1 --cp 4 --seq-len 256 --log-json "$work/cp4.jsonl" >/dev/null
for log in sp2 sp2dp2_z1_full cp2_z3_bf16 cp4 cp2_pp2; do check_compare "$work/$log.jsonl"; done
python3 - "$work" <<'PY'
import json, sys
d = sys.argv[1]
rows = lambda n: {r["name"]: r for r in json.load(open(f"{d}/{n}.jsonl.cmp.json"))["rows"]}
cfg = lambda n: json.loads(open(f"{d}/{n}.jsonl").readline())
assert cfg("sp2")["world"]["sp"] is True and cfg("cp4")["world"]["cp"] == 4
# tiny, micro-batch 2, K 2, fp32: btd = 2 x 128 x 128; L 4
btd, K, L = 2 * 128 * 128, 2, 4
regather = K * (2 * L + 1) * btd * 4                           # c_attn, c_fc per layer; the head
replicated = K * 2 * 4 * (6 * L * 128 + 2 * 128 + 128 * 128)   # LayerNorms, c_proj biases, ln_f, wpe
assert rows("sp2")["comm_bytes"]["measured"] == rows("tp2")["comm_bytes"]["measured"] + regather + replicated
# cp 4 at T 256, K 1, fp32: DDP over 4 ranks of tiny with wpe [256, 128] (Psi 891,648) and per
# layer the stacked K, V gathered ([2, 2, 4, 256, 32] x 4 B) and their gradient reduce-scattered
kv = 2 * 2 * 4 * 256 * 32 * 4
assert rows("cp4")["comm_bytes"]["measured"] == 2 * 4 * 891648 + 16 + L * 2 * kv
# cp 2 x pp 2, stage 0 (2 blocks; wte, wpe), K 2, fp32: DDP over dp x cp = 2 of its 478,464
# parameters; per block and micro-batch the K/V gather and its reduce-scatter ([2, 2, 4, 128, 32]
# x 4 B each); its 2 x 128 / 2 = 128 positions a micro-batch sent to stage 1 (128 x 128 x 4); the
# tied wte's gradient (65,536 x 4); the world's verdict (24)
kv2 = 2 * 2 * 4 * 128 * 32 * 4
assert rows("cp2_pp2")["comm_bytes"]["measured"] == 2 * 4 * 478464 + 2 * 2 * 2 * kv2 + 2 * 128 * 128 * 4 + 4 * 65536 + 24
print("sp: tp's traffic + the backward's re-gathers + the replicated gradients; cp 4: DDP + K/V gathers; cp 2 x pp 2, by hand")
PY

# ---- --compare against Mixture-of-Experts runs ----------------------------------------------------
# tiny-moe (8 experts, top-2, every block; without --ep every rank holds every expert):
# the experts in the units and the model state, the verdict's routing rows (n_moe_layers x (E + 3)
# floats, 2 x 4 x 44 B more), no tp collective inside an MoE block, the experts' weights not in
# autocast's cache (the DDP run is bf16 over fp32 weights: cast_copies = attention's only).
echo "--compare, Mixture-of-Experts:"
M=(train --device cpu --model tiny-moe --steps 2 --log-every 100 --micro-batch 2)
"$KILN_BIN" "${M[@]}" --log-json "$work/moe1.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${M[@]}" --grad-accum 2 --precision bf16 --param-dtype fp32 --log-json "$work/moe_ddp2.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${M[@]}" --grad-accum 2 --zero 1 --log-json "$work/moe_z1.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${M[@]}" --grad-accum 2 --tp 2 --log-json "$work/moe_tp2.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${M[@]}" --grad-accum 2 --pp 2 --log-json "$work/moe_pp2.jsonl" >/dev/null
for log in moe1 moe_ddp2 moe_z1 moe_tp2 moe_pp2; do check_compare "$work/$log.jsonl"; done
python3 - "$work" <<'PY'
import json, sys
d = sys.argv[1]
rows = lambda n: {r["name"]: r for r in json.load(open(f"{d}/{n}.jsonl.cmp.json"))["rows"]}
meas = lambda n, row: rows(n)[row]["measured"]
# tiny-moe: Psi 4,567,296 (1,406,208 active); X = 4 MoE layers x (8 + 3) = 44 routing floats
P, X = 4567296, 44
for n in ("moe1", "moe_ddp2", "moe_z1", "moe_tp2", "moe_pp2"):
    r = rows(n)
    assert r["params_active"]["measured"] == 1406208 and r["params_active"]["equal"], r["params_active"]
    assert r["params_local"]["equal"], r["params_local"]
assert meas("moe1", "params_local") == P and meas("moe1", "comm_bytes") == 0
assert meas("moe_ddp2", "comm_bytes") == 2 * 4 * P + 2 * 4 * (2 + X)       # DDP + [loss, flag, rows]
assert meas("moe_ddp2", "model_state.device.cast_copies") == 2 * 4 * 66048  # attention's weights only
assert meas("moe_z1", "comm_bytes") == 8 * P + 2 * 4 * (3 + X)            # ZeRO-1 + [loss, flag, rows, norm]
# tp 2: the MoE layers whole on each rank; per micro-batch 4 blocks x 1 forward + 1 backward
# all-reduce of b T d 4 (half a dense block's), the embedding's and the head's, K 2, the norm
btd4 = 2 * 128 * 128 * 4
assert meas("moe_tp2", "params_local") == 49408 + 4 * 1088320
assert meas("moe_tp2", "comm_bytes") == 2 * (4 * 2 * 2 * btd4 + 2 * btd4 + 2 * btd4 + 3 * 2 * (2 * 128) * 4) + 16 == 5255184
# pp 2, stage 0: K A + its wte gradient + the world's verdict with the rows
assert meas("moe_pp2", "comm_bytes") == 2 * btd4 + 262144 + 2 * 4 * (3 + X)
print("MoE: the experts in the model state, the routing rows in the verdict, no tp collective in MoE blocks, by hand")
PY

# ---- --compare against expert-parallel runs -------------------------------------------------------
# --ep 2 at dp 2, at dp 2 x tp 2, with ZeRO-1 at dp 4 and with pp 2 x ZeRO-1: each rank holds 4 of
# the 8 experts (params_local and the model state exact; under ZeRO the experts sharded over the
# ranks holding the same ones); comm_bytes less the step's ep_comm_bytes (the dense gradients over
# dp, the experts' over their copies -- a group of one at dp = ep: nothing --, the verdict, tp,
# pp) exact every step; ep_comm_bytes exactly what the step's logged rows say (the rows its
# dispatches sent and received, parallel/expert_parallel.h), at least the counts' all-to-alls (and
# the norm's 16 under DDP on one stage), and near the balanced estimate: per rank the rows sent
# are at most k b T (a token's k choices), those its experts ran at most the capacity, 1.25 k b T,
# so rows / estimate is at most (1 + 1.25) / 2.
echo "--compare, expert parallel:"
check_compare_ep() {  # check_compare_ep LOG NON_EP MOE_LAYERS_ON_RANK_0 NORM_BYTES [EXPERTS, default 8]
  "$KILN_BIN" plan --compare "$1" >"$1.txt" & local text=$!  # the text and the JSON side by side: each is mostly LibTorch's start-up
  "$KILN_BIN" plan --compare "$1" --json >"$1.cmp.json"
  wait "$text" || fail "kiln plan --compare $1 (the text) exited non-zero"
  python3 - "$1" "$2" "$3" "$4" "${5:-8}" <<'PY'
import json, sys
log, non_ep, layers, norm, experts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
c = json.load(open(log + ".cmp.json"))
rows = {r["name"]: r for r in c["rows"]}
assert c["exact_ok"], [r for r in c["rows"] if r["exact"] and r["equal"] is False or r.get("holds") is False]
for name in ("params", "params_active", "params_local", "flops_per_token", "tokens_per_step",
             "model_state.device.params", "model_state.device.grads", "model_state.device.optimizer",
             "comm_bytes - ep_comm_bytes", "ep_comm_bytes from the logged rows"):
    assert rows[name]["exact"] and rows[name]["equal"] and rows[name]["measured"] is not None, rows[name]
assert rows["comm_bytes - ep_comm_bytes"]["measured"] == non_ep, rows["comm_bytes - ep_comm_bytes"]
b = rows["ep_comm_bytes >= counts+norm"]
assert b["lower_bound"] and b["holds"] and b["predicted"] == layers * 2 * 8 * experts + norm, b
est = rows["ep_comm_bytes: all-to-all rows"]
assert est["estimate"] and est["predicted"] == layers * 2 * 2 * 512 * 128 * 8, est
ratio = est["measured"] / est["predicted"]
assert 0.5 < ratio <= (1 + 1.25) / 2, ratio
print(f"  {log.split('/')[-1]}: comm_bytes - ep_comm_bytes {non_ep} equal, ep rows {est['measured']:.0f} "
      f"against the estimate {est['predicted']} ({ratio - 1:+.1%}), model state equal")
PY
}
E=(train --device cpu --model tiny-moe --steps 2 --log-every 100 --micro-batch 2 --grad-accum 2)
mpi 2 "$KILN_BIN" "${E[@]}" --ep 2 --log-json "$work/ep2.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${E[@]}" --ep 2 --tp 2 --log-json "$work/ep2tp2.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${E[@]}" --ep 2 --zero 1 --log-json "$work/ep2z1dp4.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${E[@]}" --ep 2 --pp 2 --zero 1 --log-json "$work/ep2pp2z1.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${E[@]}" --ep 2 --zero 3 --log-json "$work/ep2z3dp4.jsonl" >/dev/null
# dp 2, ep 2: 2 x 4 x 352,512 dense + the verdict 2 x 4 x (2 + 44); tp 2 x ep 2: 2 x 4 x 187,904
# dense + 368 + tiny-moe's tp traffic at tp 2 (5,255,184); ZeRO-1 at dp 4: (4 + 4) x 2,459,904
# (the dense units over dp 4, the experts over their 2 copies) + the verdict with the norm
# 2 x 4 x (3 + 44); pp 2 x ZeRO-1: stage 0's figure (2 MoE blocks; kiln train measured 2,130,296)
check_compare_ep "$work/ep2.jsonl" $((2 * 4 * 352512 + 368)) 4 16
check_compare_ep "$work/ep2tp2.jsonl" $((2 * 4 * 187904 + 368 + 5255184)) 4 16
check_compare_ep "$work/ep2z1dp4.jsonl" $((8 * 2459904 + 376)) 4 0
check_compare_ep "$work/ep2pp2z1.jsonl" 2130296 2 0
# ZeRO-3 at dp 4, ep 2, K 2, fp32: the dense units (the outer unit 82,176 and 4 blocks' attention
# 66,560 + the router 8 x 128 = 67,584, both multiples of 4 x 64) gathered
# for each forward and, but the outer unit and the last block, each backward, and reduce-scattered
# each micro-step; the experts (4 x 4 x 131,712 = 2,107,392 a rank, over their 2 copies) alike;
# the verdict with the norm and the routing rows
dense=$((82176 + 4 * 67584)) experts=$((4 * 4 * 131712))
check_compare_ep "$work/ep2z3dp4.jsonl" $((2 * 4 * (dense + dense - 82176 - 67584 + dense) + 2 * 4 * (experts + experts - 4 * 131712 + experts) + 2 * 4 * (3 + 44))) 4 0
grep -q "layout: dp 2 (ep 2) tp 2 pp 1" "$work/ep2tp2.jsonl.txt" || { cat "$work/ep2tp2.jsonl.txt"; fail "ep compare text"; }

# ---- --compare against the Llama family's runs ----------------------------------------------------
# tiny-llama (rotary positions: no wpe; RMSNorm: d weights; SwiGLU: three matrices; no biases; an
# untied lm_head; GQA 4 over 2) and tiny-mixtral (SwiGLU experts): the units, the model state and
# comm_bytes exact on every layout kind -- DDP with bf16 autocast's cast copies under selective,
# ZeRO-3 with everything offloaded, ZeRO-2 with the optimizer offloaded at tp 2 with Qwen2's q/k/v
# biases, tp 2 + sp (the norms' weights all-reduced), cp 2, pp 2 untied and tied, ep 2.
echo "--compare, the Llama family:"
LL=(train --device cpu --model tiny-llama --steps 2 --log-every 100 --micro-batch 2 --grad-accum 2)
mpi 2 "$KILN_BIN" "${LL[@]}" --precision bf16 --param-dtype fp32 --activation-checkpointing selective --dropout 0.1 \
  --log-json "$work/llama_ddp2_sel.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${LL[@]}" --zero 3 --offload all --log-json "$work/llama_z3_off.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${LL[@]}" --tp 2 --bias qkv --zero 2 --offload optimizer --log-json "$work/qwen_tp2dp2_z2_off.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${LL[@]}" --tp 2 --sp --log-json "$work/llama_sp2.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${LL[@]}" --cp 2 --log-json "$work/llama_cp2.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${LL[@]}" --pp 2 --log-json "$work/llama_pp2.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${LL[@]}" --pp 2 --tie-embeddings --log-json "$work/llama_pp2_tied.jsonl" >/dev/null
mpi 2 "$KILN_BIN" train --device cpu --model tiny-mixtral --steps 2 --log-every 100 --micro-batch 2 --grad-accum 2 --ep 2 \
  --log-json "$work/mixtral_ep2.jsonl" >/dev/null
for log in llama_ddp2_sel llama_z3_off qwen_tp2dp2_z2_off llama_sp2 llama_cp2 llama_pp2 llama_pp2_tied; do check_compare "$work/$log.jsonl"; done
# tiny-mixtral at dp 2, ep 2: its dense 330,880 parameters (2,493,568 less 4 layers x 4 SwiGLU
# experts of 3 x 352 x 128) all-reduced over dp, the verdict with 4 x (4 + 3) routing floats
check_compare_ep "$work/mixtral_ep2.jsonl" $((2 * 4 * 330880 + 2 * 4 * (2 + 28))) 4 16 4
python3 - "$work" <<'PY'
import json, sys
d = sys.argv[1]
rows = lambda n: {r["name"]: r for r in json.load(open(f"{d}/{n}.jsonl.cmp.json"))["rows"]}
meas = lambda n, row: rows(n)[row]["measured"]
# tiny-llama: 869,504 parameters (the preset's published-style count, models/gpt_config.h)
assert meas("llama_ddp2_sel", "params") == 869504
# pp 2, stage 0, K 2, fp32: 2 boundary sends of b T d 4 (A = 131,072) and the verdict; tied, also
# wte's gradient to the last stage (512 x 128 x 4); untied, nothing shared
A, wte = 131072, 262144
assert meas("llama_pp2", "comm_bytes") == 2 * A + 24, meas("llama_pp2", "comm_bytes")
assert meas("llama_pp2_tied", "comm_bytes") == 2 * A + wte + 24
# DDP bf16 over fp32 weights, selective: autocast holds c_attn, both c_proj and SwiGLU's [gate | up]
# weights (no biases): per block 128 x 256 + 128 x 128 + 2 x 352 x 128 + 128 x 352 = 184,320 -- the
# SwiGLU feed-forward is not recomputed under selective, so its c_proj's copy is held too
assert meas("llama_ddp2_sel", "model_state.device.cast_copies") == 2 * 4 * 184320
print("Llama family: tied / untied pipeline traffic, cast copies, by hand")
PY

# ---- the suggested command runs the planned layout as pasted (here on the CPU, 2 steps)
plan --model tiny --gpu h100 --gpus-per-node 4 --tp 2 --zero 1 --micro-batch 4 --grad-accum 2 --json >"$work/cmd1.json"
plan --n-layer 3 --d-model 64 --n-head 2 --gpu h100 --gpus-per-node 2 --pp 2 --micro-batch 2 --grad-accum 2 --json >"$work/cmd2.json"
plan --model tiny --gpu h100 --gpus-per-node 4 --cp 2 --tp 2 --precision fp32 --micro-batch 2 --grad-accum 2 --json >"$work/cmd3.json"
# the Llama family: a preset, and a shape given by flags (its architecture written into the command)
plan --model tiny-llama --gpu h100 --gpus-per-node 2 --tp 2 --micro-batch 2 --grad-accum 2 --json >"$work/cmd4.json"
plan --n-layer 2 --d-model 64 --n-head 4 --n-kv-head 2 --position rope --norm rmsnorm --mlp swiglu --ffn-hidden 160 --bias qkv \
  --tie-embeddings=false --gpu h100 --gpus-per-node 2 --pp 2 --micro-batch 2 --grad-accum 2 --json >"$work/cmd5.json"
for k in 1 2 3 4 5; do
  cmd=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['layout']['command'])" "$work/cmd$k.json")
  echo "plan: $cmd"
  read -r -a words <<<"$cmd"
  [ "${words[0]} ${words[1]} ${words[3]} ${words[4]}" = "mpirun -np kiln train" ] || fail "not a kiln train command: $cmd"
  mpi "${words[2]}" "$KILN_BIN" "${words[@]:4}" --device cpu --steps 2 --log-json "$work/cmd$k.jsonl" >/dev/null ||
    fail "the suggested command did not run: $cmd"
  python3 - "$work/cmd$k.json" "$work/cmd$k.jsonl" <<'PY'
import json, sys
plan, run = json.load(open(sys.argv[1])), json.loads(open(sys.argv[2]).readline())
l, c, w = plan["layout"], run["config"], run["world"]
assert (w["dp"], w["tp"], w["pp"]) == (l["dp"], l["tp"], l["pp"]), (w, l)
assert (w.get("cp", 1), w.get("sp", False)) == (l["cp"], l["sp"]), (w, l)
assert (c["zero"], c["offload"], c["activation_checkpointing"]) == (l["zero"], l["offload"], l["activation_checkpointing"]), c
assert (c["micro_batch"], c["grad_accum"]) == (l["micro_batch"], l["grad_accum"]), c
assert run["params"] == plan["model"]["params"], (run["params"], plan["model"]["params"])
for key in ("position", "norm", "mlp", "ffn_hidden", "bias", "tie_embeddings", "rope_theta"):  # absent for GPT-2 in both
    assert plan["model"].get(key) == c.get(key), (key, plan["model"].get(key), c.get(key))
assert run["compute_dtype"] == ("BFloat16" if l["compute_bytes"] == 2 else "Float"), run["compute_dtype"]
print("  ran: the layout, the model and the precision the plan planned")
PY
done
check_compare "$work/cmd3.jsonl"  # cp 2 x tp 2, as the plan wrote it: comm_bytes exact
check_compare "$work/cmd5.jsonl"  # a Llama shape by flags, pp 2, as the plan wrote it
echo "PASS"
