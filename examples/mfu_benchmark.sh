#!/usr/bin/env bash
# examples/mfu_benchmark.sh -- throughput and MFU of gpt2-124m on one GPU in bf16, through
# `kiln bench` (launch/bench.h): warm-up steps, then measured ones on synthetic data; a table, and
# bench.json with tokens/s, TFLOP/s per device and per job, MFU, peak memory, the split of a step
# into forward / backward / exposed communication / optimizer, and the energy where NVML reads.
#   bash examples/mfu_benchmark.sh [micro-batch] [extra kiln bench flags, e.g. --sweep]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
micro_batch=${1:-16}
[ $# -eq 0 ] || shift
"$root/build/kiln" bench --model gpt2-124m --precision bf16 --micro-batch "$micro_batch" --json bench.json "$@"
