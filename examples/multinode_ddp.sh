#!/usr/bin/env bash
# examples/multinode_ddp.sh -- data-parallel training across nodes with mpirun and a hostfile.
#
# A hostfile lists each node and how many ranks (one per GPU, or per CPU socket) it runs:
#     node01 slots=8
#     node02 slots=8
# kiln must be built at the same path on every node (a shared file system, or the same image),
# and the nodes must reach each other over ssh without a password (Open MPI starts the remote
# ranks through ssh). Each rank finds its local rank from Open MPI and picks its device from it.
#
#   bash examples/multinode_ddp.sh hostfile 16 [extra kiln train flags]
#
# On GPU nodes drop --device cpu (or give --device cuda): the NCCL backend is then chosen when
# every rank has a GPU of its own. The global batch is micro-batch x grad-accum x ranks. As root,
# export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 first: everything after
# NUM_RANKS goes to kiln, not to mpirun (later flags win over the ones below).
set -euo pipefail
hostfile=${1:?usage: multinode_ddp.sh HOSTFILE NUM_RANKS [flags]}
np=${2:?usage: multinode_ddp.sh HOSTFILE NUM_RANKS [flags]}
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
# --map-by ppr:N:node would pin N ranks per node; --bind-to none leaves LibTorch's threads free;
# -x passes the variables kiln reads, those that are set.
pass=()
for v in PATH LD_LIBRARY_PATH OMP_NUM_THREADS NCCL_DEBUG NCCL_SOCKET_IFNAME; do
  [ -z "${!v:-}" ] || pass+=(-x "$v")
done
exec mpirun --hostfile "$hostfile" -np "$np" --bind-to none "${pass[@]}" \
  "$root/build/kiln" train --device cpu --model tiny --micro-batch 8 --grad-accum 1 --steps 300 \
  --log-json multinode.jsonl "$@"
