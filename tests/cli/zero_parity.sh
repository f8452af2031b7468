#!/usr/bin/env bash
# tests/cli/zero_parity.sh -- ZeRO-1/2/3, with and without offload, against ZeRO-0 (DDP) at the
# same global batch of 8 sequences (label mpi):
#   2 ranks: micro-batch 2 x grad-accum 2 -- every stage, both accumulation policies of stages
#            2 and 3, --offload optimizer under each stage, --offload all under ZeRO-3
#   4 ranks: micro-batch 2 x grad-accum 1 -- every stage, and the offloads (shards padded here)
# Checked over 10 steps: loss and gradient norm per step and the final weights' fingerprint
# within a relative 1e-5, the DDP parity tolerance (tests/cli/ddp_parity.sh says why): sharding
# changes no arithmetic but the order of fp32 additions (reduce-scatter per unit instead of one
# all-reduce per bucket; per-micro-step reduction under the reduce policy; the squared norm
# summed over shards), and the offloaded step's AdamW rounds differently by a few ulps
# (measured worst, printed below: 1.9e-7 with offload, 1.2e-7 without). A missing 1/dp, a shard
# stepped twice or skipped, a wrong padding offset moves these by 1e-3 or more.
# Also, exactly: each run's reported model-state bytes and comm_bytes per step against
# tests/cli/zero_expect.py, which works them out from the model shape; and ZeRO-1, 2 and 3 with
# offload all at 2 ranks again through the MPI backend's staged and split paths, bit-identical.
# A world of one runs ZeRO without mpirun (a local world, distributed/comm_self.h; it once said
# "--zero 2 needs MPI"): ZeRO-2 and ZeRO-3 with --offload all equal `mpirun -np 1` bit for bit --
# losses, norms, weights and comm_bytes.
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
T=(train --device cpu --model tiny --steps 10 --log-every 100 --micro-batch 2)

run() {  # run NAME NP GRAD_ACCUM FLAGS...
  local name=$1 np=$2 k=$3; shift 3
  mpi "$np" "$KILN_BIN" "${T[@]}" --grad-accum "$k" "$@" --log-json "$work/$name.jsonl" >/dev/null ||
    fail "$name: kiln exited $?"
}
run ref2 2 2 --zero 0
run ref4 4 1 --zero 0
names2=()
for cfg in "1" "2" "2 local" "3" "3 local" "1 reduce optimizer" "2 reduce optimizer" "3 reduce optimizer" "3 reduce all" "3 local all"; do
  read -r stage accum offload <<<"$cfg"
  name="z${stage}_${accum:-reduce}_${offload:-none}_np2"
  run "$name" 2 2 --zero "$stage" --zero-accum "${accum:-reduce}" --offload "${offload:-none}"
  names2+=("$name")
done
# The MPI backend's staged and split paths (distributed/comm_mpi.h's test-only settings): CPU tensors
# staged through separate host buffers as CUDA ones are (where Avg once summed instead of
# averaging), and every message above 4096 elements split into pieces. At 2 ranks a sum is one
# addition, so these runs must equal the plain runs of the same configuration bit for bit.
staged=()
for cfg in "1" "2" "3 reduce all"; do
  read -r stage accum offload <<<"$cfg"
  plain="z${stage}_${accum:-reduce}_${offload:-none}_np2"
  KILN_MPI_STAGE_ALL=1 KILN_MPI_MAX_COUNT=4096 run "${plain}_staged" 2 2 --zero "$stage" --zero-accum "${accum:-reduce}" \
    --offload "${offload:-none}"
  staged+=("$plain")
done
names4=()
for cfg in "1" "2" "3" "1 optimizer" "3 all"; do
  read -r stage offload <<<"$cfg"
  name="z${stage}_${offload:-none}_np4"
  run "$name" 4 1 --zero "$stage" --offload "${offload:-none}"
  names4+=("$name")
done

python3 - "$work" "$(dirname "$0")" "${names2[*]}" "${names4[*]}" "${staged[*]}" <<'PY'
import sys
d, here = sys.argv[1], sys.argv[2]
sys.path.insert(0, here)
from zero_expect import load, compare, expected
for name in sys.argv[5].split():
    a, b = load(f"{d}/{name}.jsonl"), load(f"{d}/{name}_staged.jsonl")
    sa = [(r["loss"], r["grad_norm"], r["comm_bytes"]) for r in a if r["type"] == "step"]
    sb = [(r["loss"], r["grad_norm"], r["comm_bytes"]) for r in b if r["type"] == "step"]
    assert sa == sb, (name, sa[:3], sb[:3])
    assert (a[-1]["param_sum"], a[-1]["param_sq"]) == (b[-1]["param_sum"], b[-1]["param_sq"]), name
    print(f"{name}: staged and split = plain, bit for bit (10 steps and the final weights)")
for ref_name, names in (("ref2", sys.argv[3].split()), ("ref4", sys.argv[4].split())):
    ref = load(f"{d}/{ref_name}.jsonl")
    for name in names:
        run = load(f"{d}/{name}.jsonl")
        worst = compare(ref, run, name, 1e-5)
        state, comm = expected(run[0])
        assert run[0]["model_state"] == state, (name, run[0]["model_state"], state)
        got = {r["comm_bytes"] for r in run if r["type"] == "step"}
        assert got == {comm}, (name, got, comm)
        print(f"{name}: within {worst:.1e} of ZeRO-0; model state {state}; comm_bytes {comm} per step")
PY
for z in "2 none" "3 all"; do
  read -r stage offload <<<"$z"
  W=(train --device cpu --model tiny --steps 6 --log-every 100 --micro-batch 2 --grad-accum 2 --zero "$stage" --offload "$offload")
  # One thread each: mpirun binds its one rank to a core, and another thread count splits (and
  # rounds) the matrix products another way.
  OMP_NUM_THREADS=1 "$KILN_BIN" "${W[@]}" --log-json "$work/alone$stage.jsonl" >/dev/null || fail "--zero $stage without mpirun: kiln exited $?"
  OMP_NUM_THREADS=1 mpi 1 "$KILN_BIN" "${W[@]}" --log-json "$work/np1_$stage.jsonl" >/dev/null || fail "--zero $stage at mpirun -np 1"
  python3 - "$work/alone$stage.jsonl" "$work/np1_$stage.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert a[0]["world"]["backend"] == "local", a[0]["world"]
key = lambda rs: [(r["loss"], r["grad_norm"], r["comm_bytes"]) for r in rs if r["type"] == "step"]
assert key(a) == key(b) and a[-1]["param_sq"] == b[-1]["param_sq"], (key(a), key(b))
print(f"{sys.argv[1].split('/')[-1]}: ZeRO without mpirun equals mpirun -np 1 bit for bit")
PY
done
echo "PASS"
