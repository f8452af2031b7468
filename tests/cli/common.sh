# tests/cli/common.sh -- helpers for the end-to-end tests of the kiln binary (sourced).
# KILN_BIN is set by CTest to the built binary.
set -euo pipefail
: "${KILN_BIN:?KILN_BIN must point at the kiln binary}"
work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-cli.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# jsonl_check FILE PYTHON_BODY: runs the body with `records` = the parsed JSONL records.
jsonl_check() {
  python3 - "$1" "$2" <<'PY'
import json, math, sys
records = [json.loads(line) for line in open(sys.argv[1])]
exec(sys.argv[2])
PY
}
# expect_refused NP REGEX ARGS...: `mpi NP kiln ARGS` (the calling script's mpi function) must exit
# 2 (a configuration error) with one "kiln: error:" line matching REGEX.
# mpirun ends a job whose rank exits non-zero with SIGTERM to every rank, then sleeps
# odls_base_sigkill_timeout (1 s) twice before it exits, even when every rank is gone already: 2 s
# of a refused run's 3 (strace, 2026-11-28). A refusal has nothing to flush, so no grace here.
expect_refused() {
  local np=$1 regex=$2; shift 2
  local code=0
  OMPI_MCA_odls_base_sigkill_timeout=0 mpi "$np" "$KILN_BIN" "$@" >/dev/null 2>"$work/err" || code=$?
  [ "$code" -eq 2 ] && grep -Eq "kiln: error: .*$regex" "$work/err" || { cat "$work/err" >&2; fail "$* (want exit 2, '$regex')"; }
  echo "refused: $(grep 'kiln: error' "$work/err" | head -n 1)"
}
# wait_steps LOG N: until LOG holds N step records (at most 60 s), for tests that act mid-run.
wait_steps() {
  for _ in $(seq 1 600); do
    local c; c=$(grep -c '"type":"step"' "$1" 2>/dev/null || true)
    [ "${c:-0}" -ge "$2" ] && return 0
    sleep 0.1
  done
  fail "no $2 steps in $1"
}
# need_python MODULE...: sets py to KILN_PYTHON, or exits 77 (skipped) when it cannot import every
# MODULE (launch/setup.sh installs them into .venv).
need_python() {
  py="${KILN_PYTHON:-}"
  if [ -z "$py" ] || ! "$py" -c "import $(IFS=,; echo "$*")" >/dev/null 2>&1; then
    echo "SKIP: $* not importable by KILN_PYTHON='${py}' (launch/setup.sh installs them into .venv)"
    exit 77
  fi
}
# need_cuda: exits 77 (skipped) when kiln finds no CUDA device, saying why.
need_cuda() {
  if ! "$KILN_BIN" train --device cuda --steps 0 >/dev/null 2>"$work/err"; then
    echo "SKIP: no CUDA device: $(cat "$work/err")"
    exit 77
  fi
}
