# tests/cli/zero_expect.py -- what a ZeRO run must report, worked out independently of the
# engine from the model shape (parallel/zero.h's table), and the comparison both ZeRO tests use.
import json, math

ALIGN = 64  # shard alignment, elements


def units(c):
    """Parameter count of each unit: 0 = wte, wpe, ln_f; 1 + i = block i (models/gpt_config.h)."""
    d, T, Vp, L = c["d_model"], c["seq_len"], c["padded_vocab_size"], c["n_layer"]
    kv = c["n_kv_head"] * (d // c["n_head"])
    outer = Vp * d + T * d + 2 * d
    block = 2 * d + d * (d + 2 * kv) + (d + 2 * kv) + d * d + d + 2 * d + d * 4 * d + 4 * d + 4 * d * d + d
    return [outer] + [block] * L


def padded(n, N):
    q = N * ALIGN
    return (n + q - 1) // q * q


def expected(config_record):
    """(model_state, comm_bytes per step) this run must report."""
    c = config_record["config"]
    N = config_record["world"]["dp"]
    stage, offload, accum, K = c["zero"], c["offload"], c["zero_accum"], c["grad_accum"]
    us = [padded(n, N) for n in units(c)]
    P = sum(us)  # psi'
    streamed = stage >= 2 and (accum == "reduce" or K == 1)
    dev = {"params": 0, "grads": 0, "optimizer": 0}
    host = dict(dev)
    if stage < 3:
        dev["params"] = 4 * P
    else:
        (host if offload == "all" else dev)["params"] = 4 * P // N
    if streamed:
        (host if offload == "all" else dev)["grads"] = 4 * P // N
    else:
        dev["grads"] = 4 * P
    if offload != "none" and not (offload == "all" and streamed):
        host["grads"] += 4 * P // N  # the reduced shard's host copy
    opt = host if offload != "none" else dev
    opt["optimizer"] = 8 * P // N + (4 * P // N if offload == "optimizer" else 0)
    verdict = 2 * 12  # all-reduce of [loss, flag, squared norm], counted twice (distributed/comm.h)
    rs = (K if streamed else 1) * 4 * P
    if stage < 3:
        comm = rs + 4 * P + verdict
    else:
        # forward gathers every unit; backward every block but the last (kept from its forward)
        comm = K * (4 * P + 4 * (P - us[0] - us[-1])) + rs + verdict
    # fp32 runs: no autocast, so no cast copies (the device's alone; parallel/zero.h's ModelStateBytes)
    assert c["precision"] == "fp32", "zero_expect models fp32 runs"
    dev["cast_copies"] = 0
    return {"device": dev, "host": host}, comm


def load(path):
    return [json.loads(l) for l in open(path)]


def steps(records):
    return {r["step"]: r for r in records if r["type"] == "step"}


def compare(ref, run, name, tol, first=1):
    """Losses and gradient norms of steps >= first and the final weights' fingerprint, relative."""
    rel = lambda a, b: abs(a - b) / max(abs(a), 1e-30)
    sr, ss = steps(ref), steps(run)
    worst = 0.0
    for s in sorted(ss):
        if s < first:
            continue
        for key in ("loss", "grad_norm"):
            e = rel(sr[s][key], ss[s][key])
            worst = max(worst, e)
            assert e <= tol, (name, s, key, sr[s][key], ss[s][key])
    for key in ("param_sum", "param_sq"):
        e = rel(ref[-1][key], run[-1][key])
        worst = max(worst, e)
        assert e <= tol, (name, key, ref[-1][key], run[-1][key])
    return worst


def safetensors(path):
    """{name: list of floats} of an F32 safetensors file (no numpy needed)."""
    import struct, array
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", (name, t["dtype"])
        a, b = t["data_offsets"]
        arr = array.array("f")
        arr.frombytes(data[a:b])
        out[name] = arr
    return out


def max_weight_diff(a_path, b_path):
    a, b = safetensors(a_path), safetensors(b_path)
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    return max(max(abs(x - y) for x, y in zip(a[k], b[k])) for k in a)


def check_resumed(ref, d, name, first, last, ref_dir, tol=1e-5):
    """A run resumed from a checkpoint: it logged steps first..last, each within tol of the
    reference's, and its step-`last` weights (in d/name) within tol of the reference's (ref_dir)."""
    run = load(f"{d}/{name}.jsonl")
    assert sorted(steps(run)) == list(range(first, last + 1)) and run[0]["resumed_from"], name
    worst = compare(ref, run, name, tol, first=first)
    wd = max_weight_diff(f"{ref_dir}/step_{last:08d}/model.safetensors", f"{d}/{name}/step_{last:08d}/model.safetensors")
    assert wd <= tol, (name, wd)
    print(f"{name}: resumed, steps {first}-{last} within {worst:.1e}; step-{last} weights within {wd:.1e}")


def plan_reports(path, d, names):
    """One `kiln plan --compare A.jsonl --compare B.jsonl ... --json` call's output at `path`: a list
    of reports in the order of its --compare flags. Checks that order against `names` (the logs'
    file names without .jsonl), writes each report to d/NAME.cmp.json (what one call per log wrote)
    and returns them by name."""
    import os
    docs = json.load(open(path))
    docs = docs if isinstance(docs, list) else [docs]  # one --compare: one report
    assert [os.path.basename(c["log"]) for c in docs] == [f"{n}.jsonl" for n in names], [c["log"] for c in docs]
    for name, c in zip(names, docs):
        json.dump(c, open(os.path.join(d, f"{name}.cmp.json"), "w"))
    return dict(zip(names, docs))


def check_plan_compare(path, name, comm_exact=True):
    """`kiln plan --compare --json`'s output at `path`: every exact row equal, and (comm_exact)
    comm_bytes as predicted -- with --ep the all-to-alls' rows are an estimate, left out. Returns
    the words to print."""
    cmp = json.load(open(path))
    rows = {r["name"]: r for r in cmp["rows"]}
    assert cmp["exact_ok"], (name, [r for r in cmp["rows"] if r["exact"] and r["equal"] is False])
    if not comm_exact:
        return "plan --compare: exact rows equal"
    comm = rows["comm_bytes"]
    assert comm["measured"] == comm["predicted"], (name, comm)
    return f"plan --compare exact, comm_bytes {comm['measured']:.0f}"
