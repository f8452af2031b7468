#!/usr/bin/env bash
# tests/cli/operations.sh -- operating a long job, in one process (label cli; docs/operations.md):
#   SIGTERM at step N: the step finishes, a checkpoint of step N is saved, the summary says why,
#     "interrupted at step N, saved ..." and exit 75; the resume replays the uninterrupted run bit
#     for bit (steps N+1..40 and the final weights), its log marked by a "resume" record. A second
#     SIGINT ends the process at once (130). --max-wall-time stops and saves before the limit; a
#     stop with nothing saved (no --save-dir) exits 7, not 75 (nothing to resume).
#   One job per save directory: a second job on the same --save-dir is refused (exit 2, naming the
#     holder) while the first runs, and the first's checkpoints are intact; a lock left by a job that
#     did not end cleanly is taken over with a notice (a run refused at set-up leaves it as it was);
#     an unwritable --save-dir fails at start-up.
#   A fresh run never truncates an earlier log: it is moved aside, and said so.
#   Resume guards: a changed seed, learning rate or global batch is refused with one line listing
#     each change, unless --allow-config-change (then listed in the config record); more steps are
#     fine and logged. A resume with another global batch reads on from the checkpoint's samples.
#     The data is compared by its files' token counts and fingerprints, not by the --data text.
#   Settings that do nothing get a warning: --eval-every without --val-data, --save-every without
#     --save-dir, --warmup as long as --steps or longer, --check-replicas with a single replica; the
#     start-up line names the preset with the fields changed in it. A run without --save-dir ends
#     saying how to keep the model.
source "$(dirname "$0")/common.sh"
T=(train --device cpu --model tiny --dropout 0.1 --micro-batch 4 --warmup 5 --log-every 100)

# ---- SIGTERM at step N, then resume by replay
"$KILN_BIN" "${T[@]}" --steps 40 --log-json "$work/straight.jsonl" >/dev/null
"$KILN_BIN" "${T[@]}" --steps 40 --save-dir "$work/sig" --log-json "$work/sig.jsonl" >"$work/sig.out" 2>&1 &
pid=$!
wait_steps "$work/sig.jsonl" 5
kill -TERM "$pid"
code=0; wait "$pid" || code=$?
[ "$code" -eq 75 ] || { cat "$work/sig.out"; fail "SIGTERM: exit $code (want 75)"; }
n=$(grep '"type":"step"' "$work/sig.jsonl" | tail -n 1 | python3 -c 'import json, sys; print(json.loads(sys.stdin.read())["step"])')
grep -q "^kiln: interrupted at step $n (SIGTERM), saved $work/sig/step_$(printf %08d "$n")$" "$work/sig.out" ||
  { cat "$work/sig.out"; fail "no 'interrupted at step $n' line"; }
[ "$(cat "$work/sig/latest")" = "step_$(printf %08d "$n")" ] || fail "latest is not step $n"
# ... said the moment the signal came (the step and the save ran in silence before).
grep -q "^kiln: SIGTERM: stopping after this step and saving" "$work/sig.out" || { cat "$work/sig.out"; fail "no word at the signal"; }
"$KILN_BIN" "${T[@]}" --steps 40 --save-dir "$work/sig" --log-json "$work/sig.jsonl" >"$work/resumed.out"
# The resumed invocation's summary names its own steps (it once added the checkpoint's updates:
# "steps 31-90 (60 updates)" for a run resumed at 30 to 60).
grep -q "steps $((n + 1))-40 ($((40 - n)) updates, 0 skipped)" "$work/resumed.out" ||
  { cat "$work/resumed.out"; fail "the resumed run's summary does not say steps $((n + 1))-40 ($((40 - n)) updates)"; }
python3 - "$work" "$n" <<'PY'
import json, sys
d, n = sys.argv[1], int(sys.argv[2])
straight = [json.loads(l) for l in open(f"{d}/straight.jsonl")]
log = [json.loads(l) for l in open(f"{d}/sig.jsonl")]
summaries = [r for r in log if r["type"] == "summary"]
assert summaries[0]["stopped"] == "SIGTERM" and summaries[-1]["stopped"] is None, summaries
resume = [i for i, r in enumerate(log) if r["type"] == "resume"]
assert len(resume) == 1 and log[resume[0]]["step"] == n, resume
a = {r["step"]: r for r in straight if r["type"] == "step"}
b = {r["step"]: r for r in log[resume[0]:] if r["type"] == "step"}
assert sorted(b) == list(range(n + 1, 41)), sorted(b)
for s in b:
    assert (b[s]["loss"], b[s]["grad_norm"]) == (a[s]["loss"], a[s]["grad_norm"]), s
assert (straight[-1]["param_sum"], straight[-1]["param_sq"]) == (log[-1]["param_sum"], log[-1]["param_sq"])
print(f"SIGTERM after step {n}: saved, exit 75; the resume replayed steps {n + 1}-40 and the weights bit for bit")
PY

# ---- a second SIGINT ends the process at once (steps of about half a second here)
"$KILN_BIN" train --device cpu --model tiny --micro-batch 64 --steps 200 --log-json "$work/int.jsonl" >/dev/null 2>"$work/int.err" &
pid=$!
wait_steps "$work/int.jsonl" 1
kill -INT "$pid"; sleep 0.1; kill -INT "$pid"
code=0; wait "$pid" || code=$?
[ "$code" -eq 130 ] || fail "two SIGINTs: exit $code (want 130, killed by the second)"
grep -q "^kiln: SIGINT: stopping after this step .*(Ctrl-C again to abort)" "$work/int.err" &&
  grep -q "^kiln: second Ctrl-C: aborted; the step under way and any save in flight are lost" "$work/int.err" ||
  { cat "$work/int.err"; fail "the two Ctrl-Cs were not announced"; }
echo "a second SIGINT ended the process at once"

# ---- --max-wall-time: stop and save before the limit
start=$(date +%s)
code=0; "$KILN_BIN" "${T[@]}" --steps 100000 --max-wall-time 4 --save-dir "$work/wall" >"$work/wall.out" 2>&1 || code=$?
took=$(( $(date +%s) - start ))
[ "$code" -eq 75 ] && grep -q "interrupted at step .* (--max-wall-time), saved" "$work/wall.out" ||
  { cat "$work/wall.out"; fail "--max-wall-time: exit $code"; }
[ "$took" -le 12 ] || fail "--max-wall-time 4 took $took s"
echo "--max-wall-time 4: stopped and saved after $took s (start-up included)"

# ---- one job per save directory
"$KILN_BIN" "${T[@]}" --steps 100000 --save-dir "$work/lk" --save-every 5 --log-json "$work/lk.jsonl" >"$work/lk.out" 2>&1 &
pid=$!
wait_steps "$work/lk.jsonl" 6
code=0; "$KILN_BIN" "${T[@]}" --steps 50 --save-dir "$work/lk" >"$work/out" 2>"$work/err" || code=$?
[ "$code" -eq 2 ] && [ "$(wc -l <"$work/err")" -eq 1 ] && grep -q "^kiln: error: --save-dir $work/lk is in use by another job (pid $pid on host " "$work/err" ||
  { cat "$work/err"; fail "a second job on one --save-dir: exit $code"; }
kill -TERM "$pid"; wait "$pid" || true
steps=$(ls "$work/lk" | grep -c '^step_')
[ "$steps" -ge 1 ] && [ -f "$work/lk/$(cat "$work/lk/latest")/trainer_state.json" ] || fail "the first job's checkpoints are not intact"
echo "second job refused: $(cat "$work/err")"
echo "pid 4242 on host elsewhere since yesterday: kiln train" >"$work/lk/.kiln.lock"
# A run refused at set-up leaves the directory as it found it: the stale holder's record too.
code=0; "$KILN_BIN" "${T[@]}" --steps 5 --save-dir "$work/lk" --resume "$work/nothing" >/dev/null 2>"$work/err" || code=$?
[ "$code" -eq 2 ] && [ "$(cat "$work/lk/.kiln.lock")" = "pid 4242 on host elsewhere since yesterday: kiln train" ] ||
  { cat "$work/err"; fail "a refused run (exit $code) changed the lock file: '$(cat "$work/lk/.kiln.lock")'"; }
"$KILN_BIN" "${T[@]}" --steps 100000 --stop-at-step 1 --save-dir "$work/lk" >"$work/out" 2>&1 ||
  { cat "$work/out"; fail "a stale lock was not taken over"; }
grep -q "the lock of $work/lk was left by a job that did not end cleanly (pid 4242 on host elsewhere" "$work/out" ||
  { cat "$work/out"; fail "no notice of the stale lock"; }
[ ! -s "$work/lk/.kiln.lock" ] || fail "the lock file still names a holder after a clean end"
code=0; "$KILN_BIN" "${T[@]}" --steps 5 --save-dir /proc/1 >"$work/out" 2>"$work/err" || code=$?
[ "$code" -eq 2 ] && grep -q "^kiln: error: --save-dir /proc/1 is not writable" "$work/err" || { cat "$work/err"; fail "unwritable --save-dir: exit $code"; }
! grep -q "^step" "$work/out" || fail "steps ran before the unwritable --save-dir was found"
echo "unwritable --save-dir refused at start-up: $(cat "$work/err")"

# ---- a fresh run moves an earlier log aside
"$KILN_BIN" "${T[@]}" --steps 2 --log-json "$work/log.jsonl" >/dev/null
"$KILN_BIN" "${T[@]}" --steps 3 --log-json "$work/log.jsonl" >"$work/out"
grep -q "held an earlier run's log: moved aside to $work/log.jsonl.1" "$work/out" || { cat "$work/out"; fail "no notice of the log moved aside"; }
[ "$(grep -c '"type":"step"' "$work/log.jsonl.1")" -eq 2 ] && [ "$(grep -c '"type":"step"' "$work/log.jsonl")" -eq 3 ] ||
  fail "the earlier log was not kept whole"
echo "an earlier log moved aside to log.jsonl.1"

# ---- resume guards
"$KILN_BIN" "${T[@]}" --steps 20 --stop-at-step 5 --save-dir "$work/g" >/dev/null
code=0; "$KILN_BIN" "${T[@]}" --steps 20 --save-dir "$work/g" --seed 7 --lr 2e-3 --micro-batch 2 >"$work/out" 2>"$work/err" || code=$?
[ "$code" -eq 2 ] && [ "$(wc -l <"$work/err")" -eq 1 ] ||  { cat "$work/err"; fail "changed settings: exit $code"; }
# The global batch's refusal names the flag that keeps it (issue 48: a 2-rank checkpoint on one rank
# was refused without a word of --grad-accum).
for want in "lr 0.001 -> 0.002" "seed 1337 -> 7" "global batch 4 -> 2 (--grad-accum 2 keeps it at 4 on dp 1)" "--allow-config-change"; do
  grep -qF -- "$want" "$work/err" || { cat "$work/err"; fail "the refusal does not name '$want'"; }
done
echo "refused: $(cat "$work/err")"
"$KILN_BIN" "${T[@]}" --steps 30 --save-dir "$work/g" --seed 7 --allow-config-change --log-json "$work/g.jsonl" >/dev/null
python3 - "$work/g.jsonl" <<'PY'
import json, sys
c = json.loads(open(sys.argv[1]).readline())["config_changes"]
got = {x["key"]: (x["saved"], x["now"], x["breaks_replay"]) for x in c}
assert got == {"seed": (1337, 7, True), "steps": (20, 30, False)}, got
print("with --allow-config-change:", got)
PY

# ---- resume with another global batch (--allow-config-change): the loader moves to the
# checkpoint's sample count and takes the new batch from there. With --lr 0 the weights never
# move, so a step's loss says only which samples it read: the resumed run's steps 5-8 at batch 8
# read samples 16-47, which a fresh batch-8 run reads at its steps 3-6 -- the same losses, bit for
# bit, and the same tokens_seen. (Deleting the loader's move to the checkpoint's samples, planted
# once: the resumed steps read from sample 32 = 4 steps x the new batch, and step 5's loss was
# 6.216 against 6.132.)
Z=(train --device cpu --model tiny --dropout 0 --lr 0 --warmup 0 --log-every 100)
"$KILN_BIN" "${Z[@]}" --steps 8 --micro-batch 4 --stop-at-step 4 --save-dir "$work/gb" >/dev/null
"$KILN_BIN" "${Z[@]}" --steps 8 --micro-batch 8 --save-dir "$work/gb" --allow-config-change --log-json "$work/gb8.jsonl" >/dev/null
"$KILN_BIN" "${Z[@]}" --steps 6 --micro-batch 8 --log-json "$work/fresh8.jsonl" >/dev/null
python3 - "$work" <<'PY'
import json, sys
d = sys.argv[1]
steps = lambda n: {r["step"]: r for r in map(json.loads, open(f"{d}/{n}.jsonl")) if r["type"] == "step"}
resumed, fresh = steps("gb8"), steps("fresh8")
assert sorted(resumed) == [5, 6, 7, 8], sorted(resumed)
for s in range(5, 9):
    a, b = resumed[s], fresh[s - 2]
    assert a["loss"] == b["loss"], (s, a["loss"], b["loss"])
    assert a["tokens_seen"] == b["tokens_seen"] == (16 + 8 * (s - 4)) * 128, (s, a["tokens_seen"], b["tokens_seen"])
print("resumed at batch 8 after 4 steps of batch 4: steps 5-8 read samples 16-47 (== a fresh batch-8 run's steps 3-6)")
PY

# ---- the guard compares the data, not the --data text (issue 38, defect 2): the same shard named
# relatively or absolutely resumes (it was refused as a change of data); a shard added under an
# unchanged glob (another sample order) is refused (it resumed silently), and so is another file
# of the same size.
python3 -c "import random; random.seed(1); w = ['alpha', 'beta', 'gamma', 'delta', 'kiln', 'fire']
open('$work/corpus.txt', 'w').write(' '.join(random.choice(w) for _ in range(12000)))"
"$KILN_BIN" prep --input "$work/corpus.txt" --out "$work/dd" --shard-tokens 20000 >/dev/null
mkdir -p "$work/glob" && cp "$work/dd/train_000000.bin" "$work/dd/train_000001.bin" "$work/glob/"
D=(train --device cpu --model tiny --micro-batch 2 --log-every 100 --steps 4)
"$KILN_BIN" "${D[@]}" --data "$work/dd/train_000000.bin" --stop-at-step 2 --save-dir "$work/dn" >/dev/null
(cd "$work" && "$KILN_BIN" "${D[@]}" --data ./dd/train_000000.bin --save-dir dn --log-json dn.jsonl >/dev/null) ||
  fail "the same shard named ./dd/train_000000.bin was refused"
python3 - "$work" <<'PY'
import json, sys
d = sys.argv[1]
c = json.loads(open(f"{d}/dn.jsonl").readline())["config_changes"]
got = {x["key"]: x["breaks_replay"] for x in c}
assert got == {"data": False}, c
state = json.load(open(f"{d}/dn/step_00000004/trainer_state.json"))
src = state["run"]["data_sources"]
assert [s["tokens"] for s in src] == [20000] and len(src[0]["fingerprint"]) == 16, src
print("the same shard under another name: resumed, the text change logged as not breaking the replay")
PY
"$KILN_BIN" "${D[@]}" --data "$work/glob/train_*.bin" --stop-at-step 2 --save-dir "$work/dg" >/dev/null
cp "$work/dd/train_000002.bin" "$work/glob/"
code=0; "$KILN_BIN" "${D[@]}" --data "$work/glob/train_*.bin" --save-dir "$work/dg" >/dev/null 2>"$work/err" || code=$?
[ "$code" -eq 2 ] && [ "$(wc -l <"$work/err")" -eq 1 ] && grep -qF 'data files "2 file(s) of 40000 tokens" -> "3 file(s) of 60000 tokens"' "$work/err" ||
  { cat "$work/err"; fail "a shard added under the same glob: exit $code"; }
echo "refused: $(cat "$work/err")"
code=0; "$KILN_BIN" "${D[@]}" --data "$work/dd/train_000001.bin" --save-dir "$work/dn" --steps 6 >/dev/null 2>"$work/err" || code=$?
[ "$code" -eq 2 ] && grep -qF 'data files "1 file(s) of 20000 tokens" -> "1 file(s) of 20000 tokens (other tokens)"' "$work/err" ||
  { cat "$work/err"; fail "another shard of the same size: exit $code"; }
echo "refused: $(cat "$work/err")"

# ---- settings that do nothing
# ... and a stop with nothing saved (--max-wall-time without --save-dir): not exit 75, which a
# requeue loop takes for "saved, resume" (issue 48: it restarted from scratch forever), but 7.
code=0; "$KILN_BIN" "${T[@]}" --steps 3 --warmup 5 --eval-every 2 --save-every 2 --check-replicas 1 --max-wall-time 0.001 >"$work/out" || code=$?
[ "$code" -eq 7 ] || { cat "$work/out"; fail "a stop with nothing saved: exit $code (want 7)"; }
for want in "warning: --eval-every 2 does nothing without --val-data" "warning: --save-every 2 does nothing without --save-dir" \
            "warning: --warmup 5 is longer than --steps 3" "warning: --check-replicas 1 does nothing with a single replica (dp 1, cp 1)" \
            "kiln: tiny (with dropout 0.1), " "interrupted at step 1 (--max-wall-time); nothing saved (no --save-dir): exit 7, not 75"; do
  grep -qF -- "$want" "$work/out" || { cat "$work/out"; fail "no '$want'"; }
done
# ... and a warm-up as long as the run (the default --warmup 20 with --steps 20 said nothing).
"$KILN_BIN" "${T[@]}" --steps 3 --warmup 3 >"$work/out"
grep -qF -- "warning: --warmup 3 is all of --steps 3: the whole run is warm-up" "$work/out" || { cat "$work/out"; fail "no warning for --warmup = --steps"; }
# A run without --save-dir (the default) ends saying how to keep the model (issue 48: it said
# nothing, and there was nothing for kiln sample).
tail -n 1 "$work/out" | grep -qF -- "kiln: nothing saved: give --save-dir DIR to keep the model (then: kiln sample --checkpoint DIR" ||
  { cat "$work/out"; fail "no word of --save-dir at the end of a run that saved nothing"; }
echo "PASS"
