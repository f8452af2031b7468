"""The exact rows of `kiln plan --compare --json` (plan/compare.h): every model-state kind on the
device and the host (cast_copies on the device alone) and comm_bytes equal what the run reported.
Usage: compare_exact.py RUN.cmp.json NAME"""
import json
import sys

c = json.load(open(sys.argv[1]))
rows = {r["name"]: r for r in c["rows"]}
names = [f"model_state.{p}.{k}" for p in ("device", "host") for k in ("params", "grads", "optimizer")]
for name in names + ["model_state.device.cast_copies"]:
    r = rows[name]
    assert r["equal"] and r["measured"] == r["predicted"], r
comm = rows["comm_bytes"]
assert comm["measured"] == comm["predicted"] and comm["equal"], comm
assert c["exact_ok"], [r for r in c["rows"] if r["exact"] and r["equal"] is False]
print(f"kiln plan --compare {sys.argv[2]}: model state and comm_bytes ({comm['measured']}) exact")
