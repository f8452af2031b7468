#!/usr/bin/env bash
# examples/mfu_benchmark.sh -- throughput and MFU of gpt2-124m on one GPU (fp32 until mixed
# precision lands). The summary record of bench.jsonl holds mean tokens/s, TFLOP/s and MFU over
# all steps but the first. `kiln bench` will replace this script.
#   bash examples/mfu_benchmark.sh [micro-batch]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/build/kiln" train --model gpt2-124m --device cuda --micro-batch "${1:-16}" --steps 30 \
  --warmup 5 --log-every 5 --log-json bench.jsonl
tail -n 1 bench.jsonl
