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
