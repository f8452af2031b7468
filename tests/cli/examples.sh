#!/usr/bin/env bash
# tests/cli/examples.sh -- every example in examples/ runs as its comments say, at tiny size on
# the CPU (label mpi), so none can go stale: the flags after each script's own arguments reach
# kiln and win over the example's (--model tiny --device cpu --steps 2 ...), mpirun's own settings
# stay in the script, and Open MPI prints no warning (an unset variable passed with -x, say).
# Root, as in CI: OMPI_ALLOW_RUN_AS_ROOT in the environment, as the comments tell root users.
source "$(dirname "$0")/common.sh"
examples=$(cd "$(dirname "$0")/../../examples" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset OMP_NUM_THREADS NCCL_DEBUG NCCL_SOCKET_IFNAME NCCL_IB_HCA
# The examples call the build next to them (build/kiln); this test runs the one CTest names.
bin_dir=$(dirname "$KILN_BIN")
[ "$bin_dir" = "$(cd "$examples/.." && pwd)/build" ] || echo "note: KILN_BIN is $KILN_BIN; the examples run $examples/../build/kiln"
TINY=(--model tiny --device cpu --steps 2 --warmup 1 --log-every 1)
cd "$work"

run() {  # run NAME COMMAND...: exit 0, and no warning from Open MPI or bash
  local name=$1; shift
  local code=0
  timeout 300 "$@" >"$work/$name.out" 2>"$work/$name.err" || code=$?
  [ "$code" -eq 0 ] || { cat "$work/$name.out" "$work/$name.err"; fail "$name exited $code"; }
  ! grep -iE "warning|unbound variable|not found" "$work/$name.err" || { cat "$work/$name.err"; fail "$name printed a warning"; }
  echo "ok: $name"
}

run single_gpu_debug bash "$examples/single_gpu_debug.sh" "${TINY[@]}"
[ -s debug.jsonl ] || fail "single_gpu_debug wrote no debug.jsonl"
run mfu_benchmark bash "$examples/mfu_benchmark.sh" 2 --model tiny --device cpu --warmup 1 --measure 1
[ -s bench.json ] || fail "mfu_benchmark wrote no bench.json"
run tiny_cpu "$KILN_BIN" train --config "$examples/tiny_cpu.json" --steps 2
[ -s tiny_cpu.jsonl ] || fail "tiny_cpu.json wrote no tiny_cpu.jsonl"
echo "localhost slots=2" >hosts2
run multinode_ddp bash "$examples/multinode_ddp.sh" hosts2 2 "${TINY[@]}"
[ -s multinode.jsonl ] || fail "multinode_ddp wrote no multinode.jsonl"
run zero3_offload bash "$examples/zero3_offload.sh" 2 "${TINY[@]}" --precision fp32 --micro-batch 2 --grad-accum 2
[ -s zero3_offload.jsonl ] && [ -f ckpt-zero3/latest ] || fail "zero3_offload wrote no log or checkpoint"
echo "localhost slots=4" >hosts4
GPUS_PER_NODE=4 run 3d_parallel bash "$examples/3d_parallel.sh" hosts4 "${TINY[@]}" --tp 2 --pp 2 --micro-batch 2 --grad-accum 2
python3 -c "
import json, sys
c = json.loads(open('3d.jsonl').readline())['world']
assert (c['dp'], c['tp'], c['pp']) == (1, 2, 2), c
print('3d_parallel: dp 1 x tp 2 x pp 2')"
SLURM_NTASKS=2 SLURM_SUBMIT_DIR="$work" run slurm_ddp bash "$examples/slurm_ddp.sbatch" "${TINY[@]}"
[ -s kiln-local.jsonl ] && [ -f ckpt-ddp/latest ] || fail "slurm_ddp.sbatch wrote no log or checkpoint"
echo "PASS"
