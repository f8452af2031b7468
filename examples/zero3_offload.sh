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
# start-up (every rank builds the whole model before taking its shards; docs/zero.md, Limits).
# With --grad-accum K > 1, --zero-accum local trades 4 B/param of device memory for 1/K of the
# gradient traffic (docs/zero.md). As root, Open MPI also wants --allow-run-as-root.
set -euo pipefail
np=${1:?usage: zero3_offload.sh NUM_RANKS [flags]}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
exec mpirun -np "$np" --bind-to none -x PATH -x LD_LIBRARY_PATH -x OMP_NUM_THREADS \
  "$root/build/kiln" train --model gpt2-1.5b --precision bf16 --zero 3 --offload all \
  --activation-checkpointing full --micro-batch 4 --grad-accum 8 --steps 1000 \
  --save-dir ckpt-zero3 --save-every 200 --log-json zero3_offload.jsonl "$@"
