#!/usr/bin/env bash
# tests/cli/plan.sh -- `kiln plan` end to end (labels cli, mpi): the breakdown and --json of one
# layout, a layout that does not fit (exit 6, no step time, the --search command, which is then
# run), --params totals, bad input, and --compare against real `kiln train` runs: the model-state
# bytes, the asynchronous save's snapshot pool and comm_bytes kiln predicts must EQUAL what the
# runs report (they are accounting, not estimates; plan/compare.h).
#
# The runs: one process and DDP; every ZeRO stage with each offload and accumulation policy at 2
# and 4 ranks; tensor-parallel runs (alone, with DDP and full recomputation, with ZeRO-3);
# pipeline-parallel runs (pp 2; pp 3, whose default split 1,2,1 puts the extra block on the
# middle stage; dp 2 x pp 2 under ZeRO-1; tp 2 x pp 2) -- a run's log is rank 0's, so a pipeline
# run checks stage 0's figures, and every stage's block count; sequence parallelism (tp 2 --sp in
# fp32; with dp 2, ZeRO-1, bf16 and full recomputation) and context parallelism (cp 2 in bf16
# under ZeRO-3; cp 4 at seq 256; cp 2 x pp 2); --precision fp8 runs (tensorwise at tp 2, tp 2 + sp,
# with full recomputation, cp 2, ZeRO-3 at dp 2 x tp 2; rowwise at tp 2, tp 2 + sp, cp 2 x tp 2:
# the float8 amax all-reduces, sp's 8-bit gathers and ZeRO-3's 8-bit weight gathers); Mixture-of-Experts runs (tiny-moe: one process,
# DDP dp 2 in bf16, ZeRO-1 dp 2, tp 2, pp 2; and with --ep 2 at dp 2, dp 2 x tp 2, ZeRO-1 at dp 4,
# pp 2 x ZeRO-1 and ZeRO-3 at dp 4, where comm_bytes less ep_comm_bytes is exact, ep_comm_bytes
# exact from the step's logged rows, and those rows set beside the plan's balanced estimate); the
# Llama family; and six commands plans suggest, run as pasted -- three of them are runs above
# (tp 2 x dp 2 under ZeRO-3, cp 4 at seq 256, tiny-llama at tp 2 + sp), shared. Nine runs save
# (--save-dir), asynchronously but one, so the snapshot pool is checked on DDP, ZeRO, tp x pp,
# cp x pp, MoE, expert-parallel and Llama layouts.
#
# How it runs (the suite's longest test; CI has 2 cores): every process is started in the
# background, two at a time (kiln plan's start-up is LibTorch's, 0.3 s; a tiny run is mostly
# start-up too), the ~50 logs are compared by ONE `kiln plan --compare ... --compare ...` (and
# once more for the text), and one Python run checks everything.
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
# One intra-op thread a process (a rank under mpirun has one already, kiln's rule): the runs go two
# at a time on CI's 2 cores, and a process of 2 threads waiting for a descheduled one is slow.
export OMP_NUM_THREADS=1

# ---- two processes at a time ----------------------------------------------------------------------
# bg NAME CMD...: CMD in the background, its stdout and stderr in $work/NAME.out and .err, its exit
# code in $work/NAME.code; waits first while two are running. bg_wait: waits for all of them.
running=0
bg() {
  local name=$1; shift
  if [ "$running" -ge 2 ]; then wait -n || true; running=$((running - 1)); fi
  (
    code=0
    "$@" >"$work/$name.out" 2>"$work/$name.err" || code=$?
    echo "$code" >"$work/$name.code"
  ) &
  running=$((running + 1))
}
bg_wait() { wait; running=0; }
code_of() { cat "$work/$1.code"; }
ok() {  # ok NAME...: each exited 0
  for n in "$@"; do
    [ "$(code_of "$n")" -eq 0 ] || { tail -n 20 "$work/$n.out" "$work/$n.err" >&2; fail "$n exited $(code_of "$n")"; }
  done
}
plan() { timeout 120 "$KILN_BIN" plan "$@"; }

# ---- kiln plan alone: one layout, one that does not fit, --params, pipeline layouts, the
# ---- suggested commands, bad input -------------------------------------------------------------
bg one_txt plan --model gpt2-124m --gpu h200 --gpus-per-node 1 --micro-batch 16
bg one_json plan --model gpt2-124m --gpu h200 --gpus-per-node 1 --micro-batch 16 --json
bg z1 plan --model gpt2-1.5b --gpu h100 --nodes 2 --zero 1 --activation-checkpointing selective --micro-batch 4 \
  --grad-accum 2 --json
# gpt2-1.5b at micro-batch 32 on 8 H100: 123 GB a device, over the 80
bg nofit plan --model gpt2-1.5b --gpu h100 --micro-batch 32
bg nofit_json plan --model gpt2-1.5b --gpu h100 --micro-batch 32 --json
bg nofit_reference plan --model gpt2-1.5b --gpu h100 --micro-batch 32 --kernels reference
bg totals plan --params 7e9 --gpu h100 --nodes 64 --tokens 2e12 --json
bg pp5 plan --model gpt2-124m --gpus-per-node 5 --pp 5 --micro-batch 4 --grad-accum 8 --zero 2 --json
bg pp4 plan --model gpt2-124m --gpus-per-node 4 --pp 4 --pp-split 4,4,3,1 --micro-batch 4 --grad-accum 8
# the suggested command runs its layout as pasted, and three of the runs compared below are such
# commands (tp 2 x dp 2 under ZeRO-3; tiny at seq 256 over cp 4: a preset and the flag that
# differs; tiny-llama at tp 2 + sp); beside them a shape by flags at pp 2 in bf16 (tiny's name and
# the flags that differ), cp 2 x tp 2 in fp32, and a Llama shape by flags (against the nearest preset)
commands=(tp2dp2_z3 cmd2 cmd3 cp4 cmd5 llama_sp2)
bg plan_tp2dp2_z3 plan --model tiny --gpus-per-node 4 --tp 2 --zero 3 --precision fp32 --micro-batch 2 --grad-accum 2 --json
bg plan_cmd2 plan --n-layer 3 --d-model 64 --n-head 2 --gpu h100 --gpus-per-node 2 --pp 2 --micro-batch 2 --grad-accum 2 --json
bg plan_cmd3 plan --model tiny --gpu h100 --gpus-per-node 4 --cp 2 --tp 2 --precision fp32 --micro-batch 2 --grad-accum 2 --json
bg plan_cp4 plan --model tiny --seq-len 256 --gpus-per-node 4 --cp 4 --precision fp32 --micro-batch 2 --json
bg plan_cmd5 plan --n-layer 2 --d-model 64 --n-head 4 --n-kv-head 2 --position rope --norm rmsnorm --mlp swiglu --ffn-hidden 160 \
  --bias qkv --tie-embeddings=false --gpu h100 --gpus-per-node 2 --pp 2 --micro-batch 2 --grad-accum 2 --json
bg plan_llama_sp2 plan --model tiny-llama --gpus-per-node 2 --tp 2 --sp --precision fp32 --micro-batch 2 --grad-accum 2 --json

# bad input: one line on stderr, nothing on stdout, exit 2 (checked below)
printf 'not json\n' >"$work/junk.jsonl"
bad=()
expect_fail() {  # expect_fail REGEX ARGS...
  local name="bad${#bad[@]}" regex=$1; shift
  bad+=("$name" "$regex" "$*")
  bg "$name" timeout 60 "$KILN_BIN" plan "$@"
}
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
expect_fail "--async-save takes true or false \(got 'maybe'\)" --model tiny --async-save=maybe
expect_fail "--kernels must be fused or reference \(got 'fast'\)" --model tiny --kernels fast
bg_wait
ok one_txt one_json z1 totals pp5 pp4 "${commands[@]/#/plan_}"
for ((i = 0; i < ${#bad[@]}; i += 3)); do
  name=${bad[i]} regex=${bad[i + 1]} args=${bad[i + 2]}
  [ "$(code_of "$name")" -eq 2 ] || { cat "$work/$name.err" >&2; fail "kiln plan $args exited $(code_of "$name") (want 2)"; }
  [ "$(wc -l <"$work/$name.err")" -eq 1 ] || { cat "$work/$name.err" >&2; fail "kiln plan $args: not one line on stderr"; }
  [ ! -s "$work/$name.out" ] || fail "kiln plan $args: wrote to stdout"
  grep -Eq "^kiln: error: .*$regex" "$work/$name.err" || { cat "$work/$name.err" >&2; fail "kiln plan $args: stderr does not match '$regex'"; }
done
echo "bad input: $((${#bad[@]} / 3)) cases, each one line and exit 2"

# a layout that does not fit: exit 6, the plan without a step time, and the --search that finds one
for n in nofit nofit_json nofit_reference; do [ "$(code_of $n)" -eq 6 ] || { cat "$work/$n.err" >&2; fail "$n exited $(code_of $n) (want 6)"; }; done
want="kiln plan --model gpt2-1.5b --gpu h100 --search --global-batch 256"
# kiln's fused kernels (the default, as kiln train's on a GPU) keep each norm's 16-bit input where
# autocast's fp32 layer_norm keeps an fp32 copy: 2 x 2 d bytes less a token and layer, 10.07 GB
# over 48 layers x 32,768 tokens (docs/plan.md, section 3)
[ "$(cat "$work/nofit.err")" = "kiln: plan: the layout does not fit: the peak per device, 113.16 GB (pipeline stage 0), is over the device's 80.00 GB; for layouts that fit: $want" ] ||
  { cat "$work/nofit.err" >&2; fail "the does-not-fit line"; }
[ "$(cat "$work/nofit_reference.err")" = "kiln: plan: the layout does not fit: the peak per device, 123.23 GB (pipeline stage 0), is over the device's 80.00 GB; for layouts that fit: ${want/--search/--kernels reference --search}" ] ||
  { cat "$work/nofit_reference.err" >&2; fail "the does-not-fit line, composite ops"; }
grep -q "DOES NOT FIT" "$work/nofit.out" && grep -q "^  layouts that fit: $want$" "$work/nofit.out" &&
  ! grep -Eq "tokens/s|MFU|this layout:" "$work/nofit.out" || { cat "$work/nofit.out"; fail "the does-not-fit plan"; }
read -r -a search <<<"$want"
bg search_txt timeout 120 "$KILN_BIN" "${search[@]:1}" --top 6
bg search_json timeout 120 "$KILN_BIN" "${search[@]:1}" --top 6 --json

# ---- kiln train runs, two at a time --------------------------------------------------------------
logs=()
run() {  # run NAME NP KILN_ARGS...: the run's log is $work/NAME.jsonl; NP 0: no mpirun
  local name=$1 np=$2; shift 2
  logs+=("$name")
  if [ "$np" -eq 0 ]; then bg "$name" timeout 300 "$KILN_BIN" "$@" --log-json "$work/$name.jsonl"
  else bg "$name" mpi "$np" "$KILN_BIN" "$@" --log-json "$work/$name.jsonl"; fi
}
save() { echo --save-dir "$work/ckpt_$1"; }  # asynchronous saves (kiln train's default): the snapshot pool
# ZeRO-0 and DDP
T=(train --device cpu --model tiny --steps 3 --log-every 100)
run single 0 "${T[@]}" --micro-batch 2 $(save single)
run np1 1 "${T[@]}" --micro-batch 2 --backend mpi $(save np1) --async-save=false
run ddp2 2 "${T[@]}" --micro-batch 2 --grad-accum 2 $(save ddp2)
run ddp2_sel 2 "${T[@]}" --micro-batch 2 --grad-accum 1 --dropout 0.1 --activation-checkpointing selective --precision bf16
# ZeRO: every stage, offload and accumulation policy at 2 and 4 ranks
Z=(train --device cpu --model tiny --steps 2 --log-every 100 --micro-batch 2)
zero_logs=()
for np in 2 4; do
  for cfg in "1 none reduce" "2 none reduce" "2 none local" "3 none reduce" "3 none local" \
             "1 optimizer reduce" "2 optimizer local" "3 optimizer reduce" "3 all reduce" "3 all local"; do
    read -r zero offload accum <<<"$cfg"
    name="z${zero}_${offload}_${accum}_np${np}"
    zero_logs+=("$name")
    extra=()
    [ "$name" = z3_all_reduce_np4 ] && extra=($(save "$name"))  # the pool beside offload's host state
    run "$name" "$np" "${Z[@]}" --grad-accum 2 --zero "$zero" --offload "$offload" --zero-accum "$accum" "${extra[@]}"
  done
done
# tensor and pipeline parallel
run tp2 2 "${Z[@]}" --grad-accum 2 --tp 2
run tp2dp2_ac 4 "${Z[@]}" --grad-accum 2 --tp 2 --activation-checkpointing full
run pp2 2 "${Z[@]}" --grad-accum 2 --pp 2
run pp3 3 "${Z[@]}" --grad-accum 3 --pp 3
run dp2pp2_z1 4 "${Z[@]}" --grad-accum 2 --pp 2 --zero 1
run tp2pp2 4 "${Z[@]}" --grad-accum 2 --pp 2 --tp 2 $(save tp2pp2)
# sequence and context parallel
run sp2 2 "${Z[@]}" --grad-accum 2 --tp 2 --sp
run sp2dp2_z1_full 4 "${Z[@]}" --grad-accum 2 --tp 2 --sp --zero 1 --precision bf16 --param-dtype fp32 --activation-checkpointing full
run cp2_z3_bf16 2 "${Z[@]}" --grad-accum 2 --cp 2 --zero 3 --precision bf16
run cp2_pp2 4 "${Z[@]}" --grad-accum 2 --cp 2 --pp 2 $(save cp2_pp2)
# --precision fp8 (kernels/float8.h; every block layer): the float8 amax all-reduces over tp and
# cp, and sp's 8-bit gathers, in comm_bytes exactly (plan/communication.cpp)
F8=("${Z[@]}" --grad-accum 2 --precision fp8 --fp8-filter all)
run f8_tp2 2 "${F8[@]}" --tp 2
run f8_sp2 2 "${F8[@]}" --tp 2 --sp
run f8_sp2_full 2 "${F8[@]}" --tp 2 --sp --activation-checkpointing full
run f8_cp2 2 "${F8[@]}" --cp 2
run f8_tp2_rw 2 "${F8[@]}" --tp 2 --fp8-recipe rowwise
run f8_sp2_rw 2 "${F8[@]}" --tp 2 --sp --fp8-recipe rowwise
run f8_cp2tp2_rw 4 "${F8[@]}" --cp 2 --tp 2 --fp8-recipe rowwise
run f8_z3tp2 4 "${F8[@]}" --zero 3 --tp 2  # the float8 weights gathered in 8 bits, their amaxes once a step
# Mixture-of-Experts
M=(train --device cpu --model tiny-moe --steps 2 --log-every 100 --micro-batch 2)
run moe1 0 "${M[@]}"
run moe_ddp2 2 "${M[@]}" --grad-accum 2 --precision bf16 --param-dtype fp32 $(save moe_ddp2)
run moe_z1 2 "${M[@]}" --grad-accum 2 --zero 1
run moe_tp2 2 "${M[@]}" --grad-accum 2 --tp 2
run moe_pp2 2 "${M[@]}" --grad-accum 2 --pp 2
E=(train --device cpu --model tiny-moe --steps 2 --log-every 100 --micro-batch 2 --grad-accum 2)
run ep2 2 "${E[@]}" --ep 2
run ep2tp2 4 "${E[@]}" --ep 2 --tp 2
run ep2z1dp4 4 "${E[@]}" --ep 2 --zero 1 $(save ep2z1dp4)
run ep2pp2z1 4 "${E[@]}" --ep 2 --pp 2 --zero 1
run ep2z3dp4 4 "${E[@]}" --ep 2 --zero 3
# the Llama family
LL=(train --device cpu --model tiny-llama --steps 2 --log-every 100 --micro-batch 2 --grad-accum 2)
run llama_ddp2_sel 2 "${LL[@]}" --precision bf16 --param-dtype fp32 --activation-checkpointing selective --dropout 0.1
run llama_z3_off 2 "${LL[@]}" --zero 3 --offload all
run qwen_tp2dp2_z2_off 4 "${LL[@]}" --tp 2 --bias qkv --zero 2 --offload optimizer
run llama_cp2 2 "${LL[@]}" --cp 2
run llama_pp2 2 "${LL[@]}" --pp 2 $(save llama_pp2)
run llama_pp2_tied 2 "${LL[@]}" --pp 2 --tie-embeddings
run mixtral_ep2 2 train --device cpu --model tiny-mixtral --steps 2 --log-every 100 --micro-batch 2 --grad-accum 2 --ep 2
# the suggested commands, as pasted (here on the CPU, 2 steps)
for name in "${commands[@]}"; do
  cmd=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['layout']['command'])" "$work/plan_$name.out")
  echo "plan: $cmd"
  read -r -a words <<<"$cmd"
  [ "${words[0]} ${words[1]} ${words[3]} ${words[4]}" = "mpirun -np kiln train" ] || fail "not a kiln train command: $cmd"
  run "$name" "${words[2]}" "${words[@]:4}" --device cpu --steps 2
done
bg_wait
ok search_txt search_json "${logs[@]}"

# ---- every log compared by one kiln plan (the JSON, and the text beside it) ---------------------
args=()
for n in "${logs[@]}"; do args+=(--compare "$work/$n.jsonl"); done
bg compare_json plan "${args[@]}" --json
bg compare_txt plan "${args[@]}"
bg_wait
ok compare_json compare_txt

python3 - "$work" "${zero_logs[*]}" <<'PY'
import json, re, sys
d, zero_logs = sys.argv[1], sys.argv[2].split()
out = lambda n: open(f"{d}/{n}.out").read()
js = lambda n: json.loads(out(n))

# ---- one layout: text and JSON
for want in ("memory per device", "communication per step", "step time", "MFU", "120 P^2 / R"):
    assert want in out("one_txt"), f"plan text lacks {want!r}"
p = js("one_json")
assert p["type"] == "plan"
P = p["model"]["params"]
assert P == 124475904, P
st = p["stages"][0]
ms = st["model_state"]["device"]
# ZeRO-0, bf16 by default with its default working weights (--param-dtype auto: bf16, fp32
# masters), one device at grad-accum 1: nothing accumulates or reduces, so AdamW reads the bf16
# gradients (--main-grads auto): 2 + 2 + 12 bytes per parameter, unpadded, and no autocast copies
assert (ms["params"], ms["grads"], ms["optimizer"], ms["cast_copies"]) == (2 * P, 2 * P, 12 * P, 0), ms
assert st["comm_bytes"] == 0 and st["comm"] == []          # one device, no communicator
t = p["time"]
# nothing to wait for: the step is compute only, so MFU is the achieved fraction
assert t["exposed_comm_s"] == 0 and t["bubble_s"] == 0
assert abs(t["mfu"] - p["cluster"]["achieved"]) < 1e-12, t
assert p["memory"]["fits"] is True
tr = p["training"]
assert tr["compute_optimal"] and abs(tr["seconds"] - 120 * tr["params"] ** 2 / tr["cluster_flops"]) < 1e-6 * tr["seconds"]
assert p["run"]["steps"] > 0 and p["run"]["seconds"] > 0 and p["run"]["energy_j"] > 0
z = js("z1")
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

# ---- a layout that does not fit, and the search it points at
nf = js("nofit_json")
assert nf["memory"]["fits"] is False and nf["memory"]["peak_device_bytes"] > nf["cluster"]["device_memory_bytes"]
assert nf["does_not_fit"]["search_command"] == "kiln plan --model gpt2-1.5b --gpu h100 --search --global-batch 256"
txt = out("search_txt")
assert re.search(r"^#1 ", txt, re.M) and "why: " in txt, txt
r = js("search_json")
best = r["best"]
assert 1 <= len(best) <= 6 and r["fitting"] >= len(best)
assert r["candidates"] == r["invalid"] + r["over_device_memory"] + r["over_host_memory"] + r["fitting"], r
for b in best:
    assert b["memory"]["fits"] and b["memory"]["peak_device_bytes"] <= b["cluster"]["device_memory_bytes"], b["layout"]
    assert b["reason"]
    assert b["layout"]["micro_batch"] * b["layout"]["grad_accum"] * b["layout"]["dp"] == 256, b["layout"]
# fastest first, to the microsecond (closer is a tie, broken by what the model does not see)
steps = [round(b["time"]["step_s"] * 1e6) for b in best]
assert steps == sorted(steps), steps
print(f"does not fit: exit 6, no step time; its --search: {r['candidates']} tried, {r['fitting']} fit, top {len(best)} fastest first")

# ---- --params: totals only
t = js("totals")["training"]
assert t["flops"] == 6 * 7e9 * 2e12, t
R = 512 * 989e12 * 0.4
assert abs(t["cluster_flops"] - R) < 1e-6 * R and abs(t["seconds"] - t["flops"] / R) < 1e-9 * t["seconds"]
assert abs(t["energy_j"] - t["seconds"] * 512 * 700) < 1e-9 * t["energy_j"]
print("--params: T = 6PD, t = T/R, E = t x devices x W")

# ---- pipeline layouts: kiln's split of the blocks, ZeRO-2 allowed
assert "pipeline stages" in out("pp4") and "--pp-split 4,4,3,1" in out("pp4"), out("pp4")
st = js("pp5")["stages"]
# 12 blocks over 5 stages: 2 each, the 2 extra ones to the middle stages 1 and 2
assert [s["blocks"] for s in st] == [2, 3, 3, 2, 2], [s["blocks"] for s in st]
# ZeRO units: stage 0 [wte], [wpe], blocks; a middle stage blocks only; the last [wte copy], [ln_f], blocks
V, dm, T = 50304, 768, 1024
assert st[0]["units"][:2] == [V * dm, T * dm] and len(st[0]["units"]) == 4, st[0]["units"]
assert len(st[1]["units"]) == 3 and st[4]["units"][:2] == [V * dm, 2 * dm], (st[1]["units"], st[4]["units"])
print("pipeline layout: gpt2-124m over 5 stages holds 2,3,3,2,2 blocks; ZeRO-2 with pp planned")

# ---- --compare: one document per log, in order; the text's sections by log
docs = js("compare_json")
names = [re.sub(r"^.*/|\.jsonl$", "", c["log"]) for c in docs]
cmp = dict(zip(names, docs))
text = {}
for part in re.split(r"(?m)^(?=compare: )", out("compare_txt")):
    m = re.match(r"compare: (\S+) \(", part)
    if m: text[re.sub(r"^.*/|\.jsonl$", "", m.group(1))] = part
assert sorted(text) == sorted(cmp), (sorted(text), sorted(cmp))
rows = lambda n: {r["name"]: r for r in cmp[n]["rows"]}
meas = lambda n, row: rows(n)[row]["measured"]
cfg = lambda n: json.loads(open(f"{d}/{n}.jsonl").readline())

def check_compare(n):
    # every exact row equal: parameters, FLOPs, tokens, model-state bytes, the snapshot pool, comm_bytes, Psi'
    c, r = cmp[n], rows(n)
    for name in ("params", "flops_per_token", "tokens_per_step"):
        assert r[name]["equal"], (n, r[name])
    assert "model_state" in cfg(n), f"{n}: no model_state in the config record"
    for place in ("device", "host"):
        for kind in ("params", "grads", "optimizer"):
            x = r[f"model_state.{place}.{kind}"]
            assert x["equal"] and x["measured"] == x["predicted"], (n, x)
    pool = r["snapshot_pool_bytes"]
    assert pool["equal"] and pool["measured"] is not None and pool["measured"] == pool["predicted"], (n, pool)
    comm = r["comm_bytes"]
    assert comm["measured"] is not None and comm["measured"] == comm["predicted"] and comm["equal"], (n, comm)
    assert c["exact_ok"], (n, [x for x in c["rows"] if x["exact"] and x["equal"] is False])  # padded_params too
    print(f"  {n}: comm_bytes {comm['measured']}, model state equal, snapshot pool {pool['measured']}; "
          f"peak memory {r['peak_memory']['rel_error']:+.2%}")

def check_compare_ep(n, non_ep, layers, norm, experts=8):
    # comm_bytes less ep_comm_bytes exact; ep_comm_bytes from the logged rows exact, at least the
    # counts and norm, and the rows near the balanced estimate: per rank the rows sent are at most
    # k b T, those its experts ran at most the capacity, 1.25 k b T: rows / estimate <= (1 + 1.25) / 2
    c, r = cmp[n], rows(n)
    assert c["exact_ok"], (n, [x for x in c["rows"] if x["exact"] and x["equal"] is False or x.get("holds") is False])
    for name in ("params", "params_active", "params_local", "flops_per_token", "tokens_per_step",
                 "model_state.device.params", "model_state.device.grads", "model_state.device.optimizer",
                 "snapshot_pool_bytes", "comm_bytes - ep_comm_bytes", "ep_comm_bytes from the logged rows"):
        assert r[name]["exact"] and r[name]["equal"] and r[name]["measured"] is not None, (n, r[name])
    assert r["comm_bytes - ep_comm_bytes"]["measured"] == non_ep, (n, r["comm_bytes - ep_comm_bytes"])
    b = r["ep_comm_bytes >= counts+norm"]
    assert b["lower_bound"] and b["holds"] and b["predicted"] == layers * 2 * 8 * experts + norm, (n, b)
    est = r["ep_comm_bytes: all-to-all rows"]
    assert est["estimate"] and est["predicted"] == layers * 2 * 2 * 512 * 128 * 8, (n, est)
    ratio = est["measured"] / est["predicted"]
    assert 0.5 < ratio <= (1 + 1.25) / 2, (n, ratio)
    print(f"  {n}: comm_bytes - ep_comm_bytes {non_ep} equal, ep rows {est['measured']:.0f} "
          f"against the estimate {est['predicted']} ({ratio - 1:+.1%}), model state equal")

# ZeRO-0 and DDP
print("--compare, ZeRO-0 / DDP:")
for n in ("single", "np1", "ddp2", "ddp2_sel"): check_compare(n)
assert "comm_bytes" in text["ddp2"], "compare text lacks comm_bytes"
assert meas("single", "comm_bytes") == 0 == rows("single")["comm_bytes"]["predicted"]
# a world of one under mpirun with --backend: the DDP wrapper all-reduces the gradients as at
# dp 2 (2 x 4 Psi), but the step's 16-byte verdict stays local
assert rows("np1")["comm_bytes"]["predicted"] == rows("ddp2")["comm_bytes"]["predicted"] - 16 > 0
# the asynchronous save's pool, rank 0's: tiny without ZeRO, 3 x 4 B a parameter and a 4-byte step
# count for each of its 52 tensors; a synchronous run (np1) holds none
assert meas("ddp2", "snapshot_pool_bytes") == 4 * (3 * 875264 + 52) == meas("single", "snapshot_pool_bytes")
assert meas("np1", "snapshot_pool_bytes") == 0 and cfg("np1")["config"]["save_dir"]
print("--compare, ZeRO:")
for n in zero_logs: check_compare(n)
print("--compare, tensor parallel:")
for n in ("tp2", "tp2dp2_ac", "tp2dp2_z3"): check_compare(n)

# Stage 0's comm_bytes (kiln's rule, tests/cli/pipeline.sh): its K activations sent on, its tied
# wte gradient sent to the last stage (the dp shard under ZeRO), the world's 24-byte verdict, plus
# ZeRO-1's 8 Psi' or tp's (1 + 4 L_0) 2A per micro-batch; model state of its own units.
print("--compare, pipeline parallel:")
for n in ("pp2", "pp3", "dp2pp2_z1", "tp2pp2"): check_compare(n)
assert "predicted for rank 0, the rank that wrote the log: pipeline stage 0 of 3, holding 1 of the 4 blocks" in text["pp3"], text["pp3"]
# the split is checked stage by stage: pp 3 over 4 blocks is 1, 2, 1
r = rows("pp3")
assert [r[f"pipeline.stage_{s}.blocks"]["measured"] for s in range(3)] == [1, 2, 1], r
# tiny, micro-batch 2: A = 2 x 128 x 128 x 4 = 131,072; wte 512 x 128 x 4 = 262,144
A, wte = 131072, 262144
assert meas("pp2", "comm_bytes") == 2 * A + wte + 24
assert meas("pp3", "comm_bytes") == 3 * A + wte + 24
print("pipeline: pp 3's split 1,2,1 and the comm_bytes of pp 2 / pp 3 by hand")

# sp: plain tp's traffic, plus c_attn's, c_fc's and the head's inputs gathered again in backward
# (their rows are what they keep), plus the replicated parameters' gradients all-reduced over tp
# in every backward. cp: K and V gathered once per layer and forward, their gradient reduce-
# scattered once, DDP / ZeRO over dp x cp (plan/cost_model.h, section 4).
print("--compare, sequence and context parallel:")
for n in ("sp2", "sp2dp2_z1_full", "cp2_z3_bf16", "cp4", "cp2_pp2"): check_compare(n)
assert cfg("sp2")["world"]["sp"] is True and cfg("cp4")["world"]["cp"] == 4
# tiny, micro-batch 2, K 2, fp32: btd = 2 x 128 x 128; L 4
btd, K, L = 2 * 128 * 128, 2, 4
regather = K * (2 * L + 1) * btd * 4                           # c_attn, c_fc per layer; the head
replicated = K * 2 * 4 * (6 * L * 128 + 2 * 128 + 128 * 128)   # LayerNorms, c_proj biases, ln_f, wpe
assert meas("sp2", "comm_bytes") == meas("tp2", "comm_bytes") + regather + replicated
# cp 4 at T 256, K 1, fp32: DDP over 4 ranks of tiny with wpe [256, 128] (Psi 891,648) and per
# layer the stacked K, V gathered ([2, 2, 4, 256, 32] x 4 B) and their gradient reduce-scattered
kv = 2 * 2 * 4 * 256 * 32 * 4
assert meas("cp4", "comm_bytes") == 2 * 4 * 891648 + 16 + L * 2 * kv
# cp 2 x pp 2, stage 0 (2 blocks; wte, wpe), K 2, fp32: DDP over dp x cp = 2 of its 478,464
# parameters; per block and micro-batch the K/V gather and its reduce-scatter ([2, 2, 4, 128, 32]
# x 4 B each); its 2 x 128 / 2 = 128 positions a micro-batch sent to stage 1 (128 x 128 x 4); the
# tied wte's gradient (65,536 x 4); the world's verdict (24)
kv2 = 2 * 2 * 4 * 128 * 32 * 4
assert meas("cp2_pp2", "comm_bytes") == 2 * 4 * 478464 + 2 * 2 * 2 * kv2 + 2 * 128 * 128 * 4 + 4 * 65536 + 24
print("sp: tp's traffic + the backward's re-gathers + the replicated gradients; cp 4: DDP + K/V gathers; cp 2 x pp 2, by hand")

# tiny-moe (8 experts, top-2, every block; without --ep every rank holds every expert):
# the experts in the units and the model state, the verdict's routing rows (n_moe_layers x (E + 3)
# floats, 2 x 4 x 44 B more), no tp collective inside an MoE block, the experts' weights not in
# autocast's cache (the DDP run is bf16 over fp32 weights: cast_copies = attention's only).
print("--compare, --precision fp8 (tensorwise and rowwise; tp, sp, cp; ZeRO-3's 8-bit weight gather):")
for n in ("f8_tp2", "f8_sp2", "f8_sp2_full", "f8_cp2", "f8_tp2_rw", "f8_sp2_rw", "f8_cp2tp2_rw", "f8_z3tp2"):
    assert cfg(n)["config"]["precision"] == "fp8" and cfg(n)["float8_layers"]["float8"] == cfg(n)["float8_layers"]["of"], n
    check_compare(n)
print("--compare, Mixture-of-Experts:")
moe = ("moe1", "moe_ddp2", "moe_z1", "moe_tp2", "moe_pp2")
for n in moe: check_compare(n)
# tiny-moe: Psi 4,567,296 (1,406,208 active); X = 4 MoE layers x (8 + 3) = 44 routing floats
P, X = 4567296, 44
for n in moe:
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
# the pool of an MoE model without ZeRO: its parameters (the bf16 run's fp32 weights) and 4 + 4 x 13 tensors
assert meas("moe_ddp2", "snapshot_pool_bytes") == 4 * (3 * P + 4 + 4 * 13)
print("MoE: the experts in the model state, the routing rows in the verdict, no tp collective in MoE blocks, by hand")

# --ep 2 at dp 2, at dp 2 x tp 2, with ZeRO-1 at dp 4 and with pp 2 x ZeRO-1: each rank holds 4 of
# the 8 experts (params_local and the model state exact; under ZeRO the experts sharded over the
# ranks holding the same ones); comm_bytes less the step's ep_comm_bytes (the dense gradients over
# dp, the experts' over their copies -- a group of one at dp = ep: nothing --, the verdict, tp,
# pp) exact every step; ep_comm_bytes exactly what the step's logged rows say.
print("--compare, expert parallel:")
# dp 2, ep 2: 2 x 4 x 352,512 dense + the verdict 2 x 4 x (2 + 44); tp 2 x ep 2: 2 x 4 x 187,904
# dense + 368 + tiny-moe's tp traffic at tp 2 (5,255,184); ZeRO-1 at dp 4: (4 + 4) x 2,459,904
# (the dense units over dp 4, the experts over their 2 copies) + the verdict with the norm
# 2 x 4 x (3 + 44); pp 2 x ZeRO-1: stage 0's figure (2 MoE blocks; kiln train measured 2,130,296)
check_compare_ep("ep2", 2 * 4 * 352512 + 368, 4, 16)
check_compare_ep("ep2tp2", 2 * 4 * 187904 + 368 + 5255184, 4, 16)
check_compare_ep("ep2z1dp4", 8 * 2459904 + 376, 4, 0)
check_compare_ep("ep2pp2z1", 2130296, 2, 0)
# ZeRO-3 at dp 4, ep 2, K 2, fp32: the dense units (the outer unit 82,176 and 4 blocks' attention
# 66,560 + the router 8 x 128 = 67,584, both multiples of 4 x 64) gathered
# for each forward and, but the outer unit and the last block, each backward, and reduce-scattered
# each micro-step; the experts (4 x 4 x 131,712 = 2,107,392 a rank, over their 2 copies) alike;
# the verdict with the norm and the routing rows
dense, experts = 82176 + 4 * 67584, 4 * 4 * 131712
check_compare_ep("ep2z3dp4", 2 * 4 * (dense + dense - 82176 - 67584 + dense) + 2 * 4 * (experts + experts - 4 * 131712 + experts) + 2 * 4 * (3 + 44), 4, 0)
assert "layout: dp 2 (ep 2) tp 2 pp 1" in text["ep2tp2"], text["ep2tp2"]
# ZeRO-1 under ep: the pool is 12 B an element of the rank's shards, the dense over dp 4, the experts over their 2 copies
assert meas("ep2z1dp4", "snapshot_pool_bytes") == 12 * (rows("ep2z1dp4")["padded_params"]["measured"] - 2107392) // 4 + 12 * 2107392 // 2

# tiny-llama (rotary positions: no wpe; RMSNorm: d weights; SwiGLU: three matrices; no biases; an
# untied lm_head; GQA 4 over 2) and tiny-mixtral (SwiGLU experts): the units, the model state and
# comm_bytes exact on every layout kind -- DDP with bf16 autocast's cast copies under selective,
# ZeRO-3 with everything offloaded, ZeRO-2 with the optimizer offloaded at tp 2 with Qwen2's q/k/v
# biases, tp 2 + sp (the norms' weights all-reduced), cp 2, pp 2 untied and tied, ep 2.
print("--compare, the Llama family:")
for n in ("llama_ddp2_sel", "llama_z3_off", "qwen_tp2dp2_z2_off", "llama_sp2", "llama_cp2", "llama_pp2", "llama_pp2_tied"):
    check_compare(n)
# tiny-mixtral at dp 2, ep 2: its dense 330,880 parameters (2,493,568 less 4 layers x 4 SwiGLU
# experts of 3 x 352 x 128) all-reduced over dp, the verdict with 4 x (4 + 3) routing floats
check_compare_ep("mixtral_ep2", 2 * 4 * 330880 + 2 * 4 * (2 + 28), 4, 16, 4)
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
# pp 2, stage 0 of an untied Llama: wte and 2 blocks of 6 tensors (RMSNorm weights, no biases)
assert meas("llama_pp2", "snapshot_pool_bytes") == 4 * (3 * meas("llama_pp2", "params_local") + 1 + 2 * 6)
print("Llama family: tied / untied pipeline traffic, cast copies, by hand")

# the nine saving runs hold a pool, one per kind of layout (ZeRO-3 with everything offloaded: beside the host state)
for n in ("single", "ddp2", "z3_all_reduce_np4", "tp2pp2", "cp2_pp2", "moe_ddp2", "ep2z1dp4", "llama_pp2"):
    assert meas(n, "snapshot_pool_bytes") > 0 and cfg(n)["config"]["async_save"], n
assert meas("z3_all_reduce_np4", "model_state.host.optimizer") > 0
print("the asynchronous save's snapshot pool: equal on DDP, ZeRO-3 offload, tp x pp, cp x pp, MoE, ep x ZeRO-1, Llama pp; 0 when synchronous")

# ---- the suggested commands ran the planned layout, model and precision
for n in ("tp2dp2_z3", "cmd2", "cmd3", "cp4", "cmd5", "llama_sp2"):
    plan, run = js(f"plan_{n}"), cfg(n)
    l, c, w = plan["layout"], run["config"], run["world"]
    assert (w["dp"], w["tp"], w["pp"]) == (l["dp"], l["tp"], l["pp"]), (w, l)
    assert (w.get("cp", 1), w.get("sp", False)) == (l["cp"], l["sp"]), (w, l)
    assert (c["zero"], c["offload"], c["activation_checkpointing"]) == (l["zero"], l["offload"], l["activation_checkpointing"]), c
    assert (c["micro_batch"], c["grad_accum"]) == (l["micro_batch"], l["grad_accum"]), c
    assert run["params"] == plan["model"]["params"], (run["params"], plan["model"]["params"])
    for key in ("n_layer", "n_head", "n_kv_head", "d_model", "seq_len", "vocab_size"):
        assert plan["model"][key] == c[key], (key, plan["model"][key], c[key])
    for key in ("position", "norm", "mlp", "ffn_hidden", "bias", "tie_embeddings", "rope_theta"):  # absent for GPT-2 in both
        assert plan["model"].get(key) == c.get(key), (key, plan["model"].get(key), c.get(key))
    assert run["compute_dtype"] == ("BFloat16" if l["compute_bytes"] == 2 else "Float"), run["compute_dtype"]
# the command names the preset and only what differs from it
assert " kiln train --model tiny --n-layer 3 --n-head 2 --d-model 64 --precision bf16 --pp 2 " in js("plan_cmd2")["layout"]["command"]
assert js("plan_cp4")["layout"]["command"] == "mpirun -np 4 kiln train --model tiny --seq-len 256 --cp 4 --micro-batch 2"
print("the suggested commands ran the layout, the model and the precision the plan planned")
for n in ("cmd2", "cmd3", "cmd5"): check_compare(n)  # a shape by flags at pp 2, cp 2 x tp 2, a Llama shape by flags, as the plan wrote them
PY
echo "PASS"
