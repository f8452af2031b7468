#!/usr/bin/env bash
# tests/cli/tensorboard.sh -- `kiln train --tensorboard DIR` (runtime/observe/tensorboard.h), read back by
# TensorBoard's own reader (EventAccumulator, the code behind `tensorboard --logdir`).
#
# 1. A 20-step run with evaluation every 10 steps: train/loss, train/lr, train/grad_norm,
#    train/tokens_per_s... at steps 1..20 and eval/val_loss at 10 and 20, each equal to the JSONL
#    record's value rounded to float32 (TensorBoard's simple_value is a float: 1e-6 relative is
#    that rounding, 6e-8, with margin). The reader checks every record's CRC-32C.
# 2. A resume: a run saved at step 10 and stopped at 15 (--stop-at-step), then resumed from step
#    10 (--resume ck/step_00000010) into the same TensorBoard directory: the second event file's SessionLog START at step 11 makes
#    TensorBoard drop the first file's steps 11-15, so steps 1..20 are shown once, with the
#    losses of the uninterrupted run (a resume replays exactly on the same layout).
# 3. 2 ranks (DDP): rank 0 alone writes, one event file. Text (the Text tab): the config record as
#    `config` at step 1 (its JSON, the run's settings), and --sample-every's samples as `samples`
#    at their steps, equal to the JSONL's sample records. HParams: one session_start_info whose
#    hyperparameters are the config record's scalar settings, each equal (read back with the
#    hparams plugin's own protobuf classes).
# 4. A directory that cannot be made: one line, exit 2, on 1 rank and under mpirun.
#
# Skipped (exit 77) when KILN_PYTHON cannot import tensorboard (launch/setup.sh installs it).
source "$(dirname "$0")/common.sh"
need_python tensorboard
: "${MPIEXEC:=mpirun}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
cd "$work"
train=("$KILN_BIN" train --device cpu --n-layer 1 --seq-len 32 --micro-batch 4 --steps 20 --warmup 2)

# 1. and 2.
python3 -c "open('t.txt', 'w').write('the quick brown fox jumps over the lazy dog ' * 800)"
"$KILN_BIN" prep --input t.txt --out shards --val-tokens 4000 >/dev/null
data=(--data "shards/train_*.bin" --val-data shards/val_000000.bin --eval-every 10 --eval-batches 2)
"${train[@]}" "${data[@]}" --tensorboard tb_full --log-json full.jsonl >/dev/null
"${train[@]}" "${data[@]}" --tensorboard tb_resume --save-dir ck --save-every 10 --stop-at-step 15 --log-json part.jsonl >/dev/null
"${train[@]}" "${data[@]}" --tensorboard tb_resume --save-dir ck --resume ck/step_00000010 --log-json part.jsonl >/dev/null
[ "$(ls tb_resume | grep -c tfevents)" -eq 2 ] || fail "want two event files in tb_resume: $(ls tb_resume)"

# 3.
mpi 2 "${train[@]}" --steps 4 --sample-every 2 --tensorboard tb_ddp --log-json ddp.jsonl >/dev/null
[ "$(ls tb_ddp | grep -c tfevents)" -eq 1 ] || fail "want one event file from 2 ranks: $(ls tb_ddp)"

"$py" - <<'PY'
import json
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

def scalars(d):
    acc = EventAccumulator(d, size_guidance={"scalars": 0})  # 0: keep every event
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}

def close(a, b):
    return abs(a - b) <= 1e-6 * max(abs(b), 1e-30)

records = [json.loads(l) for l in open("full.jsonl")]
steps = {r["step"]: r for r in records if r["type"] == "step"}
evals = {r["step"]: r for r in records if r["type"] == "eval"}
full = scalars("tb_full")
for tag in ("train/loss", "train/lr", "train/grad_norm", "train/loss_scale", "train/tokens_per_s", "train/mem_gb"):
    key = tag.split("/")[1]
    assert sorted(full[tag]) == list(range(1, 21)), (tag, sorted(full[tag]))
    for s, v in full[tag].items():
        assert close(v, steps[s][key]), (tag, s, v, steps[s][key])
assert sorted(full["eval/val_loss"]) == [10, 20] and all(close(full["eval/val_loss"][s], evals[s]["val_loss"]) for s in (10, 20))
assert sorted(full["eval/perplexity"]) == [10, 20]
print(f"tb_full: {len(full)} tags; train/loss at steps 1..20 = the log's (float32), eval/val_loss at 10, 20")

acc = EventAccumulator("tb_resume", size_guidance={"scalars": 0})
acc.Reload()
shown = [e.step for e in acc.Scalars("train/loss")]
assert shown == list(range(1, 21)), shown  # each step once, in order: no replayed duplicates
resumed = scalars("tb_resume")
diff = max(abs(resumed["train/loss"][s] - full["train/loss"][s]) for s in range(1, 21))
assert diff == 0, diff
print("tb_resume: steps 1..20 once (the replayed 11-15 dropped by the SessionLog START), losses == the uninterrupted run's")

ddp = scalars("tb_ddp")
assert sorted(ddp["train/loss"]) == [1, 2, 3, 4], ddp["train/loss"]
print("tb_ddp: rank 0's one file, steps 1..4")
acc = EventAccumulator("tb_ddp", size_guidance={"tensors": 0})
acc.Reload()
assert {"config", "samples"} <= set(acc.Tags()["tensors"]), acc.Tags()["tensors"]
text = lambda e: e.tensor_proto.string_val[0].decode("utf-8")
config = acc.Tensors("config")
assert [e.step for e in config] == [1], [e.step for e in config]
body = text(config[0])
assert body.startswith("```json\n") and body.endswith("\n```"), body[:40]
logged = [json.loads(l) for l in open("ddp.jsonl")]
assert json.loads(body[len("```json\n"):-len("\n```")]) == next(r for r in logged if r["type"] == "config")
samples = {e.step: text(e) for e in acc.Tensors("samples")}
want = {r["step"]: r["text"] for r in logged if r["type"] == "sample"}
assert sorted(samples) == [2, 4] and all(samples[s].startswith("```") and want[s] in samples[s] for s in want), (samples, want)
print("tb_ddp: text: config at step 1 (the config record), samples at steps 2 and 4 (the sample records)")
from tensorboard.plugins.hparams import plugin_data_pb2
content = acc.PluginTagToContent("hparams")
assert list(content) == ["_hparams_/session_start_info"], list(content)
hp = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info.hparams
settings = next(r for r in logged if r["type"] == "config")["config"]
scalars_of = {k: v for k, v in settings.items() if isinstance(v, (bool, int, float, str))}
assert set(hp) == set(scalars_of), set(hp) ^ set(scalars_of)
for k, v in scalars_of.items():
    got = hp[k].bool_value if isinstance(v, bool) else hp[k].string_value if isinstance(v, str) else hp[k].number_value
    assert got == v, (k, got, v)
print(f"tb_ddp: hparams: {len(hp)} settings, the config record's")
PY

# 4.
touch not_a_dir
code=0; "${train[@]}" --steps 1 --tensorboard not_a_dir/tb 2>err >/dev/null || code=$?
[ "$code" -eq 2 ] && [ "$(grep -c . err)" -eq 1 ] && grep -q "^kiln: error: --tensorboard not_a_dir/tb: cannot create the directory" err ||
  { cat err; fail "an impossible --tensorboard dir: exit $code"; }
code=0; mpi 2 "${train[@]}" --steps 1 --tensorboard not_a_dir/tb 2>err >/dev/null || code=$?
[ "$code" -eq 2 ] && grep -q "kiln: error: --tensorboard not_a_dir/tb: cannot create the directory" err || { cat err; fail "under mpirun: exit $code"; }
echo "refused: $(grep -m1 'kiln: error' err)"
echo "PASS"
