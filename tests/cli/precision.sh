#!/usr/bin/env bash
# tests/cli/precision.sh -- mixed precision end to end on the CPU (label cli).
#   bf16: trains (the loss falls), loss scale 1, nothing skipped.
#   fp16 from scale 2^40: the first steps overflow and are skipped while the scale comes down
#     (held once by hysteresis 2, then halved every step), then it trains.
#   A skipped step leaves the weights and AdamW untouched: one skipped step gives the same
#     weights, bit for bit, as no step at all.
#   Overflowing at the minimum scale is an error naming it, not an endless loop of skips.
#   bf16 with a diverging learning rate: the run stops naming the step (exit 4), or with
#     --on-nonfinite skip skips such steps and finishes.
# bf16/fp16 matrix products are slow on CPUs without AVX512-BF16, so the model is 2 layers.
source "$(dirname "$0")/common.sh"

M=(train --device cpu --model tiny --n-layer 2 --micro-batch 4 --lr 3e-3 --warmup 5 --log-every 100)

"$KILN_BIN" "${M[@]}" --steps 30 --precision bf16 --log-json "$work/bf16.jsonl" >/dev/null
jsonl_check "$work/bf16.jsonl" '
cfg = records[0]
assert cfg["compute_dtype"] == "BFloat16", cfg["compute_dtype"]
steps = [r for r in records if r["type"] == "step"]
assert len(steps) == 30
assert all(not s["skipped"] and s["loss_scale"] == 1.0 for s in steps)
first, last = steps[0]["loss"], sum(s["loss"] for s in steps[-5:]) / 5
assert last < first - 1.0, (first, last)
print(f"bf16: loss {first:.3f} -> {last:.3f} (mean of the last 5)")
'

"$KILN_BIN" "${M[@]}" --steps 40 --precision fp16 --initial-scale-power 40 --log-json "$work/fp16.jsonl" >/dev/null
jsonl_check "$work/fp16.jsonl" '
steps = [r for r in records if r["type"] == "step"]
skipped = [s for s in steps if s["skipped"]]
n = len(skipped)
assert n >= 3 and steps[0]["skipped"], "the first steps must overflow at 2^40"
assert [s["step"] for s in skipped] == list(range(1, n + 1)), "skips must be the first steps, in a row"
# Scale used by each skipped step: 2^40 twice (hysteresis 2 holds it once), then halving.
want = [2.0**40, 2.0**40] + [2.0**(40 - k) for k in range(1, n - 1)]
assert [s["loss_scale"] for s in skipped] == want, [s["loss_scale"] for s in skipped]
assert all(s["lr"] == steps[0]["lr"] for s in skipped), "skipped steps must not advance the LR schedule"
trained = steps[n:]
assert all(not s["skipped"] for s in trained)
assert trained[0]["loss_scale"] == 2.0**(40 - (n - 1))
first, last = trained[0]["loss"], sum(s["loss"] for s in trained[-5:]) / 5
assert last < first - 0.5, (first, last)
assert records[-1]["updates"] == 40 - n and records[-1]["skipped_steps"] == n
print(f"fp16: {n} steps skipped, scale 2^40 -> 2^{40 - (n - 1)}; loss {first:.3f} -> {last:.3f}")
'

# One skipped step == no step: weights bit-identical, no update counted.
"$KILN_BIN" "${M[@]}" --steps 0 --precision fp16 --log-json "$work/none.jsonl" >/dev/null
"$KILN_BIN" "${M[@]}" --steps 1 --precision fp16 --initial-scale-power 40 --log-json "$work/skip1.jsonl" >/dev/null
python3 - "$work" <<'PY'
import json, sys
d = sys.argv[1]
last = lambda n: [json.loads(l) for l in open(f"{d}/{n}.jsonl")][-1]
a, b = last("none"), last("skip1")
assert b["skipped_steps"] == 1 and b["updates"] == 0, b
assert (a["param_sum"], a["param_sq"]) == (b["param_sum"], b["param_sq"]), (a, b)
print("a skipped step leaves the weights bit-identical")
PY

expect_exit() {  # expect_exit CODE REGEX ARGS...
  local want=$1 regex=$2; shift 2
  local code=0
  timeout 300 "$KILN_BIN" "$@" >"$work/out" 2>"$work/err" || code=$?
  [ "$code" -eq "$want" ] || { cat "$work/err" >&2; fail "kiln $* exited $code (want $want)"; }
  grep -Eq "^kiln: error: .*$regex" "$work/err" || { cat "$work/err" >&2; fail "stderr does not match '$regex'"; }
  [ "$(wc -l <"$work/err")" -eq 1 ] || { cat "$work/err" >&2; fail "more than one line on stderr"; }
  echo "ok ($code): $(cat "$work/err")"
}
# Scale 2^40, floor 2^30, no hysteresis: ten halvings reach the floor, the next overflow is fatal.
expect_exit 4 "overflow at the minimum loss scale" "${M[@]}" --steps 30 --precision fp16 \
  --initial-scale-power 40 --hysteresis 1 --min-loss-scale 1073741824
# A learning rate of 1e38 blows the weights up in one step; the next loss is not finite.
expect_exit 4 "step 2: .* not finite" "${M[@]}" --steps 5 --precision bf16 --lr 1e38 --warmup 0 --grad-clip 0
"$KILN_BIN" "${M[@]}" --steps 5 --precision bf16 --lr 1e38 --warmup 0 --grad-clip 0 --on-nonfinite skip \
  --log-json "$work/skip.jsonl" >/dev/null
jsonl_check "$work/skip.jsonl" '
steps = [r for r in records if r["type"] == "step"]
assert not steps[0]["skipped"] and all(s["skipped"] for s in steps[1:]), [s["skipped"] for s in steps]
assert records[-1]["updates"] == 1
print("--on-nonfinite skip: steps 2-5 skipped, run finished")
'
echo "PASS"
