#!/usr/bin/env bash
# examples/single_gpu_debug.sh -- a short gpt2-124m run on one GPU, no mpirun needed (one
# process is a world of one). Prints a line per step and writes debug.jsonl.
#   bash examples/single_gpu_debug.sh [extra kiln train flags]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/build/kiln" train --model gpt2-124m --device cuda --micro-batch 8 --grad-accum 1 \
  --steps 50 --warmup 10 --lr 6e-4 --log-every 5 --log-json debug.jsonl "$@"
