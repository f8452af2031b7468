#!/usr/bin/env bash
# examples/3d_parallel.sh -- a dp x tp x pp run across nodes: tensor parallelism inside each node,
# pipeline stages and data-parallel replicas across nodes.
#
# Layout. kiln numbers ranks tp fastest, then dp, then pp (distributed/mesh.h):
#     rank = (pp_index * dp + dp_index) * tp + tp_index
# With `--map-by ppr:8:node` ranks 0-7 are node 0, 8-15 node 1, and so on, so with --tp 8 every
# tensor-parallel group -- the chattiest, two all-reduces of [B, T, d] per block and pass -- is
# one node on NVLink. What crosses the network is the pipeline's point-to-point traffic (one
# [B, T, d] activation per micro-batch and stage boundary, and its gradient back) and the
# data-parallel reduction (once per step, overlapped with the last backward).
#
# Default below, for 4 nodes x 8 GPUs = 32 ranks, gpt2-350m (24 blocks, 16 heads, d 1024):
#     --tp 8          each node splits the heads (16 / 8), the MLP and the vocabulary
#     --pp 2          two stages of 12 blocks: nodes 0-1 hold stage 0, nodes 2-3 stage 1
#     dp = 32 / (8 x 2) = 2 replicas of every (stage, tp slice), synchronised with ZeRO-1
#     --grad-accum 16 micro-batches per step per replica: bubble (2-1)/(16+2-1) = 5.9%
#     --micro-batch 8 global batch 8 x 16 x 2 = 256 sequences of 1024 tokens
# tp must divide the heads, d_model, the MLP width and the padded vocabulary; pp at most the blocks
# (`--pp-split` gives an explicit split); tp x pp must divide the ranks. `kiln plan --model
# gpt2-350m --gpu h100 --gpus-per-node 8 --nodes 4 --search` ranks the layouts that fit.
#
# At start-up rank 0 prints the layout ("dp 2 tp 8 pp 2"), the stage split and the bubble; it
# writes the log (its figures are stage 0's), and checkpoints hold the whole model, so they
# resume on any layout (another node count, pp 1 on one node for evaluation, ...).
#
# Requirements: kiln built at the same path on every node, passwordless ssh between nodes (Open
# MPI starts remote ranks through ssh), one GPU per rank (the NCCL backend is chosen when every
# rank has its own GPU). As root, export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# first: everything after HOSTFILE goes to kiln, not to mpirun.
#
#   bash examples/3d_parallel.sh HOSTFILE [extra kiln train flags, e.g. --tp 4 --pp 4]
# HOSTFILE has one "nodeNN slots=8" line per node; GPUS_PER_NODE overrides the 8. Later flags win,
# so the extra flags override the ones below (tests/cli/examples.sh runs it this way, tiny, on CPUs).
set -euo pipefail
hostfile=${1:?usage: 3d_parallel.sh HOSTFILE [flags]}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
nodes=$(grep -cve '^[[:space:]]*$' -e '^[[:space:]]*#' "$hostfile")
gpus_per_node=${GPUS_PER_NODE:-8}
# --bind-to none leaves LibTorch's threads free; -x passes what kiln, NCCL and CUDA read (those set).
pass=()
for v in PATH LD_LIBRARY_PATH OMP_NUM_THREADS NCCL_DEBUG NCCL_SOCKET_IFNAME NCCL_IB_HCA; do
  [ -z "${!v:-}" ] || pass+=(-x "$v")
done
exec mpirun --hostfile "$hostfile" -np $(( nodes * gpus_per_node )) --map-by "ppr:${gpus_per_node}:node" \
  --bind-to none "${pass[@]}" \
  "$root/build/kiln" train --model gpt2-350m --precision bf16 \
  --tp 8 --pp 2 --zero 1 --micro-batch 8 --grad-accum 16 \
  --steps 5000 --lr 3e-4 --warmup 200 --activation-checkpointing selective \
  --save-dir checkpoints/gpt2-350m-3d --save-every 500 --log-json 3d.jsonl "$@"
