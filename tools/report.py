#!/usr/bin/env python3
# tools/report.py -- `kiln report RUN.jsonl [MORE.jsonl ...] --out report.png`: a picture of one
# or more runs from their JSONL logs (the `kiln train --log-json` contract, README "Training").
#
# Six panels against the step (or, with --x, the tokens seen or the wall time, so runs of
# different batch sizes or speeds compare): training loss (and validation loss, dashed, where
# there are eval records), tokens/s, MFU (or TFLOP/s per device where no peak is known), peak
# memory, the learning rate (the loss scale instead when a run is fp16, the only precision whose
# scale moves), and the gradient norm. Throughput is noisy step to step: its panels draw a moving
# mean over --smooth steps (default 5) over the raw values, faint. Several runs are overlaid, each
# labelled by its file name and layout (ranks, dp x tp x pp, ZeRO stage, precision) in one
# legend below the panels (it once sat on the loss curves), so a 1-rank and a 4-rank run of the
# same job can be compared line on line. A log that holds a resumed run repeats the steps it replayed
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
    precision = None
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
    return label, steps, evals, precision


# --x: what the horizontal axis counts, read from each step record (an eval record is placed at
# its step's value).
X_AXES = {"step": ("step", "step"), "tokens": ("tokens_seen", "tokens seen"), "time": ("elapsed_s", "wall time (s)")}


def series(records, key, steps, x="step"):
    """(xs, ys): the finite values of `key` in `records` (by step), against --x read from `steps`."""
    field = X_AXES[x][0]
    xs, ys = [], []
    for s in sorted(records):
        v = records[s].get(key)
        at = s if x == "step" else (steps.get(s) or {}).get(field)
        if isinstance(v, (int, float)) and math.isfinite(v) and isinstance(at, (int, float)):
            xs.append(at)
            ys.append(v)
    return xs, ys


def moving_mean(ys, window):
    """The mean of each value and the window - 1 before it (fewer at the start)."""
    out, total = [], 0.0
    for i, y in enumerate(ys):
        total += y
        if i >= window:
            total -= ys[i - window]
        out.append(total / min(i + 1, window))
    return out


def main():
    class OneLineParser(argparse.ArgumentParser):
        def error(self, message):  # one line, exit 2, as every kiln command
            die(f"kiln report: {message} (usage: kiln report RUN.jsonl [MORE.jsonl ...] --out report.png)")

    ap = OneLineParser(prog="kiln report", description="Plot kiln runs from their --log-json files.")
    ap.add_argument("logs", nargs="+", metavar="RUN.jsonl", help="one or more kiln --log-json files, overlaid")
    ap.add_argument("--out", required=True, metavar="PNG", help="the image to write (PNG)")
    ap.add_argument("--title", default=None, help="a title above the panels (default: the file names)")
    ap.add_argument("--x", default="step", choices=sorted(X_AXES), help="the horizontal axis: step, tokens seen, or wall time")
    ap.add_argument("--smooth", type=int, default=5, metavar="N", help="throughput panels: moving mean over N steps (1: none)")
    args = ap.parse_args()
    if args.smooth < 1:
        die(f"kiln report: --smooth {args.smooth}: give 1 (no smoothing) or more")
    if not args.out.lower().endswith(".png"):
        die(f"kiln report: --out {args.out}: give a .png file")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        die(f"kiln report needs matplotlib in {sys.executable} (bash launch/setup.sh installs it into .venv)")

    runs = [load(p) for p in args.logs]
    any_mfu = any(series(steps, "mfu", steps)[0] for _, steps, _, _ in runs)
    any_fp16 = any(precision == "fp16" for _, _, _, precision in runs)
    panels = [
        ("loss", "loss", "linear"),
        ("tokens_per_s", "tokens / s", "linear"),
        ("mfu", "MFU (%)", "linear") if any_mfu else ("tflops", "model TFLOP/s per device", "linear"),
        ("mem_gb", "peak memory (GB)", "linear"),
        # fp32 and bf16 keep a scale of 1: a flat line; the schedule says more there.
        ("loss_scale", "loss scale (fp16)", "log") if any_fp16 else ("lr", "learning rate", "linear"),
        ("grad_norm", "gradient norm", "log"),
    ]
    smoothed = {"tokens_per_s", "mfu", "tflops"}
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5), dpi=100)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for (key, title, scale), ax in zip(panels, axes.flat):
        for i, (label, steps, evals, precision) in enumerate(runs):
            color = colors[i % len(colors)]
            if key == "loss_scale" and precision != "fp16":
                continue  # 1 throughout: nothing to see
            xs, ys = series(steps, key, steps, args.x)
            if key == "mfu":
                ys = [100.0 * y for y in ys]
            # Earlier runs drawn wider, so a run that matches another (parity) still shows beneath it.
            width = max(1.0, 3.0 - 0.8 * i)
            if key in smoothed and args.smooth > 1:
                ax.plot(xs, ys, color=color, linewidth=0.8, alpha=0.3)
                ys = moving_mean(ys, args.smooth)
            ax.plot(xs, ys, color=color, linewidth=width, label=label if key == "loss" else None)
            if key == "loss" and evals:
                ex, ey = series(evals, "val_loss", steps, args.x)
                ax.plot(ex, ey, color=color, linestyle="--", marker="o", markersize=3, label=f"{label}: val")
        if key in smoothed and args.smooth > 1:
            title += f" (mean of {args.smooth} steps)"
        ax.set_title(title)
        ax.set_xlabel(X_AXES[args.x][1])
        if args.x == "step":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_yscale(scale)
        ax.grid(True, alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    ncol = min(len(labels), 3)
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=9, frameon=False)
    fig.suptitle(args.title or ", ".join(os.path.basename(p) for p in args.logs))
    rows = (len(labels) + ncol - 1) // max(ncol, 1)
    fig.tight_layout(rect=(0, 0.025 * rows + 0.01, 1, 1))
    try:
        fig.savefig(args.out)
    except OSError as e:
        die(f"kiln report: cannot write {args.out}: {e.strerror}")
    counts = ", ".join(str(len(steps)) for _, steps, _, _ in runs)
    print(f"kiln report: {len(runs)} run(s) ({counts} steps) -> {args.out}")


if __name__ == "__main__":
    main()
