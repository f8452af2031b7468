#!/usr/bin/env bash
# tests/cli/host_threads.sh -- the settings a single-node GPU machine without ssh needs, and the
# CPU threads each rank gets (label mpi; distributed/host_threads.h, launch/device_kit.sh):
#   OMPI_MCA_plm=isolated starts the ranks without an ssh/rsh agent, and with binding off
#     (OMPI_MCA_hwloc_base_binding_policy=none) each rank may use every core: kiln divides them,
#     intra-op threads = min(cores / ranks on the node, CPUs the rank may use), logged in the
#     config record;
#   under mpirun's default binding (a core per rank at 2 ranks or fewer) a run with --offload
#     warns that its host AdamW gets one thread, and names --bind-to none.
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
T=(train --device cpu --model tiny --steps 2 --micro-batch 2 --log-every 100)
cores=$(nproc --all)

OMPI_MCA_plm=isolated OMPI_MCA_hwloc_base_binding_policy=none mpi 2 "$KILN_BIN" "${T[@]}" --log-json "$work/free.jsonl" >/dev/null ||
  fail "mpirun with the isolated launcher and binding off did not run"
mpi 2 "$KILN_BIN" "${T[@]}" --log-json "$work/bound.jsonl" >/dev/null
python3 - "$work" "$cores" <<'PY'
import json, sys
d, cores = sys.argv[1], int(sys.argv[2])
for name in ("free", "bound"):
    h = json.loads(open(f"{d}/{name}.jsonl").readline())["host_threads"]
    assert h["ranks_on_node"] == 2 and h["cores"] == cores, h
    want = max(1, min(cores // 2, h["cpus_allowed"]))
    assert h["intra_op"] == want and h["rule"] == "divided", (name, h, want)
    if name == "free":
        assert h["cpus_allowed"] == cores, h
    print(f"{name}: {h}")
PY
if [ "$cores" -gt 1 ]; then
  mpi 1 "$KILN_BIN" "${T[@]}" --zero 1 --offload optimizer --log-json "$work/one.jsonl" >"$work/out"
  allowed=$(python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readline())['host_threads']['cpus_allowed'])" "$work/one.jsonl")
  if [ "$allowed" -eq 1 ]; then
    grep -q "warning: this rank may run on 1 of the node's $cores CPUs .*--bind-to none" "$work/out" ||
      { cat "$work/out"; fail "no warning for an offload run bound to one core"; }
    echo "bound to one core under --offload: warned"
  fi
  OMPI_MCA_hwloc_base_binding_policy=none mpi 1 "$KILN_BIN" "${T[@]}" --zero 1 --offload optimizer >"$work/out"
  ! grep -q "warning: this rank may run on 1" "$work/out" || fail "warned with binding off"
fi
echo "PASS"
