#!/usr/bin/env bash
# tests/cli/cuda_backend.sh -- which kiln commands load LibTorch's CUDA half (libtorch_cuda.so and
# the cuBLAS, cuDNN, cuFFT it brings: 0.15 s of every start-up; distributed/cuda_backend.h), read
# from the dynamic loader's own account (LD_DEBUG=files): none on --device cpu, nor plan, prep or
# version; a command that may use a GPU loads it before it runs, and on a machine without a GPU
# still ends with kiln's "no CUDA GPU" line (a backend loaded too late would leave CUDA off silently:
# tests/test_cuda_backend.cpp). The unit test checks the loaded backend's kernels and hooks.
source "$(dirname "$0")/common.sh"
cd "$work"
loads() { grep -q "file=[^ ]*libtorch_cuda.so \[0\];" "$1"; }
LD_DEBUG=files "$KILN_BIN" train --device cpu --steps 1 >/dev/null 2>cpu.ld || { tail -n 5 cpu.ld; fail "kiln train --device cpu"; }
! loads cpu.ld || fail "kiln train --device cpu loaded libtorch_cuda.so"
LD_DEBUG=files "$KILN_BIN" plan --model tiny --gpu h100 >/dev/null 2>plan.ld || fail "kiln plan"
! loads plan.ld || fail "kiln plan loaded libtorch_cuda.so"
LD_DEBUG=files "$KILN_BIN" version >/dev/null 2>version.ld || fail "kiln version"
! loads version.ld || fail "kiln version loaded libtorch_cuda.so"
echo "--device cpu, plan, version: libtorch_cuda.so not loaded"
if ! ldd "$KILN_BIN" | grep -q "libc10_cuda"; then
  echo "kiln built without CUDA: nothing more to check"; echo PASS; exit 0
fi
code=0
LD_DEBUG=files "$KILN_BIN" train --device cuda --steps 0 >/dev/null 2>cuda.ld || code=$?
loads cuda.ld || fail "kiln train --device cuda did not load libtorch_cuda.so"
if [ "$code" -ne 0 ]; then  # no GPU here: kiln's line, not a loader's complaint
  [ "$code" -eq 2 ] && grep -q "^kiln: error: --device cuda: no CUDA GPU is visible to LibTorch$" cuda.ld ||
    { grep "kiln" cuda.ld; fail "kiln train --device cuda without a GPU: exit $code"; }
fi
echo "--device cuda: libtorch_cuda.so loaded before the run (exit $code)"
echo PASS
