"""Parity of a run with a reference run, from their JSONL logs (tests/cli/param_dtype_zero.sh,
upcast_parity.sh): the loss and the gradient norm of every step and the final weights'
fingerprint (param_sum, param_sq), each within a relative tolerance."""
import json


def load(name):
    return [json.loads(line) for line in open(f"{name}.jsonl")]


def steps(run):
    return [r for r in run if r["type"] == "step"]


def rel(a, b):
    return abs(a - b) / max(abs(a), 1e-30)


def check(ref, run, tol, label, n_steps=20):
    """ref, run: loaded logs; tol: {"loss", "grad_norm", "param"}. Asserts, prints the worst
    relative differences under `label`, and returns them."""
    assert len(steps(run)) == n_steps == len(steps(ref)), (label, len(steps(run)), len(steps(ref)))
    worst = {}
    for a, b in zip(steps(ref), steps(run)):
        for key in ("loss", "grad_norm"):
            worst[key] = max(worst.get(key, 0.0), rel(a[key], b[key]))
            assert rel(a[key], b[key]) <= tol[key], (label, a["step"], key, a[key], b[key])
    for key in ("param_sum", "param_sq"):
        worst["param"] = max(worst.get("param", 0.0), rel(ref[-1][key], run[-1][key]))
        assert rel(ref[-1][key], run[-1][key]) <= tol["param"], (label, key, ref[-1][key], run[-1][key])
    print(f"{label}: " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))
    return worst
