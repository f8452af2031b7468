#!/usr/bin/env python3
# tools/report.py -- `kiln report RUN.jsonl [MORE.jsonl ...] --out report.png`: a picture of one
# or more runs from their JSONL logs (the `kiln train --log-json` contract, README "Training").
#
# Six panels against the step: training loss (and validation loss, dashed, where there are
# eval records), tokens/s, MFU (or TFLOP/s per device where no peak is known), peak memory, the
# loss scale, and the gradient norm. Several runs are overlaid, each labelled by its file name and
# layout (ranks, dp x tp x pp, ZeRO stage, precision), so a 1-rank and a 4-rank run of the same
# job can be compared line on line. A log that holds a resumed run repeats the steps it replayed
# (after the config record of the resume): each step is drawn once, from its last record.
#
# Bad input (a missing file, a file with no step records, not JSON) gets one line on stderr and
# exit 2. Needs matplotlib (launch/setup.sh installs it into the project's .venv).
import argparse
import json
import math
import os
import sys


def die(message):
    print(f"kiln: error: {message}", file=sys.stderr)
    sys.exit(2)


def load(path):
    """(label, steps, evals): steps and evals as dicts by step number, the last record winning."""
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        die(f"kiln report: cannot read {path}: {e.strerror}")
    config, steps, evals = None, {}, {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            die(f"kiln report: {path}, line {n}: not JSON (is it a kiln --log-json file?)")
        kind = rec.get("type")
        if kind == "config" and config is None:
            config = rec
        elif kind == "step":
            steps[rec["step"]] = rec
        elif kind == "eval":
            evals[rec["step"]] = rec
    if not steps:
        die(f"kiln report: {path} has no step records (is it a kiln --log-json file of a run that trained?)")
    label = os.path.basename(path)
    if label.endswith(".jsonl"):
        label = label[: -len(".jsonl")]
    if config:
        world = config.get("world") or {}
        parts = [f"{world.get('size', 1)} rank(s)"]
        if world.get("size", 1) > 1:
            parts.append(f"dp {world.get('dp', 1)} tp {world.get('tp', 1)} pp {world.get('pp', 1)}")
        zero = (config.get("zero") or {}).get("stage")
        if zero:
            parts.append(f"ZeRO-{zero}")
        precision = (config.get("config") or {}).get("precision")
        if precision:
            parts.append(precision)
        label += " (" + ", ".join(parts) + ")"
    return label, steps, evals


def series(steps, key):
    xs, ys = [], []
    for s in sorted(steps):
        v = steps[s].get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            xs.append(s)
            ys.append(v)
    return xs, ys


def main():
    class OneLineParser(argparse.ArgumentParser):
        def error(self, message):  # one line, exit 2, as every kiln command
            die(f"kiln report: {message} (usage: kiln report RUN.jsonl [MORE.jsonl ...] --out report.png)")

    ap = OneLineParser(prog="kiln report", description="Plot kiln runs from their --log-json files.")
    ap.add_argument("logs", nargs="+", metavar="RUN.jsonl", help="one or more kiln --log-json files, overlaid")
    ap.add_argument("--out", required=True, metavar="PNG", help="the image to write (PNG)")
    ap.add_argument("--title", default=None, help="a title above the panels (default: the file names)")
    args = ap.parse_args()
    if not args.out.lower().endswith(".png"):
        die(f"kiln report: --out {args.out}: give a .png file")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        die(f"kiln report needs matplotlib in {sys.executable} (bash launch/setup.sh installs it into .venv)")

    runs = [load(p) for p in args.logs]
    any_mfu = any(series(steps, "mfu")[0] for _, steps, _ in runs)
    scales = [v for _, steps, _ in runs for v in series(steps, "loss_scale")[1] if v > 0]
    wide_scale = bool(scales) and max(scales) > 10 * min(scales)  # fp16's scale moves by powers of 2
    panels = [
        ("loss", "loss", "linear"),
        ("tokens_per_s", "tokens / s", "linear"),
        ("mfu", "MFU (%)", "linear") if any_mfu else ("tflops", "model TFLOP/s per device", "linear"),
        ("mem_gb", "peak memory (GB)", "linear"),
        ("loss_scale", "loss scale", "log" if wide_scale else "linear"),
        ("grad_norm", "gradient norm", "log"),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5), dpi=100)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for (key, title, scale), ax in zip(panels, axes.flat):
        for i, (label, steps, evals) in enumerate(runs):
            color = colors[i % len(colors)]
            xs, ys = series(steps, key)
            if key == "mfu":
                ys = [100.0 * y for y in ys]
            # Earlier runs drawn wider, so a run that matches another (parity) still shows beneath it.
            ax.plot(xs, ys, color=color, linewidth=max(1.0, 3.0 - 0.8 * i), label=label)
            if key == "loss" and evals:
                ex, ey = series(evals, "val_loss")
                ax.plot(ex, ey, color=color, linestyle="--", marker="o", markersize=3, label=f"{label}: val")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_yscale(scale)
        ax.grid(True, alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(args.title or ", ".join(os.path.basename(p) for p in args.logs))
    fig.tight_layout()
    try:
        fig.savefig(args.out)
    except OSError as e:
        die(f"kiln report: cannot write {args.out}: {e.strerror}")
    counts = ", ".join(str(len(steps)) for _, steps, _ in runs)
    print(f"kiln report: {len(runs)} run(s) ({counts} steps) -> {args.out}")


if __name__ == "__main__":
    main()
