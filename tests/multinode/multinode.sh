#!/usr/bin/env bash
# tests/multinode/multinode.sh -- kiln across simulated nodes (label multinode; docs/multinode.md).
# Needs root (network namespaces); exits 77 (CTest skip) with the reason where they cannot be made.
#
# Parity across nodes: 4 ranks on 2 nodes (2 each, TCP between them) against 4 ranks on one node,
# the same global batch, bit for bit (the collectives' algorithms do not depend on the transport):
# DDP, ZeRO-1, ZeRO-3 with --offload all, tp 2 inside each node x dp 2 across, pp 2 across the
# nodes (stage 0 on one, stage 1 on the other); 3 ranks on 3 nodes against 3 on one. A checkpoint
# saved on 2 nodes resumes on 1, and the reverse, by replay. The config record's topology (nodes,
# ranks per node) and host threads (per node) are checked, and `kiln plan --compare` takes the
# node count from the log. The Slurm example runs under a faked Slurm allocation of the nodes (the
# SLURM_* variables Open MPI's mpirun reads), the hostfile example with a hostfile of the nodes.
#
# Faults, each with its bound:
#   partition   node 1's link goes down mid-run: every kiln process, on both sides of the cut,
#               ends within --comm-timeout (5 s) + the abort grace (5 s) + 10 s of slack
#   node loss   node 1's kiln processes are killed: the survivors end within the same bound, and
#               the output names a lost rank
#   slow node   node 1's link delayed 20 ms (netem), or limited to 100 Mbit/s where the kernel has no
#               netem: the job finishes under --comm-timeout, its comm_ms above the fast run's
#   afterwards  the last checkpoint resumes on node 0 alone (2 ranks, the same global batch)
source "$(dirname "$0")/../cli/common.sh"
source "$(dirname "$0")/netns.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
: "${MPIEXEC:=mpirun}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
T=(train --device cpu --model tiny --dropout 0.1 --micro-batch 2 --warmup 5 --log-every 100)

nodes_up 3
n0=${nodes[0]}; n1=${nodes[1]}; n2=${nodes[2]}
head -n 2 "$hostfile" >"$work/hosts2"
net2=("${mpirun_net[@]}")
net2[2]="$work/hosts2"  # --hostfile: the first two nodes
local1() { timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$@"; }   # one node, shared memory
across() { on_node "$n0" timeout 300 "$MPIEXEC" "${net2[@]}" -np "$@"; }            # 2 nodes, TCP

# ---- parity: 2 nodes against one
cases=("ddp|" "z1|--zero 1" "z3all|--zero 3 --offload all" "tp2|--tp 2" "pp2|--pp 2 --grad-accum 2")
for c in "${cases[@]}"; do
  IFS='|' read -r name flags <<<"$c"
  # shellcheck disable=SC2086
  local1 4 "$KILN_BIN" "${T[@]}" --steps 12 $flags --log-json "$work/$name.one.jsonl" >/dev/null || fail "$name on one node"
  # shellcheck disable=SC2086
  across 4 "$KILN_BIN" "${T[@]}" --steps 12 $flags --log-json "$work/$name.two.jsonl" >"$work/$name.out" 2>&1 ||
    { cat "$work/$name.out"; fail "$name across 2 nodes"; }
done
MN3=$(mktemp -d) && echo "$n0 slots=1" >"$MN3/h" && echo "$n1 slots=1" >>"$MN3/h" && echo "$n2 slots=1" >>"$MN3/h"
net3=("${mpirun_net[@]}"); net3[2]="$MN3/h"
# One thread per rank in both: 3 ranks on one node get 1 each (2 cores / 3), 3 nodes of 1 rank 2
# each, and LibTorch's CPU kernels (MKL's GEMM among them, kiln runs it with MKL_DYNAMIC off)
# round a product split over 2 threads otherwise than over 1: the comparison is of nodes, not of
# thread counts. (The 2 x 2 cases above have 1 thread per rank on both sides already.)
OMP_NUM_THREADS=1 local1 3 -x OMP_NUM_THREADS "$KILN_BIN" "${T[@]}" --steps 12 --log-json "$work/three.one.jsonl" >/dev/null
OMP_NUM_THREADS=1 on_node "$n0" timeout 300 "$MPIEXEC" "${net3[@]}" -x OMP_NUM_THREADS -np 3 "$KILN_BIN" "${T[@]}" --steps 12 \
  --log-json "$work/three.three.jsonl" >/dev/null || fail "3 nodes"
python3 - "$work" "${cases[@]}" <<'PY'
import json, sys
d = sys.argv[1]
load = lambda n: [json.loads(l) for l in open(f"{d}/{n}.jsonl")]
runs = [c.split("|")[0] for c in sys.argv[2:]] + ["three"]
for name in runs:
    one, many = load(f"{name}.one"), load(f"{name}.two" if name != "three" else "three.three")
    a = [(r["loss"], r["grad_norm"]) for r in one if r["type"] == "step"]
    b = [(r["loss"], r["grad_norm"]) for r in many if r["type"] == "step"]
    assert a == b, (name, a[:2], b[:2])
    assert (one[-1]["param_sum"], one[-1]["param_sq"]) == (many[-1]["param_sum"], many[-1]["param_sq"]), name
    nodes, per = (2, 2) if name != "three" else (3, 1)
    topo, threads = many[0]["topology"], many[0]["host_threads"]
    assert topo == {"nodes": nodes, "ranks_per_node": per}, (name, topo)
    assert threads["ranks_on_node"] == per, (name, threads)
    assert one[0]["topology"]["nodes"] == 1, one[0]["topology"]
    print(f"{name}: {nodes} nodes = one node, bit for bit (12 steps and the weights); topology {topo}")
PY
"$KILN_BIN" plan --compare "$work/ddp.two.jsonl" --json >"$work/compare.json"
python3 -c "
import json, sys
c = json.load(open(sys.argv[1]))
assert c['plan']['cluster']['nodes'] == 2 and c['plan']['cluster']['devices_per_node'] == 2, c['plan']['cluster']
print('plan --compare: 2 nodes of 2 devices, from the log')" "$work/compare.json"

# ---- checkpoints across node counts, by replay
local1 4 "$KILN_BIN" "${T[@]}" --steps 20 --log-json "$work/straight.jsonl" >/dev/null
across 4 "$KILN_BIN" "${T[@]}" --steps 20 --stop-at-step 10 --save-dir "$work/c21" >/dev/null || fail "save on 2 nodes"
local1 4 "$KILN_BIN" "${T[@]}" --steps 20 --save-dir "$work/c21" --log-json "$work/c21.jsonl" >/dev/null
local1 4 "$KILN_BIN" "${T[@]}" --steps 20 --stop-at-step 10 --save-dir "$work/c12" >/dev/null
across 4 "$KILN_BIN" "${T[@]}" --steps 20 --save-dir "$work/c12" --log-json "$work/c12.jsonl" >/dev/null || fail "resume on 2 nodes"
python3 - "$work" <<'PY'
import json, sys
d = sys.argv[1]
load = lambda n: [json.loads(l) for l in open(f"{d}/{n}.jsonl")]
s = {r["step"]: r["loss"] for r in load("straight") if r["type"] == "step"}
for name, what in (("c21", "saved on 2 nodes, resumed on 1"), ("c12", "saved on 1 node, resumed on 2")):
    run = load(name)
    b = {r["step"]: r["loss"] for r in run if r["type"] == "step"}
    assert sorted(b) == list(range(11, 21)) and all(b[k] == s[k] for k in b), name
    print(f"{what}: steps 11-20 bit-identical")
PY

# ---- Slurm: the sbatch example under a faked allocation of the two nodes (Open MPI reads it)
(
  cd "$work"
  export SLURM_JOB_ID=4242 SLURM_JOBID=4242 SLURM_NTASKS=4 SLURM_SUBMIT_DIR="$work" KILN_BIN
  export SLURM_JOB_NODELIST="$n0,$n1" SLURM_NODELIST="$n0,$n1" SLURM_TASKS_PER_NODE="2(x2)" SLURM_JOB_NUM_NODES=2 SLURM_NNODES=2
  export OMPI_MCA_plm=rsh OMPI_MCA_plm_rsh_agent="$mn_here/agent.sh" OMPI_MCA_btl=tcp,self \
    OMPI_MCA_btl_tcp_if_include="$subnet.0/24" OMPI_MCA_oob_tcp_if_include="$subnet.0/24"
  on_node "$n0" timeout 300 bash "$root/examples/slurm_ddp.sbatch" --steps 3 --warmup 1 >"$work/slurm.out" 2>&1
) || { cat "$work/slurm.out"; fail "the Slurm example across 2 nodes"; }
python3 -c "
import json, sys
r = json.loads(open(sys.argv[1]).readline())
assert r['topology'] == {'nodes': 2, 'ranks_per_node': 2}, r['topology']
print('slurm_ddp.sbatch under a Slurm allocation of 2 nodes: 4 ranks, 2 per node')" "$work/kiln-4242.jsonl"

# ---- the hostfile example across the two nodes (mpirun's options for them as OMPI_MCA_ variables)
(
  cd "$work"
  export OMPI_MCA_plm_rsh_agent="$mn_here/agent.sh" OMPI_MCA_btl=tcp,self \
    OMPI_MCA_btl_tcp_if_include="$subnet.0/24" OMPI_MCA_oob_tcp_if_include="$subnet.0/24"
  on_node "$n0" timeout 300 bash "$root/examples/multinode_ddp.sh" "$work/hosts2" 4 --steps 3 --warmup 1 >"$work/example.out" 2>&1
) || { cat "$work/example.out"; fail "examples/multinode_ddp.sh across 2 nodes"; }
python3 -c "
import json, sys
r = json.loads(open(sys.argv[1]).readline())
assert r['topology'] == {'nodes': 2, 'ranks_per_node': 2}, r['topology']
print('multinode_ddp.sh with a hostfile of 2 nodes: 4 ranks, 2 per node')" "$work/multinode.jsonl"

# ---- faults
# Each rank's output goes to a file of its own on its node (a partition cuts the launcher's
# forwarding), through a wrapper that execs kiln (the process stays "kiln").
cat >"$work/own_output.sh" <<'SH'
#!/bin/sh
exec "$@" >>"$MN_OUT.rank$OMPI_COMM_WORLD_RANK" 2>&1
SH
chmod +x "$work/own_output.sh"
now() { echo $(( $(date +%s%N) / 1000000 )); }  # milliseconds
# ends_within NODE SECONDS START: waits for the kiln processes on NODE to end; prints how long after
# START (from now) they were gone, or fails the test with the ones left.
ends_within() {
  local node=$1 limit=$2 start=$3
  while [ -n "$(kiln_pids "$node")" ]; do
    [ $(( $(now) - start )) -le $(( limit * 1000 )) ] ||
      fail "kiln processes left on $node ($(kiln_pids "$node" | tr '\n' ' ')) $limit s after the fault"
    sleep 0.1
  done
  local ms=$(( $(now) - start ))
  echo "$(( ms / 1000 )).$(( ms % 1000 / 100 ))"
}
# The bound: --comm-timeout (5 s; --save-timeout, 5 s too, when the fault comes during a save) +
# kiln's abort grace (5 s, kAbortGraceSeconds), + 8 s of slack for a loaded 2-core machine.
bound=18
F=("${T[@]}" --dropout 0 --steps 100000 --comm-timeout 5 --save-timeout 5 --save-every 3)
# The reference for the resumes: the same run, uninterrupted, on one node.
local1 4 "$KILN_BIN" "${F[@]}" --stop-at-step 16 --log-json "$work/ref.jsonl" >/dev/null
# resume_on_survivor DIR: the last checkpoint in DIR resumes on node 0 alone (2 ranks x grad-accum
# 2: the same global batch), its next two steps' losses equal to the uninterrupted run's within
# 1e-4 (the gradient sums' order differs: 2 micro-batches per rank instead of 1).
resume_on_survivor() {
  local dir=$1 at; at=$(sed 's/step_0*//' "$dir/latest")
  on_node "$n0" timeout 300 "$MPIEXEC" --allow-run-as-root -np 2 "$KILN_BIN" "${F[@]}" --grad-accum 2 --save-dir "$dir" \
    --stop-at-step $(( at + 2 )) --log-json "$dir.resume.jsonl" >"$dir.resume.out" 2>&1 || { cat "$dir.resume.out"; fail "resuming $dir on $n0 alone"; }
  python3 - "$work/ref.jsonl" "$dir.resume.jsonl" "$at" <<'PY'
import json, sys
load = lambda p: {r["step"]: r["loss"] for r in map(json.loads, open(p)) if r["type"] == "step"}
ref, res, at = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3])
assert sorted(res) == [at + 1, at + 2], sorted(res)
for k in res:
    assert abs(res[k] - ref[k]) < 1e-4, (k, res[k], ref[k])
print(f"  step_{at} resumed on node 0 alone (2 ranks x grad-accum 2): steps {at + 1}-{at + 2} match the uninterrupted run")
PY
}

# partition: node 1's link goes down, and the launcher's daemon there is frozen (it could not
# reach mpirun anyway), so MPI_Abort cannot complete on node 1: its ranks must end by themselves.
export MN_OUT="$work/part.out"
across 4 -x MN_OUT "$work/own_output.sh" "$KILN_BIN" "${F[@]}" --save-dir "$work/part" --log-json "$work/part.jsonl" >"$work/part.launcher" 2>&1 &
launcher=$!
wait_steps "$work/part.jsonl" 7
freeze_daemons "$n1"
t0=$(now)
link_down "$n1"
a=$(ends_within "$n0" "$bound" "$t0")
b=$(ends_within "$n1" "$bound" "$t0")
for r in 0 1 2 3; do
  grep -Eq "rank $r: .*did not complete within 5 s \\((--comm-timeout|--save-timeout)" "$MN_OUT.rank$r" ||
    { cat "$MN_OUT".rank*; fail "rank $r printed no watchdog line after the partition"; }
done
kill -9 "$launcher" 2>/dev/null || true  # mpirun waits on node 1's daemon (docs/multinode.md)
wait "$launcher" 2>/dev/null || true
link_up "$n1"
kill_node "$n1"
echo "partition: node 0's ranks ended $a s after the cut, node 1's $b s (bound $bound s); all 4 printed the watchdog line"
resume_on_survivor "$work/part"

# node loss, kiln's processes: the launcher sees them die and ends the job, naming the rank
across 4 "$KILN_BIN" "${F[@]}" --save-dir "$work/loss" --log-json "$work/loss.jsonl" >"$work/loss.out" 2>&1 &
launcher=$!
wait_steps "$work/loss.jsonl" 7
t0=$(now)
for p in $(kiln_pids "$n1"); do kill -9 "$p"; done
a=$(ends_within "$n0" "$bound" "$t0")
wait "$launcher" 2>/dev/null || true
grep -Eq "process rank [23] .*signal 9" "$work/loss.out" || { cat "$work/loss.out"; fail "the output names no lost rank"; }
echo "node loss (kiln's processes): the survivors ended $a s after (bound $bound s): $(grep -Eo "process rank [23] [^)]*\)" "$work/loss.out" | head -n 1)"
resume_on_survivor "$work/loss"

# node loss, the whole node (kiln and the launcher's daemon): the node is named by whichever sees
# the loss first: mpirun (its daemon lost), Open MPI's TCP transport (the peer host that hung up)
# or the rsh agent (its session to the node ended, as ssh reports a closed connection)
across 4 "$KILN_BIN" "${F[@]}" --save-dir "$work/gone" --log-json "$work/gone.jsonl" >"$work/gone.out" 2>&1 &
launcher=$!
wait_steps "$work/gone.jsonl" 7
t0=$(now)
kill_node "$n1"
a=$(ends_within "$n0" "$bound" "$t0")
wait "$launcher" 2>/dev/null || true
grep -Eq "(Remote daemon: .* on node|Peer host:|connection to) +$n1" "$work/gone.out" || { cat "$work/gone.out"; fail "the output names no lost node"; }
echo "node loss (the whole node): the survivors ended $a s after (bound $bound s): $(grep -Eo "(Remote daemon: .* on node|Peer host:|connection to) +$n1" "$work/gone.out" | head -n 1)"
resume_on_survivor "$work/gone"

# slow node
across 4 "$KILN_BIN" "${T[@]}" --steps 12 --comm-timeout 10 --log-json "$work/fast.jsonl" >/dev/null
link_slow "$n1"
across 4 "$KILN_BIN" "${T[@]}" --steps 12 --comm-timeout 10 --log-json "$work/slow.jsonl" >/dev/null || fail "a slow node ended the job"
python3 - "$work" "$slow_how" <<'PY'
import json, sys
d, how = sys.argv[1], sys.argv[2]
ms = lambda n: [json.loads(l)["comm_ms"] for l in open(f"{d}/{n}.jsonl") if '"type":"step"' in l][1:]
fast, slow = ms("fast"), ms("slow")
f, s = sum(fast) / len(fast), sum(slow) / len(slow)
assert s > f + 10, (f, s)
print(f"slow node ({how}): the job finished; mean comm_ms {f:.1f} -> {s:.1f}")
PY
echo "PASS"
