#!/usr/bin/env python3
"""Plots of a sweep (sweep.py's OUT/sweep.json and model.py's OUT/model.json)
into OUT: speedup.png, breakdown.png, utilisation.png. Matplotlib's Agg
backend (no display; Debian's python3-matplotlib, packages.sh).

    python3 deploy/experiments/plot.py OUT

  speedup.png      step time of 1 worker / step time of W workers (global batch
                   fixed, so samples/s scale the same), per model and link
                   rate: measured points (hollow where the run was CPU-bound)
                   and the analytic model's stop-and-wait prediction (dashed)
  breakdown.png    worker 0's milliseconds per step, stacked: compute (data,
                   forward/backward, reduce, copies), push, wait, pull, and
                   the rest of the measured step; | marks the model's
                   prediction; * marks CPU-bound runs
  utilisation.png  the server's link (received, sent) and the busiest
                   worker link over the measured window, shaped runs only
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"100mbit": "tab:red", "1gbit": "tab:blue", "unshaped": "tab:green"}
DPI = 72


def color(rate):
    return COLORS.get(rate, "tab:gray")


def label(r):
    star = " *" if r["row"]["cpu_bound"] in (True, "True") else ""
    delay = f" {r['delay_ms']}ms" if r["delay_ms"] else ""
    return f"W={r['workers']} {r['rate']}{delay}{star}"


def by_model(runs):
    models = []
    for r in runs:
        if r["model"] not in models:
            models.append(r["model"])
    return [(m, [r for r in runs if r["model"] == m]) for m in models]


def speedup(runs, predictions, path):
    groups = by_model(runs)
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 3.8), squeeze=False)
    for ax, (m, rs) in zip(axes[0], groups):
        most = max(r["workers"] for r in rs)
        ax.plot([1, most], [1, most], ":", color="gray", label="linear")
        for rate in dict.fromkeys(r["rate"] for r in rs):
            for delay in dict.fromkeys(r["delay_ms"] for r in rs if r["rate"] == rate):
                line = sorted((r for r in rs if r["rate"] == rate and r["delay_ms"] == delay),
                              key=lambda r: r["workers"])
                base = [r for r in line if r["workers"] == 1]
                if not base:
                    continue
                t1 = base[0]["row"]["step_time_s"]
                name = rate + (f" {delay}ms" if delay else "")
                xs = [r["workers"] for r in line]
                ys = [t1 / r["row"]["step_time_s"] for r in line]
                ax.plot(xs, ys, "-", color=color(rate), alpha=0.5)
                for r, x, y in zip(line, xs, ys):
                    bound = r["row"]["cpu_bound"] in (True, "True")
                    ax.plot([x], [y], "o", color=color(rate),
                            markerfacecolor="none" if bound else color(rate))
                ax.plot([], [], "o-", color=color(rate), label=f"{name} measured")
                pred = {p["workers"]: p["predicted_step_s"] for p in predictions
                        if p["model"] == m and p["rate"] == rate and p["delay_ms"] == delay}
                if 1 in pred:
                    pxs = sorted(pred)
                    ax.plot(pxs, [pred[1] / pred[x] for x in pxs], "--", color=color(rate),
                            label=f"{name} model")
        ax.set_title(f"{m} (hollow: CPU-bound)")
        ax.set_xlabel("workers")
        ax.set_ylabel("speed-up over 1 worker")
        ax.set_xticks(sorted({r["workers"] for r in rs}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
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
            ("worker_max_utilisation", "busiest worker", "tab:green")]
    for ax, (m, rs) in zip(axes[0], groups):
        for i, (key, name, c) in enumerate(bars):
            xs = [j + (i - 1) * 0.27 for j in range(len(rs))]
            ax.bar(xs, [float(r["row"][key] or 0) for r in rs], width=0.27, color=c, label=name)
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
