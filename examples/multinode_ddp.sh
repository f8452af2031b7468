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
# Today the multi-rank path runs on the MPI backend with CPU tensors (--device cpu); the NCCL
# backend for GPUs is not built yet. The global batch is micro-batch x grad-accum x ranks.
# As root, Open MPI also wants --allow-run-as-root.
set -euo pipefail
hostfile=${1:?usage: multinode_ddp.sh HOSTFILE NUM_RANKS [flags]}
np=${2:?usage: multinode_ddp.sh HOSTFILE NUM_RANKS [flags]}
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
# --map-by ppr:N:node would pin N ranks per node; --bind-to none leaves LibTorch's threads free.
exec mpirun --hostfile "$hostfile" -np "$np" --bind-to none \
  -x PATH -x LD_LIBRARY_PATH -x OMP_NUM_THREADS \
  "$root/build/kiln" train --device cpu --model tiny --micro-batch 8 --grad-accum 1 --steps 300 \
  --log-json multinode.jsonl "$@"
