#!/usr/bin/env bash
# tests/cli/mfu.sh -- per-device and per-job figures of jobs of several ranks, on the CPU (label
# mpi). At 1, 2 and 4 ranks with --peak-tflops P, the step records and the summary of the log
# must hold (distributed/job_devices.h, docs/metrics.md):
#   mfu x devices x P == tokens_per_s x flops_per_token / 1e12   (the job's model FLOP/s)
#   devices == ranks                   (on the CPU each rank's share of the cores is a device)
#   tflops_job == tokens_per_s x flops_per_token / 1e12,  tflops == tflops_job / devices,
#   mfu == tflops_job / (devices x P), and the summary's means alike
# and `kiln bench` at 2 ranks reports the same figures, and `kiln plan --compare` measures the
# same MFU from the log (the median step's). Energy stays null (no meter on the CPU). Tolerance: relative 1e-12; each figure is one or two roundings of a division or
# product of the same doubles (about 1e-16 each), while the bug this guards against (the job's
# FLOP/s over one device's peak) is off by a factor of the rank count.
source "$(dirname "$0")/common.sh"
: "${MPIEXEC:=mpirun}"
mpi() { local np=$1; shift; timeout 300 "$MPIEXEC" --allow-run-as-root --oversubscribe -np "$np" "$@"; }

P=0.5
T=(train --device cpu --model tiny --steps 4 --log-every 4 --micro-batch 2 --peak-tflops "$P")
"$KILN_BIN" "${T[@]}" --log-json "$work/np1.jsonl" >"$work/np1.out"
mpi 2 "$KILN_BIN" "${T[@]}" --log-json "$work/np2.jsonl" >"$work/np2.out"
mpi 4 "$KILN_BIN" "${T[@]}" --log-json "$work/np4.jsonl" >"$work/np4.out"
grep -q "on 4 device(s)" "$work/np4.out" || { cat "$work/np4.out"; fail "the console does not name 4 devices"; }
grep -Eq "TFLOP/s/device \(job [0-9.]+\) \| mfu" "$work/np4.out" || { cat "$work/np4.out"; fail "no per-device and job TFLOP/s on the console"; }

python3 - "$work" "$P" <<'PY'
import json, sys
d, P = sys.argv[1], float(sys.argv[2])
close = lambda a, b: abs(a - b) <= 1e-12 * max(abs(a), abs(b))
load = lambda ranks: [json.loads(l) for l in open(f"{d}/np{ranks}.jsonl")]
# First with the fields kiln has always logged: MFU is the job's FLOP/s over every device's peak.
for ranks in (1, 2, 4):
    recs = load(ranks)
    F = recs[0]["flops_per_token"]
    for s in (r for r in recs if r["type"] == "step"):
        job = s["tokens_per_s"] * F / 1e12
        assert close(s["mfu"] * ranks * P, job), \
            f"np {ranks} step {s['step']}: mfu {s['mfu']:.6g}, want tflops_job / ({ranks} x {P}) = {job / (ranks * P):.6g}"
for ranks in (1, 2, 4):
    recs = load(ranks)
    config, summary = recs[0], recs[-1]
    steps = [r for r in recs if r["type"] == "step"]
    F = config["flops_per_token"]
    assert config["type"] == "config" and summary["type"] == "summary" and len(steps) == 4
    assert config["world"]["size"] == ranks and config["peak_tflops"] == P, config
    assert config["devices"] == ranks, (ranks, config["devices"])
    for s in steps:
        job = s["tokens_per_s"] * F / 1e12
        assert close(s["tflops_job"], job), (ranks, s)
        assert close(s["tflops"], s["tflops_job"] / config["devices"]), (ranks, s)
        assert close(s["mfu"], s["tflops_job"] / (config["devices"] * P)), (ranks, s)
        assert s["energy_j"] is None and s["watts"] is None, s
    G = config["devices"]
    assert close(summary["mean_tflops"], summary["mean_tflops_job"] / G), summary
    assert close(summary["mean_mfu"], summary["mean_tflops_job"] / (G * P)), summary
    assert close(summary["mean_tflops_job"], summary["mean_tokens_per_s"] * F / 1e12), summary
    for k in ("mean_watts", "joules_per_token", "tflops_per_watt"):
        assert summary[k] is None, (k, summary[k])
    print(f"np {ranks}: devices {G}, mfu = tflops_job / ({G} x {P}), tflops = tflops_job / {G}")
PY

# kiln plan --compare: its measured MFU, from the median step time after step 1 (steps 2-4: the
# median is one step's), is that step's logged mfu.
for np in 2 4; do "$KILN_BIN" plan --compare "$work/np$np.jsonl" --json >"$work/np$np.cmp.json"; done
python3 - "$work" <<'PY'
import json, sys
d = sys.argv[1]
close = lambda a, b: abs(a - b) <= 1e-12 * max(abs(a), abs(b))
for ranks in (2, 4):
    steps = [json.loads(l) for l in open(f"{d}/np{ranks}.jsonl")][1:-1]
    median = sorted(steps[1:], key=lambda s: s["step_ms"])[1]
    row = {r["name"]: r for r in json.load(open(f"{d}/np{ranks}.cmp.json"))["rows"]}["mfu"]
    assert close(row["measured"], median["mfu"]), (ranks, row, median["mfu"])
    print(f"plan --compare np {ranks}: measured mfu {row['measured']:.6g} = the log's (step {median['step']})")
PY

# kiln bench reads the trainer's records: the same figures over its measured steps.
mpi 2 "$KILN_BIN" bench --device cpu --model tiny --warmup 1 --measure 2 --micro-batch 2 --peak-tflops "$P" \
  --json "$work/bench.json" >"$work/bench.out"
grep -q "job TF/s" "$work/bench.out" || { cat "$work/bench.out"; fail "the bench table has no job TFLOP/s column"; }
python3 - "$work" "$P" <<'PY'
import json, sys
d, P = sys.argv[1], float(sys.argv[2])
close = lambda a, b: abs(a - b) <= 1e-12 * max(abs(a), abs(b))
F = [json.loads(l) for l in open(f"{d}/np2.jsonl")][0]["flops_per_token"]  # the same model
r = json.load(open(f"{d}/bench.json"))["runs"][0]
job = r["tokens_per_s"] * F / 1e12
assert r["world"]["size"] == 2, r["world"]
assert close(r["mfu"] * 2 * P, job), f"bench np 2: mfu {r['mfu']:.6g}, want tflops_job / (2 x {P}) = {job / (2 * P):.6g}"
assert r["devices"] == 2, r
assert close(r["tflops_job"], job) and close(r["tflops"], r["tflops_job"] / 2), r
assert close(r["mfu"], r["tflops_job"] / (2 * P)), r
assert r["watts"] is None and r["joules_per_token"] is None and r["tflops_per_watt"] is None, r
print("bench np 2: devices 2, mfu = tflops_job / (2 x P), tflops = tflops_job / 2")
PY
echo "PASS"
