#!/usr/bin/env bash
# tests/cli/report.sh -- `kiln report` (tools/report.py): a PNG of two runs overlaid (1 rank and
# 2 ranks), a log holding a resumed run's replayed steps drawn once, against tokens seen and wall
# time too (--x), and bad input refused with one line. Skipped (exit 77) where KILN_PYTHON has no
# matplotlib. (The pictures were looked at, 2026-11-27: one legend below the panels, whole-number
# step ticks, the learning rate where fp32/bf16 runs drew a flat loss scale.)
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
py=${KILN_PYTHON:-python3}
"$py" -c "import matplotlib, PIL" 2>/dev/null || { echo "SKIP: $py has no matplotlib"; exit 77; }

T=(train --device cpu --steps 12 --log-every 100)
"$KILN_BIN" "${T[@]}" --micro-batch 8 --log-json "$work/one.jsonl" >/dev/null
"$MPIEXEC" --allow-run-as-root -np 2 "$KILN_BIN" "${T[@]}" --micro-batch 4 --log-json "$work/two.jsonl" >/dev/null
# A run that stops at step 7 with checkpoints at 5 and 7; step 7's is lost, so the resume
# replays steps 6-7 from step 5's, appending to the same log: steps 6 and 7 are logged twice.
"$KILN_BIN" "${T[@]}" --save-dir "$work/ck" --save-every 5 --stop-at-step 7 --log-json "$work/resumed.jsonl" >/dev/null
rm -rf "$work/ck/step_00000007" && echo step_00000005 >"$work/ck/latest"
"$KILN_BIN" "${T[@]}" --save-dir "$work/ck" --save-every 5 --log-json "$work/resumed.jsonl" >/dev/null
[ "$(grep -c '"type":"step"' "$work/resumed.jsonl")" -eq 14 ] || fail "expected 14 step records (6 and 7 twice)"

"$KILN_BIN" report "$work/one.jsonl" "$work/two.jsonl" "$work/resumed.jsonl" --out "$work/report.png" | tee "$work/report.out"
grep -q "^kiln report: 3 run(s) (12, 12, 12 steps) -> $work/report.png$" "$work/report.out" || fail "report line"
"$py" - "$work/report.png" <<'PY'
import sys
from PIL import Image
im = Image.open(sys.argv[1]).convert("RGB")
assert im.size == (1500, 850), im.size
colors = im.getcolors(maxcolors=1 << 20)
assert colors is not None and len(colors) > 500, len(colors or [])        # lines, text, not a flat image
white = max(colors)[0] / (im.size[0] * im.size[1])
assert 0.5 < white < 0.98, white                                            # mostly background, not blank
# the three runs' colours (matplotlib's first three) are all drawn
want = {(0x1f, 0x77, 0xb4), (0xff, 0x7f, 0x0e), (0x2c, 0xa0, 0x2c)}
have = {c for _, c in colors}
assert want <= have, want - have
print(f"report.png: {im.size[0]}x{im.size[1]}, {len(colors)} colours, {100 * white:.0f}% background, 3 runs drawn")
PY

# Bad input: one line, exit 2.
refuse() {
  local regex=$1; shift
  local code=0
  "$KILN_BIN" report "$@" >/dev/null 2>"$work/err" || code=$?
  [ "$code" -eq 2 ] && [ "$(wc -l <"$work/err")" -eq 1 ] && grep -Eq "kiln: error: .*$regex" "$work/err" ||
    { cat "$work/err"; fail "report $* (want exit 2, one line, '$regex')"; }
  echo "refused: $(cat "$work/err")"
}
refuse "cannot read .*missing.jsonl" "$work/missing.jsonl" --out "$work/x.png"
echo "not json" >"$work/bad.jsonl"
refuse "line 1: not JSON" "$work/bad.jsonl" --out "$work/x.png"
head -n 1 "$work/one.jsonl" >"$work/config_only.jsonl"
refuse "no step records" "$work/config_only.jsonl" --out "$work/x.png"
refuse "required: --out" "$work/one.jsonl"
refuse "give a .png" "$work/one.jsonl" --out "$work/x.svg"
refuse "--smooth 0: give 1" "$work/one.jsonl" --out "$work/x.png" --smooth 0
refuse "argument --x: invalid choice" "$work/one.jsonl" --out "$work/x.png" --x epochs
for x in tokens time; do
  "$KILN_BIN" report "$work/one.jsonl" "$work/two.jsonl" --x "$x" --smooth 1 --out "$work/by_$x.png" >/dev/null || fail "--x $x"
  [ -s "$work/by_$x.png" ] || fail "--x $x: no picture"
done
echo PASS
