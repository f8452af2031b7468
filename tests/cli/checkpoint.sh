#!/usr/bin/env bash
# tests/cli/checkpoint.sh -- checkpoints in one process (label cli).
#   Resume by replay: 20 steps straight against 10 steps (--steps 20 --stop-at-step 10: the same
#     run, schedule and all, stopped at 10), resume, 10 more: the losses of
#     steps 11-20 and the final weights are bit-identical (==), with dropout on, in fp32 and in
#     fp16 (whose loss scaler state travels in the checkpoint).
#   The file layout, `latest`, and --keep-last. An incomplete latest checkpoint is named with its
#     missing file, and the resume falls back to the newest complete one, saying so.
#   A process killed in the middle of a save (SIGKILL, test hook) leaves the previous
#     checkpoint intact: `latest` still names it, it loads, and the resumed run replays exactly.
#   Refused with one line and kiln's exit code: --resume none over existing checkpoints, another
#     model shape, a corrupt file (naming the older checkpoints beside it), a missing tensor, a path
#     with no checkpoint; a refused run leaves no save directory it created.
source "$(dirname "$0")/common.sh"

T=(train --device cpu --model tiny --dropout 0.1 --micro-batch 4 --warmup 5 --log-every 100)

compare() {  # compare STRAIGHT RESUMED FIRST_RESUMED_STEP
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
load = lambda p: [json.loads(l) for l in open(p)]
a, b, first = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3])
sa = {r["step"]: r for r in a if r["type"] == "step"}
sb = [r for r in b if r["type"] == "step" and r["step"] >= first]
assert sb and sb[0]["step"] == first, [r["step"] for r in sb][:3]
# Every difference, not only the first: whether a mismatch stays at one step or carries on says
# where to look (an intermittent grad_norm difference at the first resumed step was seen once).
diffs = [(r["step"], key, r[key], sa[r["step"]][key]) for r in sb
         for key in ("loss", "grad_norm", "lr", "loss_scale", "skipped") if r[key] != sa[r["step"]][key]]
assert not diffs, diffs
same_end = max(sa) == sb[-1]["step"]
if same_end:
    for key in ("param_sum", "param_sq", "updates"):
        assert a[-1][key] == b[-1][key], (key, a[-1][key], b[-1][key])
print(f"steps {first}-{sb[-1]['step']}" + (" and final weights" if same_end else "") + " bit-identical to the straight run")
PY
}

# ---- replay, fp32 with dropout
"$KILN_BIN" "${T[@]}" --steps 20 --log-json "$work/straight.jsonl" >/dev/null
"$KILN_BIN" "${T[@]}" --steps 20 --stop-at-step 10 --save-dir "$work/ck" --log-json "$work/part.jsonl" >/dev/null
"$KILN_BIN" "${T[@]}" --steps 20 --save-dir "$work/ck" --log-json "$work/part.jsonl" >"$work/out"
grep -q "resumed from $work/ck/step_00000010 at step 10" "$work/out" || { cat "$work/out"; fail "no resume line"; }
compare "$work/straight.jsonl" "$work/part.jsonl" 11

# ---- layout of a checkpoint, latest, retention
c="$work/ck/step_00000020"
for f in model.safetensors config.json optimizer.safetensors trainer_state.json; do
  [ -s "$c/$f" ] || fail "$c/$f missing"
done
[ "$(cat "$work/ck/latest")" = "step_00000020" ] || fail "latest is '$(cat "$work/ck/latest")'"
"$KILN_BIN" "${T[@]}" --steps 10 --save-every 2 --keep-last 2 --save-dir "$work/keep" >/dev/null
[ "$(cd "$work/keep" && ls -d step_* | tr '\n' ' ')" = "step_00000008 step_00000010 " ] ||
  fail "keep-last 2 left: $(ls "$work/keep")"
echo "layout, latest and --keep-last as documented"
# An incomplete latest checkpoint (its directory there, without trainer_state.json, which a save
# writes last): the resume says which file is missing and that it falls back (issue 48: it said
# "gone").
cp -r "$work/keep" "$work/inc" && rm "$work/inc/step_00000010/trainer_state.json"
"$KILN_BIN" "${T[@]}" --steps 10 --save-every 2 --keep-last 2 --save-dir "$work/inc" >"$work/out"
grep -q "^kiln: warning: latest named step_00000010, which is incomplete (step_00000010/trainer_state.json is missing); falling back to the newest complete checkpoint, $work/inc/step_00000008: steps 9-10 are trained again$" "$work/out" &&
  grep -q "resumed from $work/inc/step_00000008 at step 8" "$work/out" || { cat "$work/out"; fail "no word of the incomplete latest checkpoint"; }
[ -f "$work/inc/step_00000010/trainer_state.json" ] || fail "step 10 was not saved again whole"

# ---- replay, fp16 (the scaler's scale, hysteresis and growth clock are saved)
F=(--precision fp16 --n-layer 1 --initial-scale-power 20 --loss-scale-window 3)
"$KILN_BIN" "${T[@]}" "${F[@]}" --steps 12 --log-json "$work/f_straight.jsonl" >/dev/null
"$KILN_BIN" "${T[@]}" "${F[@]}" --steps 12 --stop-at-step 6 --save-dir "$work/fck" >/dev/null
"$KILN_BIN" "${T[@]}" "${F[@]}" --steps 12 --save-dir "$work/fck" --log-json "$work/f_part.jsonl" >/dev/null
compare "$work/f_straight.jsonl" "$work/f_part.jsonl" 7

# ---- a crash in the middle of the second save (step 10) leaves step 5 intact
code=0
KILN_TEST_CRASH_IN_SAVE=2 "$KILN_BIN" "${T[@]}" --steps 20 --stop-at-step 10 --save-every 5 --save-dir "$work/crash" \
  >/dev/null 2>"$work/err" || code=$?
[ "$code" -eq 137 ] || { cat "$work/err"; fail "the crash hook did not kill the run (exit $code)"; }
[ "$(cat "$work/crash/latest")" = "step_00000005" ] || fail "latest moved to '$(cat "$work/crash/latest")'"
[ ! -e "$work/crash/step_00000010" ] || fail "a half-written step_00000010 was committed"
ls -a "$work/crash" | grep -q '^\.tmp-step_00000010' || fail "the crash did not happen mid-save"
"$KILN_BIN" "${T[@]}" --steps 20 --stop-at-step 10 --save-every 5 --save-dir "$work/crash" --log-json "$work/after.jsonl" >/dev/null
compare "$work/straight.jsonl" "$work/after.jsonl" 6
! ls -a "$work/crash" | grep -q '^\.tmp-' || fail "the leftover temporary directory was not cleared"
echo "a save killed midway left the previous checkpoint loadable"

# ---- a crash between a save's two renames: step_10 already exists (a resumed run saves it
# again), it is moved aside, and the process dies before the new one moves in. `latest` then
# names a step_10 that is gone; the next resume moves the aside copy back (or, without it, takes
# the newest complete checkpoint) and says so.
"$KILN_BIN" "${T[@]}" --steps 20 --stop-at-step 10 --save-every 5 --save-dir "$work/aside" >/dev/null
code=0
KILN_TEST_CRASH_IN_SAVE=1 KILN_TEST_CRASH_POINT=aside "$KILN_BIN" "${T[@]}" --steps 20 --stop-at-step 10 --save-every 5 \
  --save-dir "$work/aside" --resume "$work/aside/step_00000005" >/dev/null 2>"$work/err" || code=$?
[ "$code" -eq 137 ] || { cat "$work/err"; fail "the aside crash hook did not kill the run (exit $code)"; }
[ ! -e "$work/aside/step_00000010" ] && [ "$(cat "$work/aside/latest")" = "step_00000010" ] ||
  fail "the crash did not leave latest naming a missing step_00000010"
ls -a "$work/aside" | grep -q '^\.old-step_00000010-' || fail "no aside copy of step_00000010"
cp -r "$work/aside" "$work/aside2"
rm -rf "$work/aside2"/.old-*
"$KILN_BIN" "${T[@]}" --steps 20 --save-dir "$work/aside" --log-json "$work/aside.jsonl" >"$work/out"
grep -q "recovered .*step_00000010 from its aside copy" "$work/out" || { cat "$work/out"; fail "no recovery notice"; }
compare "$work/straight.jsonl" "$work/aside.jsonl" 11
! ls -a "$work/aside" | grep -q '^\.old-' || fail "the aside copy was not cleared"
"$KILN_BIN" "${T[@]}" --steps 20 --save-dir "$work/aside2" --log-json "$work/aside2.jsonl" >"$work/out"
grep -q "latest named step_00000010, which is gone; falling back to the newest complete checkpoint, .*step_00000005: steps 6-10 are trained again" "$work/out" ||
  { cat "$work/out"; fail "no fallback notice"; }
compare "$work/straight.jsonl" "$work/aside2.jsonl" 6
echo "a crash between a save's renames: the aside copy moved back, or the newest complete checkpoint taken"

# ---- refusals
expect_fail() {  # expect_fail CODE REGEX ARGS...
  local want=$1 regex=$2; shift 2
  local code=0
  timeout 120 "$KILN_BIN" "$@" >"$work/out" 2>"$work/err" || code=$?
  [ "$code" -eq "$want" ] || { cat "$work/err" >&2; fail "kiln $* exited $code (want $want)"; }
  [ "$(wc -l <"$work/err")" -eq 1 ] || { cat "$work/err" >&2; fail "more than one line on stderr"; }
  grep -Eq "^kiln: error: .*$regex" "$work/err" || { cat "$work/err" >&2; fail "stderr does not match '$regex'"; }
  echo "ok ($code): $(cat "$work/err")"
}
expect_fail 2 "already holds checkpoints" "${T[@]}" --steps 12 --save-dir "$work/ck" --resume none
expect_fail 2 "another model shape: n_layer 4 \(this run: 3\)" "${T[@]}" --steps 22 --n-layer 3 --resume "$work/ck"
# ... and a refused run leaves no save directory it created, nor its lock (issue 48: it left both).
expect_fail 2 "no checkpoint there" "${T[@]}" --steps 5 --resume "$work/nothing" --save-dir "$work/refused/sub"
[ ! -e "$work/refused" ] || fail "the refused run left $(find "$work/refused")"
cp -r "$work/ck/step_00000020" "$work/bad"
python3 - "$work/bad/model.safetensors" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read()); b[-100] ^= 0x40
open(p, "wb").write(b)
PY
expect_fail 3 "model.safetensors is corrupt" "${T[@]}" --steps 22 --resume "$work/bad"
# A corrupt checkpoint among others: the error names the older ones to resume from.
python3 - "$work/keep/step_00000010/optimizer.safetensors" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read()); b[-7] ^= 0x01
open(p, "wb").write(b)
PY
expect_fail 3 "optimizer.safetensors is corrupt .*; older checkpoints beside it: step_00000008 \(--resume $work/keep/step_00000008\)" \
  "${T[@]}" --steps 12 --save-every 2 --keep-last 2 --save-dir "$work/keep"
# A file that is well-formed and correctly checksummed but lacks a tensor.
cp -r "$work/ck/step_00000020" "$work/short"
python3 - "$work/short" <<'PY'
import json, struct, sys, zlib
d = sys.argv[1]
raw = open(f"{d}/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head, data = json.loads(raw[8:8 + n]), raw[8 + n:]
del head["transformer.h.3.mlp.c_fc.weight"]
out, off = bytearray(), 0
for k in sorted(k for k in head if k != "__metadata__"):
    b, e = head[k]["data_offsets"]
    head[k]["data_offsets"] = [off, off + e - b]
    out += data[b:e]; off += e - b
h = json.dumps(head).encode(); h += b" " * (-len(h) % 8)
open(f"{d}/model.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + out)
st = json.load(open(f"{d}/trainer_state.json"))
st["files"]["model.safetensors"] = zlib.crc32(open(f"{d}/model.safetensors", "rb").read())
json.dump(st, open(f"{d}/trainer_state.json", "w"))
PY
expect_fail 2 "no tensor 'transformer.h.3.mlp.c_fc.weight'|'transformer.h.3.mlp.c_fc.weight'.*missing|missing.*'transformer.h.3.mlp.c_fc.weight'" \
  "${T[@]}" --steps 22 --resume "$work/short"
echo "PASS"
