#!/usr/bin/env bash
# tests/cli/compose.sh -- the parallelisms together (issue 36; label mpi): every pair and triple
# that was refused before, and all five dimensions at once on 16 ranks (oversubscribed), each
# against one process on the same global batch of 8 sequences, 10 steps.
#   dense (tiny; tiny-llama for rotary positions under a split sequence)
#     cp 2 x tp 2 + sp                    sp splits each rank's cp chunk over tp (4 ranks); tiny-llama too
#     cp 2 x tp 2 + sp x pp 2             8 ranks
#     dp 2 x cp 2 x tp 2 + sp, ZeRO-1     8 ranks
#     dp 2 x cp 2 x tp 2 + sp x pp 2, ZeRO-1          all five but ep: 16 ranks; its step-5
#                                         checkpoint resumed in one process (steps 6-10)
#   MoE (tiny-moe, with the balance and z losses on: their parts must add up)
#     tp 2 + sp; cp 2; cp 2 x tp 2 + sp   routing per sequence as the single process routes it
#     tp 2 + sp with full recomputation   (the recomputed forward gathers the choices again)
#     cp 2 x ep 2 (dp 2)                  the experts' copies span cp (distributed/mesh.h)
#     cp 2 under ZeRO-3
#     dp 2 x ep 2 x cp 2 x tp 2 + sp x pp 2, ZeRO-1   all five with MoE: 16 ranks
# (cp x pp, ZeRO-3 x pp, ZeRO-3 x ep, ep x sampling and the interleaved schedule have their own
# tests: mpi.sequence_parallel, mpi.pipeline_zero3, mpi.moe, mpi.pipeline_interleaved.)
# Tolerance: relative 1e-5 on every step's loss, gradient norm and the weights' fingerprint (the
# tp / cp / pp tests' own: the split layers, the gathered attention and the stages sum the same
# products in another order; measured ~1e-7); MoE: the routing figures (dropped fraction, max and
# min load, by layer) exactly equal every step, the balance and z losses within 1e-5 -- the
# ranks' parts of each sequence's losses add up to the single process's.
# kiln plan --compare on every run (one invocation): every exact row equal (model state, comm_bytes;
# with ep the traffic less the all-to-alls' rows, an estimate).
# Every process computes on one thread (OMP_NUM_THREADS=1); the single-process runs go two at a time.
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
mpi() { local np=$1; shift; timeout 600 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
export OMP_NUM_THREADS=1
D=(train --device cpu --model tiny --steps 10 --log-every 100 --micro-batch 2)
L=(train --device cpu --model tiny-llama --steps 10 --log-every 100 --micro-batch 2)
M=(train --device cpu --model tiny-moe --steps 10 --log-every 100 --micro-batch 2 --moe-aux-loss-coef 0.01 --moe-z-loss-coef 0.001)

"$KILN_BIN" "${D[@]}" --grad-accum 4 --log-json "$work/ref.jsonl" >/dev/null & bg=($!)
"$KILN_BIN" "${L[@]}" --grad-accum 4 --log-json "$work/ref_llama.jsonl" >/dev/null
wait "${bg[@]}"
mpi 4 "$KILN_BIN" "${D[@]}" --grad-accum 4 --cp 2 --tp 2 --sp --log-json "$work/cp_sp.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${L[@]}" --grad-accum 4 --cp 2 --tp 2 --sp --log-json "$work/llama_cp_sp.jsonl" >/dev/null
mpi 8 "$KILN_BIN" "${D[@]}" --grad-accum 4 --cp 2 --tp 2 --sp --pp 2 --log-json "$work/cp_sp_pp.jsonl" >/dev/null
mpi 8 "$KILN_BIN" "${D[@]}" --grad-accum 2 --cp 2 --tp 2 --sp --zero 1 --log-json "$work/dp_cp_sp_z1.jsonl" >/dev/null
mpi 16 "$KILN_BIN" "${D[@]}" --grad-accum 2 --cp 2 --tp 2 --sp --pp 2 --zero 1 --save-dir "$work/5d" --save-every 5 \
  --keep-last 0 --log-json "$work/5d.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${M[@]}" --grad-accum 4 --tp 2 --sp --log-json "$work/moe_sp.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${M[@]}" --grad-accum 4 --cp 2 --log-json "$work/moe_cp.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${M[@]}" --grad-accum 4 --cp 2 --tp 2 --sp --log-json "$work/moe_cp_sp.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${M[@]}" --grad-accum 4 --tp 2 --sp --activation-checkpointing full --log-json "$work/moe_sp_ac.jsonl" >/dev/null
mpi 4 "$KILN_BIN" "${M[@]}" --grad-accum 2 --cp 2 --ep 2 --log-json "$work/moe_cp_ep.jsonl" >/dev/null
mpi 2 "$KILN_BIN" "${M[@]}" --grad-accum 4 --cp 2 --zero 3 --log-json "$work/moe_cp_z3.jsonl" >/dev/null
mpi 16 "$KILN_BIN" "${M[@]}" --grad-accum 2 --ep 2 --cp 2 --tp 2 --sp --pp 2 --zero 1 --log-json "$work/moe_5d.jsonl" >/dev/null
"$KILN_BIN" "${D[@]}" --grad-accum 4 --resume "$work/5d/step_00000005" --save-dir "$work/from_5d" \
  --log-json "$work/from_5d.jsonl" >/dev/null & bg=($!)
"$KILN_BIN" "${M[@]}" --grad-accum 4 --log-json "$work/ref_moe.jsonl" >/dev/null
wait "${bg[@]}"
names=(cp_sp llama_cp_sp cp_sp_pp dp_cp_sp_z1 5d moe_sp moe_cp moe_cp_sp moe_sp_ac moe_cp_ep moe_cp_z3 moe_5d)
"$KILN_BIN" plan $(printf -- "--compare $work/%s.jsonl " "${names[@]}") --json >"$work/cmp.json" || fail "kiln plan --compare ${names[*]}"

python3 - "$work" "$(dirname "$0")" "${names[@]}" <<'PY'
import json, sys
d, here, names = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.path.insert(0, here)
from zero_expect import load, compare, steps, check_plan_compare, plan_reports
plan_reports(f"{d}/cmp.json", d, names)  # one kiln plan call's reports, one file each
refs = {"tiny": load(f"{d}/ref.jsonl"), "tiny-llama": load(f"{d}/ref_llama.jsonl"), "tiny-moe": load(f"{d}/ref_moe.jsonl")}
want = {  # name: (dp, cp, tp, sp, pp, ep)
    "cp_sp": (1, 2, 2, True, 1, 1), "llama_cp_sp": (1, 2, 2, True, 1, 1), "cp_sp_pp": (1, 2, 2, True, 2, 1),
    "dp_cp_sp_z1": (2, 2, 2, True, 1, 1), "5d": (2, 2, 2, True, 2, 1), "moe_sp": (1, 1, 2, True, 1, 1),
    "moe_cp": (1, 2, 1, False, 1, 1), "moe_cp_sp": (1, 2, 2, True, 1, 1), "moe_sp_ac": (1, 1, 2, True, 1, 1),
    "moe_cp_ep": (2, 2, 1, False, 1, 2), "moe_cp_z3": (1, 2, 1, False, 1, 1), "moe_5d": (2, 2, 2, True, 2, 2),
}
def step_recs(run):
    return {r["step"]: r for r in run if r["type"] == "step"}
for name in names:
    run = load(f"{d}/{name}.jsonl")
    w, c = run[0]["world"], run[0]["config"]
    assert (w["dp"], w["cp"], w["tp"], w["sp"], w["pp"], c.get("ep", 1)) == want[name], (name, w)
    ref = refs[c["model"]]
    worst = compare(ref, run, name, 1e-5)
    line = f"{name} ({w['size']} ranks): within {worst:.1e} of the single process"
    if c["model"] == "tiny-moe":
        a, b = step_recs(ref), step_recs(run)
        for s in a:
            for key in ("moe_dropped", "moe_max_load", "moe_min_load", "moe_max_load_by_layer"):
                assert a[s][key] == b[s][key], (name, s, key, a[s][key], b[s][key])
            for key in ("moe_aux_loss", "moe_z_loss"):
                assert abs(a[s][key] - b[s][key]) <= 1e-5 * abs(a[s][key]), (name, s, key, a[s][key], b[s][key])
        line += "; routing identical, the balance and z losses' parts add up"
    line += "; " + check_plan_compare(f"{d}/{name}.cmp.json", name, comm_exact=c.get("ep", 1) == 1)
    print(line)
run = load(f"{d}/from_5d.jsonl")
assert sorted(steps(run)) == list(range(6, 11)) and run[0]["resumed_from"], "from_5d"
print(f"from_5d: the 16-rank run's step-5 checkpoint resumed in one process, steps 6-10 within "
      f"{compare(refs['tiny'], run, 'from_5d', 1e-5, first=6):.1e}")
PY
echo "compose: ok"
