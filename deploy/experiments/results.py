#!/usr/bin/env python3
"""Collects one experiment's measurements into OUT/results.json and
OUT/results.csv (a header and one row; --csv also appends the row to a
file shared by several runs). Called by run.sh once the workers are done;
standard library only.

Inputs in OUT: report-wN.json (the workers' --report), bytes_before and
bytes_after ("host tx_bytes rx_bytes" of each host's eth0), cpu_before and
cpu_after (the first line of /proc/stat).

Definitions:
  window_s              from just before the workers start to just after the
                        last one exits (includes their start-up and
                        registration, so utilisation is a lower bound)
  tx/rx_utilisation     bytes x 8 / (window_s x rate), per host and
                        direction; null when unshaped
  cpu_busy              1 - (idle + iowait) / total over the window, all cores
  cpu_bound             cpu_busy > 0.9: the machine's CPUs, not the emulated
                        links, may have limited the run
"""

import argparse
import csv
import json
import os
import re
import sys

UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
CPU_BOUND = 0.9


def rate_bps(rate):
    m = re.fullmatch(r"(\d+)(bit|kbit|mbit|gbit)", rate)
    return int(m.group(1)) * UNITS[m.group(2)] if m else None


def read_bytes(path):
    out = {}
    with open(path) as f:
        for line in f:
            host, tx, rx = line.split()
            out[host] = (int(tx), int(rx))
    return out


def read_cpu(path):
    with open(path) as f:
        fields = f.readline().split()
    assert fields[0] == "cpu", path
    values = [int(v) for v in fields[1:]]
    # user nice system idle iowait irq softirq steal (guest time is inside user)
    total = sum(values[:8])
    idle = values[3] + values[4]
    return total, idle


def main():
    p = argparse.ArgumentParser()
    for name in ("out", "prefix", "rate", "delay_method", "model", "dataset", "subnet"):
        p.add_argument("--" + name, required=True)
    for name in ("workers", "delay", "batch_size", "epochs", "max_steps", "window_ns"):
        p.add_argument("--" + name, required=True, type=int)
    p.add_argument("--csv", default="")
    a = p.parse_args()

    reports = []
    for r in range(a.workers):
        path = os.path.join(a.out, f"report-w{r}.json")
        try:
            with open(path) as f:
                reports.append(json.load(f))
        except (OSError, ValueError) as e:
            sys.exit(f"results: cannot read {path}: {e}")
    window_s = a.window_ns / 1e9
    bps = rate_bps(a.rate)

    before, after = (read_bytes(os.path.join(a.out, n)) for n in ("bytes_before", "bytes_after"))
    hosts = []
    for i, host in enumerate(before):
        tx = after[host][0] - before[host][0]
        rx = after[host][1] - before[host][1]
        hosts.append({
            "host": host,
            "address": f"{a.subnet}.{i + 2}",
            "tx_bytes": tx,
            "rx_bytes": rx,
            "tx_utilisation": tx * 8 / (window_s * bps) if bps else None,
            "rx_utilisation": rx * 8 / (window_s * bps) if bps else None,
        })
    (t0, i0), (t1, i1) = (read_cpu(os.path.join(a.out, n)) for n in ("cpu_before", "cpu_after"))
    cpu_busy = 1 - (i1 - i0) / max(1, t1 - t0)
    utilisations = [h[k] for h in hosts for k in ("tx_utilisation", "rx_utilisation")
                    if h[k] is not None]

    split = reports[0]["time_split"]
    split_total = sum(split.values())
    results = {
        "run": a.prefix,
        "workers": a.workers,
        "rate": a.rate,
        "rate_bits_per_second": bps,
        "delay_ms": a.delay,
        "delay_method": a.delay_method,
        "model": a.model,
        "dataset": a.dataset,
        "global_batch_size": a.batch_size,
        "epochs": a.epochs,
        "max_steps": a.max_steps,
        "steps": reports[0]["steps"],
        "model_parameters": reports[0]["model_parameters"],
        "samples_per_second": reports[0]["global_samples_per_second"],
        "worker_samples_per_second": [r["samples_per_second"] for r in reports],
        "time_split_s": split,
        "time_split_fraction": {k: v / split_total if split_total else 0 for k, v in split.items()},
        "window_s": window_s,
        "hosts": hosts,
        "max_link_utilisation": max(utilisations) if utilisations else None,
        "cpu_busy": cpu_busy,
        "cpu_bound": cpu_busy > CPU_BOUND,
        "trace": os.path.join(a.out, "trace.json"),
    }
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")

    # One flat row: scalars, the split as fractions, each host's bytes and
    # utilisation.
    row = {k: v for k, v in results.items() if not isinstance(v, (dict, list))}
    for k, v in results["time_split_fraction"].items():
        row[f"split_{k[:-2]}"] = round(v, 4)
    for h in hosts:
        for k in ("tx_bytes", "rx_bytes", "tx_utilisation", "rx_utilisation"):
            row[f"{h['host']}_{k}"] = h[k]
    with open(os.path.join(a.out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        w.writeheader()
        w.writerow(row)
    if a.csv:
        new = not os.path.exists(a.csv) or os.path.getsize(a.csv) == 0
        with open(a.csv, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(row))
            if new:
                w.writeheader()
            w.writerow(row)

    util = (f"max link utilisation {results['max_link_utilisation']:.2f}"
            if bps else "unshaped links")
    print(f"run: {results['samples_per_second']:.0f} samples/s, {util}, "
          f"CPU {100 * cpu_busy:.0f}% busy{' (CPU-bound)' if results['cpu_bound'] else ''}; "
          f"worker 0: " + ", ".join(f"{k[:-2]} {100 * v:.0f}%"
                                    for k, v in results["time_split_fraction"].items()))
    print(f"run: results in {a.out}/results.json, results.csv; timeline {a.out}/trace.json")


if __name__ == "__main__":
    main()
