#!/usr/bin/env python3
"""Plots of a sweep (sweep.py's OUT/sweep.json and model.py's OUT/model.json)
into OUT: speedup.png, breakdown.png, utilisation.png. Matplotlib's Agg
backend (no display; Debian's python3-matplotlib, packages.sh).

    python3 deploy/experiments/plot.py OUT

  speedup.png      samples/s of W workers over those of one (the step-time
                   ratio when the global batch is fixed), a panel per model
                   and compute mode, a line per link rate, delay and shard
                   count: measured points (hollow where the run was
                   CPU-bound) and the analytic model's prediction (dashed)
  breakdown.png    worker 0's milliseconds per step, stacked: compute (data,
                   forward/backward, reduce, copies), push, wait, pull, and
                   the rest of the measured step; | marks the model's
                   prediction; * marks CPU-bound runs
  utilisation.png  the server's link (received, sent) and the busiest
                   worker link over the measured window, and the server's
                   busier direction while it carried traffic (the sample
                   intervals above half the rate: its communication
                   phases), shaped runs only
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"100mbit": "tab:red", "1gbit": "tab:blue", "10gbit": "tab:purple", "unshaped": "tab:green"}
DPI = 72


def color(rate):
    return COLORS.get(rate, "tab:gray")


def label(r):
    star = " *" if r["row"]["cpu_bound"] in (True, "True") else ""
    delay = f" {r['delay_ms']}ms" if r["delay_ms"] else ""
    servers = f" S={r['servers']}" if r.get("servers", 1) != 1 else ""
    return f"W={r['workers']}{servers} {r['rate']}{delay}{star}"


def panel(r):
    """One panel per model, compute mode and batch rule."""
    name = r["model"]
    if r["row"].get("compute", "real") != "real":
        name += " replayed"
    if r.get("batch_per_worker"):
        name += f", {r['batch_per_worker']}/worker"
    return name


def by_model(runs):
    panels = []
    for r in runs:
        if panel(r) not in panels:
            panels.append(panel(r))
    return [(m, [r for r in runs if panel(r) == m]) for m in panels]


def series(r):
    """The runs one speed-up line joins: all but the workers alike."""
    return (r["rate"], r["delay_ms"], r.get("servers", 1), r.get("overlap", "on"))


def series_name(key):
    rate, delay, servers, overlap = key
    return (rate + (f" {delay}ms" if delay else "") + (f" S={servers}" if servers != 1 else "")
            + ("" if overlap == "on" else " no overlap"))


def speedup(runs, predictions, path):
    """Samples/s of W workers over those of one worker on one server (the
    same as the step-time ratio when the global batch is fixed; with a batch
    per worker, what weak scaling gains)."""
    groups = by_model(runs)
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 3.8), squeeze=False)
    pred_by_config = {p["config"]: p["predicted_step_s"] for p in predictions}
    for ax, (m, rs) in zip(axes[0], groups):
        most = max(r["workers"] for r in rs)
        ax.plot([1, most], [1, most], ":", color="gray", label="linear")
        styles = ["-", "-.", "--", ":"]
        for i, key in enumerate(dict.fromkeys(series(r) for r in rs)):
            line = sorted((r for r in rs if series(r) == key), key=lambda r: r["workers"])
            # One worker on one server is every line's baseline (a shard
            # line's own single worker gains nothing from more shards, and
            # replayed passes differ a little from run to run).
            base = ([r for r in rs if r["workers"] == 1 and series(r)[:2] == key[:2]
                     and series(r)[3] == key[3] and r.get("servers", 1) == 1]
                    or [r for r in line if r["workers"] == 1])
            if not base:
                continue
            b = base[0]
            c = color(key[0]) if len({k[2] for k in map(series, rs)}) == 1 else f"C{i}"

            def gain(steps, r, b=b):
                # samples/s ratio: batch ratio x step-time ratio
                return (r["row"]["batch_size"] / b["row"]["batch_size"]
                        * steps[b["config"]] / steps[r["config"]])

            measured = {r["config"]: r["row"]["step_time_s"] for r in line + [b]}
            xs = [r["workers"] for r in line]
            ys = [gain(measured, r) for r in line]
            ax.plot(xs, ys, "-", color=c, alpha=0.5)
            for r, x, y in zip(line, xs, ys):
                bound = r["row"]["cpu_bound"] in (True, "True")
                ax.plot([x], [y], "o", color=c, markerfacecolor="none" if bound else c)
            ax.plot([], [], "o-", color=c, label=f"{series_name(key)} measured")
            if all(r["config"] in pred_by_config for r in line + [b]):
                ax.plot(xs, [gain(pred_by_config, r) for r in line], "--", color=c,
                        label=f"{series_name(key)} model")
        ax.set_title(f"{m} (hollow: CPU-bound)", fontsize=9)
        ax.set_xlabel("workers")
        ax.set_ylabel("samples/s over 1 worker's")
        ax.set_xticks(sorted({r["workers"] for r in rs}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def breakdown(runs, predictions, path):
    groups = by_model(runs)
    parts = [("compute_s", "compute", "tab:gray"), ("push_s", "push", "tab:orange"),
             ("wait_s", "wait", "tab:purple"), ("pull_s", "pull", "tab:cyan"),
             ("other_s", "other", "white")]
    pred = {p["config"]: p["predicted_step_s"] for p in predictions}
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 0.3 * max(
        len(rs) for _, rs in groups) + 1.5), squeeze=False)
    for ax, (m, rs) in zip(axes[0], groups):
        ys = range(len(rs))
        left = [0.0] * len(rs)
        for key, name, c in parts:
            widths = [1000 * r["row"][key] for r in rs]
            ax.barh(ys, widths, left=left, color=c, edgecolor="black", linewidth=0.3, label=name)
            left = [a + b for a, b in zip(left, widths)]
        for y, r in zip(ys, rs):
            if r["config"] in pred:
                ax.plot([1000 * pred[r["config"]]], [y], "|", color="black", markersize=12)
        ax.plot([], [], "|", color="black", markersize=10, label="model")
        ax.set_yticks(list(ys))
        ax.set_yticklabels([label(r) for r in rs], fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log" if max(left) > 50 * min(left) else "linear")
        ax.set_xlabel("ms per step (worker 0)")
        ax.set_title(f"{m} (* CPU-bound)")
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def utilisation(runs, path):
    groups = [(m, [r for r in rs if r["rate"] != "unshaped"]) for m, rs in by_model(runs)]
    groups = [(m, rs) for m, rs in groups if rs]
    if not groups:
        groups = [("no shaped runs", [])]
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 3.5), squeeze=False)
    bars = [("server_rx_utilisation", "server received", "tab:blue"),
            ("server_tx_utilisation", "server sent", "tab:orange"),
            ("worker_max_utilisation", "busiest worker", "tab:green"),
            ("server_busy_utilisation", "server, while busy", "tab:gray")]
    width = 0.8 / len(bars)
    for ax, (m, rs) in zip(axes[0], groups):
        for i, (key, name, c) in enumerate(bars):
            xs = [j + (i - (len(bars) - 1) / 2) * width for j in range(len(rs))]
            ax.bar(xs, [float(r["row"].get(key) or 0) for r in rs], width=width, color=c,
                   label=name)
        ax.set_xticks(range(len(rs)))
        ax.set_xticklabels([label(r) for r in rs], rotation=30, ha="right", fontsize=7)
        ax.set_ylim(0, 1.1)
        ax.axhline(1, color="gray", linestyle=":")
        ax.set_ylabel("link utilisation (training window)")
        ax.set_title(f"{m} (* CPU-bound)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def main(argv):
    if len(argv) != 1:
        sys.exit("usage: plot.py OUT  (OUT/sweep.json, OUT/model.json)")
    out = argv[0]
    with open(os.path.join(out, "sweep.json")) as f:
        runs = [r for r in json.load(f)["runs"] if "row" in r]
    with open(os.path.join(out, "model.json")) as f:
        predictions = json.load(f)["rows"]
    if not runs:
        sys.exit("plot: no finished runs in sweep.json")
    speedup(runs, predictions, os.path.join(out, "speedup.png"))
    breakdown(runs, predictions, os.path.join(out, "breakdown.png"))
    utilisation(runs, os.path.join(out, "utilisation.png"))
    print(f"plot: {out}/speedup.png, breakdown.png, utilisation.png")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
