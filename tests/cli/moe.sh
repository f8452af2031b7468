#!/usr/bin/env bash
# tests/cli/moe.sh -- Mixture-of-Experts GPT (models/moe.h; --model tiny-moe: 8 experts, top-2 in
# every block) end to end against the single process at the same global batch of 8 sequences
# (label mpi):
#   reference   1 process, micro-batch 2 x grad-accum 4, capacity factor 1.25 (tokens dropped)
#   dp 2        DDP, 2 x 2;  ZeRO-1 and ZeRO-3 over dp 2;  tp 2 (the MoE layers replicated);
#               pp 2;  full activation checkpointing
#   dropless    --moe-capacity-factor 0: 1 process against dp 2
#   ep          expert parallelism (parallel/expert_parallel.h): ep 2 over dp 2, ep 2 with dp 4,
#               ep 4 with dp 4, dropless ep 4, ep 2 x tp 2 (4 ranks); with ZeRO-1 at dp 2 and
#               dp 4, ZeRO-2 offloaded at dp 4, ZeRO-1 x tp 2, ZeRO-3 at dp 2 and dp 4, ZeRO-3 --offload all at dp 2 and dp 4 (the host adds delayed); with pp 2 (DDP and ZeRO-1); with
#               full recomputation, and ZeRO-2 with selective
# At a context of 64 (tiny-moe's is 128; the capacity, per sequence, then admits 20 of 64 x 2 / 8
# assignments an expert; a quarter less compute a run). Checked over 10 steps: loss and gradient norm per step and the final weights' fingerprint within
# a relative 1e-5 (the DDP parity tolerance, tests/cli/ddp_parity.sh: the same products summed in
# another order); the routing figures of every step (moe_dropped, moe_max_load, moe_min_load,
# per-layer loads) EXACTLY equal -- capacity is per sequence (models/moe.h), so every layout
# routes and drops what the single process does -- and moe_aux_loss / moe_z_loss within 1e-5.
# A capacity counted per micro-batch or per rank, a loss averaged over the wrong ranks or a
# missing expert gradient reduction moves these by far more.
# comm_bytes of DDP exactly: 2 x 4 psi (the gradients' all-reduce) + 2 x 4 (2 + L (E + 3)) (the
# verdict [loss, non-finite] with the MoE stats rows riding in it; models/moe_stats.h).
# bf16: dp 2 under ZeRO-1 against 1 process within the 16-bit tolerances (tests/cli/
# param_dtype_zero.sh) over 5 steps; ep 2, and ep 2 x ZeRO-2 at dp 4; fp16: ep 2 x ZeRO-1 at dp 4.
# Training: 100 steps of tiny-moe fall like the dense tiny model's, and the balance loss keeps the
# most chosen expert's load within a band (the figures below).
# Checkpoints: resumed at step 5 on the same layout the run replays steps 6-10 exactly (==);
# resumed on dp 2 x ZeRO-1 and from a tp 2 checkpoint on 1 process, within 1e-5; an ep 2
# checkpoint (every expert saved once, whole) replayed exactly on ep 2 and resumed within 1e-5 on
# one process and on ep 4; an ep 2 x ZeRO-2 one replayed exactly and resumed on one process; the
# single process's resumed on ep 2 x ZeRO-1; an ep 2 x pp 2 one and an ep 2 x ZeRO-3 (dp 4) one
# resumed on one process.
# comm_bytes - ep_comm_bytes of ep 2 x ZeRO-1 (dp 2, dp 4) exactly (the ZeRO traffic of both kinds
# of unit and the verdict); one host read per MoE layer and forward under ep (device-check mode).
# --sample-every under ep 2 and ep 2 x tp 2: the first ep group's ranks sample together (their
# MoE layers exchange rows), and the text is the single process's (the same seed, weights within
# 1e-5: no draw falls between them).
# Bad input: --sp / --cp with experts, --ep not dividing the experts or dp, on a dense
# model, top-k above the experts, a negative capacity factor,
# --moe-every 0, --init-from a dense checkpoint into an MoE model.
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
# One thread per process: every rank of 2 or more on this test's 2 cores gets one anyway, and the
# single-process runs -- faster so on a model this small -- run in the background beside the
# multi-rank ones where nothing waits for them (one thread: the same arithmetic whatever runs beside).
export OMP_NUM_THREADS=1
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
T=(train --device cpu --model tiny-moe --steps 10 --log-every 100 --micro-batch 2 --seq-len 64)
bg=()

"$KILN_BIN" "${T[@]}" --grad-accum 4 --save-dir "$work/ref" --save-every 5 --keep-last 0 --sample-every 10 --log-json "$work/ref.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 2 --log-json "$work/dp2.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 2 --zero 1 --log-json "$work/z1.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 2 --zero 3 --log-json "$work/z3.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 4 --tp 2 --save-dir "$work/tp2" --save-every 5 --log-json "$work/tp2.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 4 --pp 2 --log-json "$work/pp2.jsonl" >/dev/null
"$KILN_BIN" "${T[@]}" --grad-accum 4 --activation-checkpointing full --log-json "$work/ac.jsonl" >/dev/null & bg+=($!)
"$KILN_BIN" "${T[@]}" --grad-accum 4 --moe-capacity-factor 0 --log-json "$work/ref0.jsonl" >/dev/null & bg+=($!)
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 2 --moe-capacity-factor 0 --log-json "$work/dp2_0.jsonl" >/dev/null
# Expert parallelism: ep 2 over dp 2, ep 2 with dp 4 (two ep groups; the experts reduced over
# the pairs holding the same ones), ep 4 with dp 4 (one expert pair per rank), dropless ep 4.
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 2 --ep 2 --save-dir "$work/ep2" --save-every 5 --sample-every 10 --log-json "$work/ep2.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 1 --ep 2 --log-json "$work/ep2dp4.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 1 --ep 4 --log-json "$work/ep4.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 1 --ep 4 --moe-capacity-factor 0 --log-json "$work/ep4_0.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 2 --tp 2 --ep 2 --sample-every 10 --log-json "$work/ep2tp2.jsonl" >/dev/null
# ... with ZeRO (the experts sharded over the ranks holding the same ones, parallel/zero.h): ZeRO-1
# at ep = dp 2 (the experts' group of one reduces nothing) and at dp 4; ZeRO-2 with the optimizer
# offloaded, saved at step 5; ZeRO-1 with tp 2. With pp 2 (ep groups per stage): DDP and ZeRO-1.
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 2 --ep 2 --zero 1 --log-json "$work/ep2z1.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 1 --ep 2 --zero 1 --log-json "$work/ep2z1dp4.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 2 --micro-batch 1 --ep 2 --zero 2 --offload optimizer --save-dir "$work/ep2z2" --save-every 5 --log-json "$work/ep2z2.jsonl" >/dev/null
# ZeRO-3 with ep: each MoE block's dense part gathered over dp, its experts over their copies
# (dp 2: a group of one; dp 4: two), prefetched and freed together; the dp 4 one saved at step 5
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 2 --ep 2 --zero 3 --log-json "$work/ep2z3.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 1 --ep 2 --zero 3 --save-dir "$work/ep2z3dp4" --save-every 5 --log-json "$work/ep2z3dp4.jsonl" >/dev/null
# ... and with everything offloaded (--offload all, issue 50): dp = ep 2, the experts' units alone
# in their group (their gradients now reach the host shard through the host accumulator: the
# add_ of a device tensor into a host one failed on a GPU, which gpu.mpi_share checks); dp 4 > ep 2
# at grad-accum 2 with every host add delayed 30 ms and 16 slots (tests only: the second
# micro-step's adds are all still in flight when backward ends), the experts' 1 / ep taken after a
# drain of the accumulator. Without that drain this run's gradient norm is 7.45 at step 1 against
# the reference's 6.49 (checked by removing it, 2026-11-29); with the default 2 slots the slots'
# own waits happen to land the experts' adds first, so the race did not show.
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 2 --ep 2 --zero 3 --offload all --log-json "$work/ep2z3off.jsonl" >/dev/null
mpi 4 -x KILN_TEST_HOST_ADD_DELAY_MS=30 -x KILN_TEST_HOST_ADD_SLOTS=16 "$KILN_BIN" "${T[@]}" --grad-accum 2 --micro-batch 1 --ep 2 --zero 3 --offload all --log-json "$work/ep2z3offdp4.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 2 --tp 2 --ep 2 --zero 1 --log-json "$work/ep2tp2z1.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 2 --pp 2 --ep 2 --save-dir "$work/ep2pp2" --save-every 5 --log-json "$work/ep2pp2.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 2 --pp 2 --ep 2 --zero 1 --log-json "$work/ep2pp2z1.jsonl" >/dev/null
# ... with recomputation: the recomputed forward dispatches again (full; selective keeps the MoE block).
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 2 --ep 2 --activation-checkpointing full --log-json "$work/ep2ac.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 2 --ep 2 --zero 2 --activation-checkpointing selective --log-json "$work/ep2z2sel.jsonl" >/dev/null
# bf16, 5 steps (bf16 is slow on this CPU).
B=(train --device cpu --model tiny-moe --steps 5 --log-every 100 --micro-batch 2 --seq-len 64 --precision bf16)
"$KILN_BIN" "${B[@]}" --grad-accum 4 --log-json "$work/ref_bf16.jsonl" >/dev/null & bg+=($!)
mpi 2 "$KILN_BIN" "${B[@]}" --grad-accum 2 --zero 1 --log-json "$work/z1_bf16.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${B[@]}" --grad-accum 2 --ep 2 --log-json "$work/ep2_bf16.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${B[@]}" --grad-accum 1 --ep 2 --zero 2 --reduce-dtype bf16 --log-json "$work/ep2z2_bf16.jsonl" >/dev/null
# fp16 (dynamic loss scaling; the router losses' gradients take the loss scale): ep 2 x ZeRO-1 at dp 4.
F=(train --device cpu --model tiny-moe --steps 5 --log-every 100 --micro-batch 2 --seq-len 64 --precision fp16)
"$KILN_BIN" "${F[@]}" --grad-accum 4 --log-json "$work/ref_fp16.jsonl" >/dev/null & bg+=($!)
mpi 4 "$KILN_BIN" "${F[@]}" --grad-accum 1 --ep 2 --zero 1 --log-json "$work/ep2z1_fp16.jsonl" >/dev/null
# Training: 100 steps of tiny-moe against the dense tiny model, one thread each, side by side.
C=(train --device cpu --steps 100 --log-every 1000 --micro-batch 4)
"$KILN_BIN" "${C[@]}" --model tiny --log-json "$work/dense100.jsonl" >/dev/null & bg+=($!)
"$KILN_BIN" "${C[@]}" --model tiny-moe --log-json "$work/moe100.jsonl" >/dev/null & bg+=($!)
# Checkpoints: replay on the same layout; resume on another; a tp 2 checkpoint on one process.
"$KILN_BIN" "${T[@]}" --grad-accum 4 --resume "$work/ref/step_00000005" --save-dir "$work/replay" --log-json "$work/replay.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 2 --zero 1 --resume "$work/ref/step_00000005" --save-dir "$work/to_z1" --log-json "$work/to_z1.jsonl" >/dev/null
"$KILN_BIN" "${T[@]}" --grad-accum 4 --resume "$work/tp2/step_00000005" --save-dir "$work/from_tp2" --log-json "$work/from_tp2.jsonl" >/dev/null
# ... and under expert parallelism: ep 2 replayed on ep 2; its checkpoint on one process and on ep 4.
mpi 2 "$KILN_BIN" "${T[@]}" --grad-accum 2 --ep 2 --resume "$work/ep2/step_00000005" --save-dir "$work/ep2_replay" --log-json "$work/ep2_replay.jsonl" >/dev/null
"$KILN_BIN" "${T[@]}" --grad-accum 4 --resume "$work/ep2/step_00000005" --save-dir "$work/from_ep2" --log-json "$work/from_ep2.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 1 --ep 4 --resume "$work/ep2/step_00000005" --save-dir "$work/ep2_to_ep4" --log-json "$work/ep2_to_ep4.jsonl" >/dev/null
# ... and the ep 2 x ZeRO-2 checkpoint replayed on its layout, resumed on one process; the
# single process's resumed on ep 2 x ZeRO-1 (dp 4); the ep 2 x pp 2 one on one process.
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 2 --micro-batch 1 --ep 2 --zero 2 --offload optimizer --resume "$work/ep2z2/step_00000005" --log-json "$work/ep2z2_replay.jsonl" >/dev/null
"$KILN_BIN" "${T[@]}" --grad-accum 4 --resume "$work/ep2z2/step_00000005" --log-json "$work/from_ep2z2.jsonl" >/dev/null
"$KILN_BIN" "${T[@]}" --grad-accum 4 --resume "$work/ep2z3dp4/step_00000005" --log-json "$work/from_ep2z3dp4.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${T[@]}" --grad-accum 1 --ep 2 --zero 1 --resume "$work/ref/step_00000005" --log-json "$work/to_ep2z1.jsonl" >/dev/null
"$KILN_BIN" "${T[@]}" --grad-accum 4 --resume "$work/ep2pp2/step_00000005" --log-json "$work/from_ep2pp2.jsonl" >/dev/null
for pid in "${bg[@]}"; do wait "$pid" || fail "a background run"; done
# ep 2 with a router that sends no token to rank 1's experts (rows 0-3 v, -v, w, -w: two of them
# non-negative for any input; rows 4-7 zero): rank 1's experts run no rows. Its output was then
# outside the autograd graph, rank 1 skipped the backward all-to-alls and rank 0 hung (issue 34,
# defect 2; the timeouts below turn a regression into a failure in about a minute). Now the run
# ends and equals one process, starved experts and all.
python3 - "$work/ref/step_00000005" "$work/skew" <<'PY'
import json, random, shutil, struct, sys, zlib
src, dst = sys.argv[1], sys.argv[2]
shutil.copytree(src, dst)
data = bytearray(open(f"{dst}/model.safetensors", "rb").read())
n = struct.unpack("<Q", data[:8])[0]
random.seed(0)
for name, t in json.loads(data[8:8 + n]).items():
    if name.endswith("moe.router"):
        E, d = t["shape"]
        v, w = [random.gauss(0, 1) for _ in range(d)], [random.gauss(0, 1) for _ in range(d)]
        rows = [v, [-a for a in v], w, [-a for a in w]] + [[0.0] * d] * (E - 4)
        s, e = t["data_offsets"]
        data[8 + n + s:8 + n + e] = struct.pack(f"<{E * d}f", *[x for r in rows for x in r])
open(f"{dst}/model.safetensors", "wb").write(bytes(data))
st = json.load(open(f"{dst}/trainer_state.json"))
st["files"]["model.safetensors"] = zlib.crc32(bytes(data)) & 0xffffffff
json.dump(st, open(f"{dst}/trainer_state.json", "w"))
PY
S=(train --device cpu --model tiny-moe --steps 3 --log-every 100 --micro-batch 2 --seq-len 64 --init-from "$work/skew")
"$KILN_BIN" "${S[@]}" --grad-accum 4 --log-json "$work/skew1.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${S[@]}" --grad-accum 2 --ep 2 --comm-timeout 30 --comm-init-timeout 60 --log-json "$work/skew_ep2.jsonl" >/dev/null 2>"$work/skew.err" ||
  { cat "$work/skew.err"; fail "ep 2 with rank 1's experts starved did not finish"; }
[ ! -e "$work/ref/step_00000010/config.json" ] || fail "an MoE checkpoint has no GPT2LMHeadModel config.json"

python3 - "$work" "$(dirname "$0")" <<'PY'
import sys
d, here = sys.argv[1], sys.argv[2]
sys.path.insert(0, here)
from zero_expect import load, compare, steps

ROUTING = ("moe_dropped", "moe_max_load", "moe_min_load", "moe_max_load_by_layer")


def same_routing(ref, run, name, first=1):
    sr, ss = steps(ref), steps(run)
    worst = 0.0
    for s in sorted(ss):
        if s < first:
            continue
        for key in ROUTING:
            assert sr[s][key] == ss[s][key], (name, s, key, sr[s][key], ss[s][key])
        for key in ("moe_aux_loss", "moe_z_loss"):
            e = abs(sr[s][key] - ss[s][key]) / abs(sr[s][key])
            worst = max(worst, e)
            assert e <= 1e-5, (name, s, key, sr[s][key], ss[s][key])
    return worst


ref = load(f"{d}/ref.jsonl")
c0 = ref[0]
assert c0["params"] == 4567296 - 64 * 128 and c0["params_active"] == 1406208 - 64 * 128  # wpe: 64 positions, (c0["params"], c0["params_active"])
L, E = c0["config"]["n_layer"], c0["config"]["n_experts"]
assert all(0 < r["moe_dropped"] < 0.5 for r in steps(ref).values()), "capacity 1.25 drops some assignments"
# --sample-every under expert parallelism: the sample the first ep group draws together is the
# single process's (64 tokens drawn at temperature 1 with the same seed)
sample = lambda rs: [r["text"] for r in rs if r["type"] == "sample"]
assert len(sample(ref)) == 1 and sample(ref)[0], sample(ref)
for name in ("ep2", "ep2tp2"):
    assert sample(load(f"{d}/{name}.jsonl")) == sample(ref), (name, sample(load(f"{d}/{name}.jsonl")), sample(ref))
print(f"--sample-every at ep 2 and ep 2 x tp 2: the single process's sample ({len(sample(ref)[0])} characters)")
for name, world in (("dp2", (2, 1, 1)), ("z1", (2, 1, 1)), ("z3", (2, 1, 1)), ("tp2", (1, 2, 1)), ("pp2", (1, 1, 2)),
                    ("ac", (1, 1, 1))):
    run = load(f"{d}/{name}.jsonl")
    w = run[0]["world"]
    assert (w["dp"], w["tp"], w["pp"]) == world, (name, w)
    worst = compare(ref, run, name, 1e-5)
    aux = same_routing(ref, run, name)
    print(f"{name}: losses, norms and fingerprint within {worst:.1e}; routing identical, aux/z within {aux:.1e}")
for name, ep, dp, r in (("ep2", 2, 2, ref), ("ep2dp4", 2, 4, ref), ("ep4", 4, 4, ref), ("ep4_0", 4, 4, load(f"{d}/ref0.jsonl")),
                        ("ep2tp2", 2, 2, ref), ("ep2z1", 2, 2, ref), ("ep2z1dp4", 2, 4, ref), ("ep2z2", 2, 4, ref),
                        ("ep2tp2z1", 2, 2, ref), ("ep2pp2", 2, 2, ref), ("ep2pp2z1", 2, 2, ref), ("ep2ac", 2, 2, ref),
                        ("ep2z2sel", 2, 2, ref), ("ep2z3", 2, 2, ref), ("ep2z3dp4", 2, 4, ref),
                        ("ep2z3off", 2, 2, ref), ("ep2z3offdp4", 2, 4, ref)):
    run = load(f"{d}/{name}.jsonl")
    assert (run[0]["world"]["dp"], run[0]["config"]["ep"]) == (dp, ep), (name, run[0]["world"])
    # Each rank holds E / ep experts of every MoE layer.
    expert = 4 * (E * (2 * 128 * 512 + 512 + 128))  # fc_w, fc_b, proj_w, proj_b of the 4 MoE layers, all experts
    if run[0]["world"]["tp"] == 1 and run[0]["world"]["pp"] == 1:
        assert run[0]["params_local"] == r[0]["params"] - expert + expert // ep, (name, run[0]["params_local"])
    worst = compare(r, run, name, 1e-5)
    aux = same_routing(r, run, name)
    print(f"{name}: losses, norms and fingerprint within {worst:.1e}; routing identical, aux/z within {aux:.1e}")

# One host read per MoE layer and forward under ep, as without it (the device-check mode counts
# them): the counts' all_to_all runs on the device before the layer's read, which takes both.
for name, K, forwards in (("ep2", 2, 1), ("ep2ac", 2, 2), ("ep2z1dp4", 1, 1)):
    for s in steps(load(f"{d}/{name}.jsonl")).values():
        assert s["host_syncs_before_update"] == L * K * forwards, (name, s["step"], s["host_syncs_before_update"])
print("ep: one host sync per MoE layer and forward")

# DDP's traffic, exactly.
dp2 = load(f"{d}/dp2.jsonl")
want = 2 * 4 * dp2[0]["params_local"] + 2 * 4 * (2 + L * (E + 3))
for s in steps(dp2).values():
    assert s["comm_bytes"] == want, (s["step"], s["comm_bytes"], want)
print(f"dp2: comm_bytes {want} per step, exactly")
# ZeRO-1 under ep, exactly outside the all-to-alls: 4 + 4 bytes (reduce-scatter, all-gather) per
# padded element of the dense units (over dp) and of the expert units (over the expert-data-
# parallel group; nothing when it is one rank), and the verdict with its MoE rows and the norm.
verdict = 2 * 4 * (3 + L * (E + 3))
experts_local = expert // 2  # this rank's experts at ep 2, a multiple of 64 already (no padding)
for name, expert_traffic in (("ep2z1", 0), ("ep2z1dp4", 8 * experts_local)):
    run = load(f"{d}/{name}.jsonl")
    padded = run[0]["zero"]["padded_params"]
    want = 8 * (padded - experts_local) + expert_traffic + verdict
    for s in steps(run).values():
        assert s["comm_bytes"] - s["ep_comm_bytes"] == want, (name, s["step"], s["comm_bytes"], s["ep_comm_bytes"], want)
    print(f"{name}: comm_bytes - ep_comm_bytes {want} per step, exactly")

# Dropless: nothing dropped, the same parity.
ref0, dp2_0 = load(f"{d}/ref0.jsonl"), load(f"{d}/dp2_0.jsonl")
assert all(r["moe_dropped"] == 0 for r in steps(ref0).values())
worst = compare(ref0, dp2_0, "dp2_0", 1e-5)
same_routing(ref0, dp2_0, "dp2_0")
print(f"dropless dp2: within {worst:.1e}, routing identical")

# bf16: the 16-bit tolerances.
rb, zb = steps(load(f"{d}/ref_bf16.jsonl")), steps(load(f"{d}/z1_bf16.jsonl"))
for s in rb:
    assert abs(rb[s]["loss"] - zb[s]["loss"]) / rb[s]["loss"] <= 5e-4, (s, rb[s]["loss"], zb[s]["loss"])
    assert abs(rb[s]["grad_norm"] - zb[s]["grad_norm"]) / rb[s]["grad_norm"] <= 2e-2, (s, rb[s]["grad_norm"], zb[s]["grad_norm"])
eb = steps(load(f"{d}/ep2_bf16.jsonl"))
for s in rb:
    assert abs(rb[s]["loss"] - eb[s]["loss"]) / rb[s]["loss"] <= 5e-4, (s, rb[s]["loss"], eb[s]["loss"])
    assert abs(rb[s]["grad_norm"] - eb[s]["grad_norm"]) / rb[s]["grad_norm"] <= 2e-2, (s, rb[s]["grad_norm"], eb[s]["grad_norm"])
eb = steps(load(f"{d}/ep2z2_bf16.jsonl"))
for s in rb:
    assert abs(rb[s]["loss"] - eb[s]["loss"]) / rb[s]["loss"] <= 5e-4, (s, rb[s]["loss"], eb[s]["loss"])
    assert abs(rb[s]["grad_norm"] - eb[s]["grad_norm"]) / rb[s]["grad_norm"] <= 2e-2, (s, rb[s]["grad_norm"], eb[s]["grad_norm"])
print("bf16 z1 dp2, ep 2 and ep 2 x ZeRO-2 (bf16 reductions) at dp 4: within the 16-bit tolerances")
rf, ef = steps(load(f"{d}/ref_fp16.jsonl")), steps(load(f"{d}/ep2z1_fp16.jsonl"))
for s in rf:
    assert not rf[s]["skipped"] and not ef[s]["skipped"] and rf[s]["loss_scale"] == ef[s]["loss_scale"], (s, rf[s], ef[s])
    assert abs(rf[s]["loss"] - ef[s]["loss"]) / rf[s]["loss"] <= 5e-4, (s, rf[s]["loss"], ef[s]["loss"])
    assert abs(rf[s]["grad_norm"] - ef[s]["grad_norm"]) / rf[s]["grad_norm"] <= 2e-2, (s, rf[s]["grad_norm"], ef[s]["grad_norm"])
print("fp16 ep 2 x ZeRO-1 at dp 4: within the 16-bit tolerances, the same loss scale, nothing skipped")

# Training: the loss falls as the dense model's (measured at 100 steps: 1.027 against 1.082, mean
# of the last 10, when MoE came; 1.111 against 1.209 on 2026-11-27), and the balance loss keeps
# the loads in a band (measured: the most chosen expert at 1.57x the mean load on average over
# steps 61-100, 2.02x at worst, 1.44x on 2026-11-27; without it, 1.98x and 2.40x, docs/moe.md).
moe, dense = steps(load(f"{d}/moe100.jsonl")), steps(load(f"{d}/dense100.jsonl"))
last = lambda run: sum(run[s]["loss"] for s in range(91, 101)) / 10
assert last(moe) < 0.3 * moe[1]["loss"], (moe[1]["loss"], last(moe))
assert last(moe) <= 1.05 * last(dense), (last(moe), last(dense))
window = [moe[s] for s in range(61, 101)]
mean_max = sum(r["moe_max_load"] for r in window) / len(window)
# 1.7: the balance loss's coefficient zeroed (planted 2026-11-27) gave 1.80, which the old bound of
# 1.8 caught by a hair; with it, 1.44 today and 1.57 when MoE came.
assert mean_max < 1.7 and max(r["moe_max_load"] for r in window) < 2.5, mean_max
assert min(r["moe_min_load"] for r in window) > 0.15, "an expert starved"
print(f"training: loss {moe[1]['loss']:.3f} -> {last(moe):.3f} (dense {last(dense):.3f}); most chosen expert {mean_max:.2f}x the mean")

# Starved experts under ep: the run ended, and equals one process.
sk1, sk2 = load(f"{d}/skew1.jsonl"), load(f"{d}/skew_ep2.jsonl")
assert steps(sk1)[1]["moe_min_load"] == 0, "the skewed router starves experts at step 1"
worst = compare(sk1, sk2, "skew_ep2", 1e-5)
same_routing(sk1, sk2, "skew_ep2")
print(f"ep 2 with rank 1's experts given no rows: ended, within {worst:.1e} of one process, routing identical")

# Checkpoints.
sr, sp = steps(ref), steps(load(f"{d}/replay.jsonl"))
assert sorted(sp) == list(range(6, 11)), sorted(sp)
for s in sp:
    for key in ("loss", "grad_norm") + ROUTING + ("moe_aux_loss", "moe_z_loss"):
        assert sr[s][key] == sp[s][key], ("replay", s, key, sr[s][key], sp[s][key])
print("replay from step 5: steps 6-10 equal (==)")
for a, b in (("ep2", "ep2_replay"), ("ep2z2", "ep2z2_replay")):
    se, sr2 = steps(load(f"{d}/{a}.jsonl")), steps(load(f"{d}/{b}.jsonl"))
    assert sorted(sr2) == list(range(6, 11)), sorted(sr2)
    for s in sr2:
        for key in ("loss", "grad_norm") + ROUTING:
            assert se[s][key] == sr2[s][key], (b, s, key, se[s][key], sr2[s][key])
    print(f"{a} replay from step 5: steps 6-10 equal (==)")
for name in ("to_z1", "from_tp2", "from_ep2", "ep2_to_ep4", "from_ep2z2", "from_ep2z3dp4", "to_ep2z1", "from_ep2pp2"):
    worst = compare(ref, load(f"{d}/{name}.jsonl"), name, 1e-5, first=6)
    same_routing(ref, load(f"{d}/{name}.jsonl"), name, first=6)
    print(f"{name}: steps 6-10 within {worst:.1e}, routing identical")
PY

# Bad input: one line, exit 2.
expect_refused 2 "--ep 3 does not divide the experts \(--n-experts 8\); --ep values that do: 1, 2, 4, 8" train --device cpu --model tiny-moe --steps 1 --ep 3
expect_refused 2 "--ep 2 divides the experts of an MoE model" train --device cpu --model tiny --steps 1 --ep 2
expect_refused 2 "--ep 4 must divide the data-parallel size \(dp 2" train --device cpu --model tiny-moe --steps 1 --ep 4
expect_refused 1 "--top-k must be in \[1, --n-experts 8\]" train --device cpu --model tiny-moe --steps 1 --top-k 9
expect_refused 1 "--moe-capacity-factor must be 0" train --device cpu --model tiny-moe --steps 1 --moe-capacity-factor -1
expect_refused 1 "--moe-every must be positive" train --device cpu --model tiny-moe --steps 1 --moe-every 0
expect_refused 1 "--n-experts must be 0" train --device cpu --model tiny --steps 1 --n-experts -2
"$KILN_BIN" train --device cpu --model tiny --steps 1 --save-dir "$work/dense" >/dev/null
expect_refused 1 "a dense model cannot seed an MoE model" train --device cpu --model tiny-moe --steps 1 --init-from "$work/dense"
expect_refused 1 "is for another model shape: n_experts 8 \(this run: dense\)" train --device cpu --model tiny --seq-len 64 --steps 6 --resume "$work/ref/step_00000005"
echo "PASS moe"
