#!/usr/bin/env bash
# tests/cli/deepspeed.sh -- `kiln train --deepspeed FILE` with the two DeepSpeed configs users bring
# (../shared/fixtures/deepspeed, as Accelerate's textbook gives them, "auto" values included) at 2
# ranks on the CPU: each run equals, loss for loss and lr for lr, the run of the kiln flags that say
# the same (bit for bit: the same settings take the same code path), and the learning rates are
# DeepSpeed's WarmupDecayLR (log warm-up; the first two updates at warmup_min_lr 0, as DeepSpeed
# steps its scheduler after the optimizer). A flag overrides the file with a notice; a layout flag
# that contradicts it is refused; so is a numerics key kiln lacks.
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
fixtures=${KILN_DS_FIXTURES:-}
[ -f "$fixtures/zero2_config_accelerate.json" ] || fixtures=/work/shared/fixtures/deepspeed
if [ ! -f "$fixtures/zero2_config_accelerate.json" ]; then
  echo "SKIP: the DeepSpeed fixtures (../shared/fixtures/deepspeed) are not there"
  exit 77
fi
cd "$work"
common=(--device cpu --steps 12 --warmup 4 --seed 7 --dropout 0.1 --micro-batch 4)

# ZeRO-2, fp16 (2^15), AdamW with torch_adam, WarmupDecayLR, clipping "auto", batch "auto".
mpi 2 "$KILN_BIN" train "${common[@]}" --deepspeed "$fixtures/zero2_config_accelerate.json" --log-json ds2.jsonl | tee ds2.out
# The keys accepted without effect: one console line naming them (it was one line each, 7 on every
# launch), each with its reason in the config record.
[ "$(grep -c 'kiln: deepspeed: .* key(s) accepted that change nothing kiln does: .*zero_optimization.overlap_comm' ds2.out)" -eq 1 ] &&
  [ "$(grep -c 'kiln: deepspeed: .*accepted' ds2.out)" -eq 1 ] || { cat ds2.out; fail "the accepted keys are not one line"; }
# The fixture's steps_per_print 2000 is beyond these 12 steps: the console keeps kiln's own
# --log-every (it printed no step line but the last), and says so.
grep -q "kiln: deepspeed: steps_per_print 2000 is beyond --steps 12: the console keeps kiln's --log-every 1" ds2.out &&
  [ "$(grep -c '^step ' ds2.out)" -eq 12 ] || { cat ds2.out; fail "steps_per_print beyond the run"; }
python3 -c "
import json
n = json.loads(open('ds2.jsonl').readline())['config']['deepspeed']['notices']
assert len([x for x in n if ': accepted; ' in x]) >= 7 and any(x.startswith('zero_optimization.overlap_comm: accepted; ') for x in n), n
" || fail "the config record lacks a notice per tuning key"
mpi 2 "$KILN_BIN" train "${common[@]}" --zero 2 --precision fp16 --initial-scale-power 15 --lr-schedule warmup-decay \
  --warmup-type log --beta2 0.999 --log-every 2000 --log-json flags2.jsonl >/dev/null

# ZeRO-3 with the optimizer on the CPU, fp16 (2^16), WarmupDecayLR; no gradient_clipping: none.
mpi 2 "$KILN_BIN" train "${common[@]}" --deepspeed "$fixtures/zero3_offload_config_accelerate.json" --log-json ds3.jsonl >/dev/null
mpi 2 "$KILN_BIN" train "${common[@]}" --zero 3 --offload optimizer --precision fp16 --lr-schedule warmup-decay \
  --warmup-type log --beta2 0.999 --grad-clip 0 --log-json flags3.jsonl >/dev/null

python3 - <<'PY'
import json, math
def load(p):
    recs = [json.loads(l) for l in open(p)]
    return recs[0]["config"], [r for r in recs if r.get("type") == "step"]
for n, stage, offload, clip in (("2", 2, "none", 1.0), ("3", 3, "optimizer", 0.0)):
    cfg, ds = load(f"ds{n}.jsonl")
    _, flags = load(f"flags{n}.jsonl")
    assert cfg["zero"] == stage and cfg["offload"] == offload and cfg["precision"] == "fp16", cfg
    assert cfg["grad_clip"] == clip, cfg["grad_clip"]
    if n == "2":  # "auto" batch keys: the flags' micro-batch, and the product for the global batch
        auto = cfg["deepspeed"]["auto"]
        assert auto["train_micro_batch_size_per_gpu"] == 4 and auto["train_batch_size"] == 8, auto
    assert len(ds) == len(flags) == 12
    for a, b in zip(ds, flags):
        assert (a["loss"], a["lr"], a["grad_norm"], a["loss_scale"]) == (b["loss"], b["lr"], b["grad_norm"], b["loss_scale"]), (n, a, b)
    # DeepSpeed's WarmupDecayLR (warmup_min_lr 0, warmup_max_lr = --lr, 4 warm-up, 12 total), update u
    # at the scheduler's position u - 1: lr 0 at -1 and at 0 (ln 1 = 0).
    lr, W, T = cfg["lr"], 4, 12
    def ds_lr(i):
        if i < 0: return 0.0
        if i < W: return lr * math.log(i + 1) / math.log(W)
        return lr * max(0.0, (T - i) / max(1, T - W))
    applied = 0
    for r in ds:
        want = ds_lr(applied - 1)
        assert abs(r["lr"] - want) <= 1e-12 * lr, (n, r["step"], r["lr"], want)
        applied += 0 if r["skipped"] else 1
    assert ds[0]["lr"] == 0.0 and ds[1]["lr"] == 0.0 and ds[2]["lr"] > 0
    assert all(math.isfinite(r["loss"]) for r in ds)
    print(f"zero{stage}: 12 steps equal to the flags' run; losses {ds[0]['loss']:.4f} -> {ds[-1]['loss']:.4f}; "
          f"lr {[round(r['lr'], 6) for r in ds[:6]]}...")
PY

# A flag overrides the file (with a notice); a layout flag contradicting it is refused.
# (the output kept in a file: `| grep -q` under pipefail failed the test whenever grep exited at
# its match before mpirun had written the rest -- a SIGPIPE race, seen once under load)
mpi 2 "$KILN_BIN" train --device cpu --steps 0 --deepspeed "$fixtures/zero2_config_accelerate.json" \
  --initial-scale-power 10 --log-json over.jsonl >over.out
grep -q "kiln: deepspeed: --initial-scale-power 10 overrides fp16.initial_scale_power (15)" over.out || { cat over.out; fail "override notice"; }
jsonl_check over.jsonl 'assert records[0]["config"]["initial_scale_power"] == 10'
expect_refused 2 "--zero 3 contradicts --deepspeed .*zero_optimization.stage \(2\)" train --device cpu --steps 1 \
  --deepspeed "$fixtures/zero2_config_accelerate.json" --zero 3
expect_refused 2 "--offload none contradicts" train --device cpu --steps 1 \
  --deepspeed "$fixtures/zero3_offload_config_accelerate.json" --offload none
# The batch, checked against the data-parallel ranks as DeepSpeed does.
echo '{"train_batch_size": 24, "train_micro_batch_size_per_gpu": 4}' > batch.json
mpi 2 "$KILN_BIN" train --device cpu --steps 0 --deepspeed batch.json --log-json batch.jsonl >/dev/null
jsonl_check batch.jsonl 'c = records[0]["config"]; assert (c["micro_batch"], c["grad_accum"]) == (4, 3), c'
echo '{"train_batch_size": 20, "train_micro_batch_size_per_gpu": 4}' > badbatch.json
expect_refused 2 "train_batch_size 20 is not a multiple of micro-batch 4 x data-parallel ranks \(2 data-parallel" \
  train --device cpu --steps 1 --deepspeed badbatch.json
echo '{"optimizer": {"type": "Lamb", "params": {"lr": 0.001}}}' > lamb.json
expect_refused 2 "optimizer.type: 'Lamb' is not implemented" train --device cpu --steps 1 --deepspeed lamb.json
echo '{"fp16": {"enabled": true, "consecutive_hysteresis": true}}' > hyst.json
expect_refused 2 "fp16.consecutive_hysteresis: true is not implemented" train --device cpu --steps 1 --deepspeed hyst.json
echo PASS
