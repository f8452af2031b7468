#!/usr/bin/env bash
# examples/zero3_offload.sh -- a model larger than one GPU: ZeRO-3 with every shard on the host.
#
#   bash examples/zero3_offload.sh NUM_RANKS [extra kiln train flags]
#
# --zero 3 shards parameters, gradients and AdamW state over the ranks (16 B per parameter / N);
# --offload all keeps the shards in host memory and runs AdamW there (optim/cpu_adamw.h), so the
# GPU holds only the blocks being computed (two gathered at a time) and the activations. Add
# --activation-checkpointing full to cut the activations too. The model is built on the host, so
# it never has to fit on one device. Each node's host needs about 4 B per parameter per rank at
# start-up (every rank builds its part of the model before the engine takes its shards;
# docs/zero.md, Limits). With --grad-accum K > 1, --zero-accum local trades 4 B/param of device
# memory for 1/K of the gradient traffic (docs/zero.md). --bind-to none lets the host AdamW use
# the cores kiln gives each rank (docs/zero.md, "Host memory"). As root, export
# OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 first: everything after NUM_RANKS goes
# to kiln, not to mpirun (later flags win over the ones below).
set -euo pipefail
np=${1:?usage: zero3_offload.sh NUM_RANKS [flags]}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
pass=()
for v in PATH LD_LIBRARY_PATH OMP_NUM_THREADS; do
  [ -z "${!v:-}" ] || pass+=(-x "$v")
done
exec mpirun -np "$np" --bind-to none "${pass[@]}" \
  "$root/build/kiln" train --model gpt2-1.5b --precision bf16 --zero 3 --offload all \
  --activation-checkpointing full --micro-batch 4 --grad-accum 8 --steps 1000 \
  --save-dir ckpt-zero3 --save-every 200 --log-json zero3_offload.jsonl "$@"
