"""The exact rows of `kiln plan --compare --json` (plan/compare.h): every model-state kind on the
device and the host (cast_copies on the device alone) and comm_bytes equal what each run reported.
Usage: compare_exact.py CMP.json NAME...  -- CMP.json: one `kiln plan --compare NAME.jsonl ... --json`
call's output, its reports in the order of the NAMEs."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zero_expect import plan_reports

path, names = sys.argv[1], sys.argv[2:]
kinds = [f"model_state.{p}.{k}" for p in ("device", "host") for k in ("params", "grads", "optimizer")]
for name, c in plan_reports(path, os.path.dirname(path) or ".", names).items():
    rows = {r["name"]: r for r in c["rows"]}
    for kind in kinds + ["model_state.device.cast_copies"]:
        r = rows[kind]
        assert r["equal"] and r["measured"] == r["predicted"], (name, r)
    comm = rows["comm_bytes"]
    assert comm["measured"] == comm["predicted"] and comm["equal"], (name, comm)
    assert c["exact_ok"], (name, [r for r in c["rows"] if r["exact"] and r["equal"] is False])
    print(f"kiln plan --compare {name}: model state and comm_bytes ({comm['measured']}) exact")
