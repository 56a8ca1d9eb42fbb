#!/usr/bin/env python3
"""Collects one experiment's measurements into OUT/results.json and
OUT/results.csv (a header and one row; --csv also appends the row to a
file shared by several runs). Called by run.sh once the workers are done;
standard library only.

Inputs in OUT: report-wN.json (the workers' --report), trace-w0.json
(worker 0's timeline: when each step ran) and counters.txt (counters.py:
every host link's bytes and the machine's CPU, sampled every few ms on
the same clock as the trace).

Definitions:
  window_s              worker 0's training steps after the first
                        --warmup_steps: from the sample at or before the
                        start of step W to the sample at or after the start
                        of its last step (window_steps = the periods between) (at most one sampling period wider on
                        each side); the start-up, data loading and
                        registration are outside it
  step_time_s           worker 0's seconds per step over the same steps
                        (trace: start of step W to end of the last step,
                        divided by the steps); step_time_median_s the
                        median of those steps' periods (start to next start)
  system                "ps" (ours: S server hosts, workers push and pull)
                        or "ddp" (run.sh --system=ddp: PyTorch DDP's ring
                        all-reduce among the W worker hosts, no servers)
  tx/rx_bytes           each host's bytes sent and received in the window,
                        as its veth counts them (/proc/net/dev): a GSO
                        packet's headers once per up to 64 KiB, so about the
                        TCP payload; tbf counts every 1,500-byte frame's
                        headers, so these bytes reach at most 1448 / 1514 =
                        0.956 of the rate (measured: iperf3 955.8 Mbit/s
                        through a 1 Gbit/s link, its veth 955.0, its tbf
                        997.5)
  tx/rx_busy_utilisation  the same over the window's sample intervals in
                        which that direction ran above half the rate (its
                        communication phases); tx/rx_busy_fraction: their
                        share of the window
  tx/rx_utilisation     bytes x 8 / (window_s x rate), per host and
                        direction; null when unshaped
  max_link_utilisation  the busiest host and direction's tx/rx_utilisation
                        (busiest_link names it, e.g. "s0 tx")
  payload_bound_s       the least step time the links allow the tensors'
                        bytes alone: for "ps", max(M, W x M / S) x 8 / rate
                        for M model bytes (a worker sends M a step, a server
                        receives W x M / S; the same back, full duplex); for
                        "ddp", 2 (W - 1) / W x M x 8 / rate (the ring: every
                        worker sends and receives that much); null unshaped
                        or where nothing crosses a link (a ring of one)
  link_bound_s          the same in the frames that carry them, as tbf
                        counts them: payload_bound_s x 1514 / 1448
                        (model.py's WIRE: Ethernet, IP and TCP headers per
                        full segment at MTU 1500); a model of a few
                        tbf buckets (4 ms at the rate, at least 128 KiB,
                        passed at the veth's own speed after an idle
                        spell) can beat it
  step_over_link_bound  step_time_s / link_bound_s; step_over_payload_bound
                        step_time_s / payload_bound_s
  tcp_retransmitted_segments, tcp_timeouts
                        per host, over the whole run (nstat's
                        TcpRetransSegs and TcpExtTCPTimeouts in its
                        namespace; null where not recorded): the TCP loss
                        recovery after drops at a link's queue
  cpu_busy              1 - (idle + iowait) / total over the window, all cores
  cpu_bound             cpu_busy > 0.9: the machine's CPUs, not the emulated
                        links, may have limited the run
"""

import argparse
import csv
import json
import os
import statistics
import sys

from model import WIRE, rate_bps, system_link_bytes

CPU_BOUND = 0.9


def read_counters(path):
    """counters.py's samples: [(monotonic_ns, cpu_total, cpu_idle, [rx0, tx0, ...])]."""
    samples = []
    with open(path) as f:
        for line in f:
            values = [int(v) for v in line.split()]
            if len(values) >= 3:
                samples.append((values[0], values[1], values[2], values[3:]))
    return samples


def training_span(trace_path, warmup_steps):
    """(start_ns, end_ns, steps, periods_s) of the trainer's steps >=
    warmup_steps in a worker's trace, on CLOCK_MONOTONIC: the first such
    step's start to the last one's, `steps` periods (one step alone: its own
    span), and each period in seconds; warm-up falls to 0 when the run has
    no more steps than that."""
    with open(trace_path) as f:
        doc = json.load(f)
    origin = doc["otherData"]["clock_origin_ns"]
    steps = {}
    for e in doc["traceEvents"]:
        step = (e.get("args") or {}).get("step", -1)
        if e.get("ph") != "X" or e.get("tid") != 0 or step < 0:
            continue
        begin, end = e["ts"], e["ts"] + e.get("dur", 0)
        lo, hi = steps.get(step, (begin, end))
        steps[step] = (min(lo, begin), max(hi, end))
    if not steps:
        raise ValueError(f"{trace_path}: no step events")
    first = warmup_steps if max(steps) >= warmup_steps else 0
    kept = sorted(span for step, span in steps.items() if step >= first)
    if len(kept) >= 2:
        # From the first kept step's start to the last one's: start to start
        # is a step's period whether or not communication overlaps compute
        # (overlapping, a step's events end with its backward while its pulls
        # are still in flight, and the last one ends draining them, so end to
        # end would hold a step's traffic too many).
        periods = [(b[0] - a[0]) / 1e6 for a, b in zip(kept, kept[1:])]
        return (origin + int(kept[0][0] * 1000), origin + int(kept[-1][0] * 1000),
                len(kept) - 1, periods)
    start_us, end_us = kept[0]
    return (origin + int(start_us * 1000), origin + int(end_us * 1000), 1,
            [(end_us - start_us) / 1e6])


def read_tcp(path):
    """run.sh's tcp-HOST.txt (nstat NAME VALUE lines) as a dict, {} if absent."""
    try:
        with open(path) as f:
            return {name: int(value) for name, value in (line.split() for line in f if line.strip())}
    except (OSError, ValueError):
        return {}


def bracket(samples, start_ns, end_ns):
    """The last sample at or before start_ns and the first at or after end_ns
    (the nearest ones where the samples do not reach that far)."""
    before = [s for s in samples if s[0] <= start_ns]
    after = [s for s in samples if s[0] >= end_ns]
    return (before[-1] if before else samples[0]), (after[0] if after else samples[-1])


BUSY = 0.5  # an interval counts as busy above this fraction of the rate


def busy(samples, start_ns, end_ns, index, bps):
    """(busy_utilisation, busy_fraction) of counter `index` over the window:
    the sample intervals inside it in which the link ran at more than BUSY
    of its rate (its communication phases), their bytes x 8 / (their time x
    rate), and their share of the window's time. (None, None) unshaped."""
    if not bps:
        return None, None
    inside = [s for s in samples if start_ns <= s[0] <= end_ns]
    busy_bytes = busy_ns = total_ns = 0
    for a, b in zip(inside, inside[1:]):
        dt = b[0] - a[0]
        if dt <= 0:
            continue
        moved = b[3][index] - a[3][index]
        total_ns += dt
        if moved * 8 > BUSY * bps * dt / 1e9:
            busy_bytes += moved
            busy_ns += dt
    if busy_ns == 0:
        return 0.0, 0.0
    return busy_bytes * 8 / (busy_ns / 1e9 * bps), busy_ns / total_ns


def append_row(path, row):
    """Appends `row` (a dict) to the CSV file at `path`, header first when
    the file is new. Runs with other hosts (W, S, or --system=ddp without
    server hosts) have other per-host columns: when the row has a column the
    header lacks, the file is rewritten with the header's columns followed
    by the new ones, earlier rows leaving those empty, so every row stays
    under its own names."""
    fields = []
    rows = []
    if os.path.exists(path) and os.path.getsize(path) > 0:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            fields = list(reader.fieldnames or [])
            missing = [k for k in row if k not in fields]
            if missing:
                rows = list(reader)
    else:
        missing = list(row)
    if fields and not missing:
        with open(path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=fields, restval="").writerow(row)
        return
    fields += missing
    with open(path + ".tmp", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, restval="")
        w.writeheader()
        w.writerows(rows)
        w.writerow(row)
    os.replace(path + ".tmp", path)


def main():
    p = argparse.ArgumentParser()
    for name in ("out", "prefix", "rate", "delay_method", "congestion", "model", "dataset",
                 "subnet", "compute"):
        p.add_argument("--" + name, required=True)
    for name in ("workers", "servers", "warmup_steps", "delay", "batch_size", "epochs",
                 "max_steps", "run_window_ns"):
        p.add_argument("--" + name, required=True, type=int)
    p.add_argument("--csv", default="")
    p.add_argument("--system", default="ps", choices=["ps", "ddp"])
    a = p.parse_args()

    reports = []
    for r in range(a.workers):
        path = os.path.join(a.out, f"report-w{r}.json")
        try:
            with open(path) as f:
                reports.append(json.load(f))
        except (OSError, ValueError) as e:
            sys.exit(f"results: cannot read {path}: {e}")
    bps = rate_bps(a.rate)
    try:
        start_ns, end_ns, window_steps, periods = training_span(os.path.join(a.out, "trace-w0.json"),
                                                       a.warmup_steps)
        samples = read_counters(os.path.join(a.out, "counters.txt"))
        if len(samples) < 2:
            raise ValueError("fewer than two counter samples")
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"results: cannot place the training window: {e}")
    s0, s1 = bracket(samples, start_ns, end_ns)
    window_s = (s1[0] - s0[0]) / 1e9
    names = [f"s{i}" for i in range(a.servers)] + [f"w{i}" for i in range(a.workers)]
    hosts = []
    for i, host in enumerate(names):
        # Host i's link ends on the bridge as vi: its sends are vi's receives.
        tx = s1[3][2 * i] - s0[3][2 * i]
        rx = s1[3][2 * i + 1] - s0[3][2 * i + 1]
        tx_busy, tx_busy_fraction = busy(samples, s0[0], s1[0], 2 * i, bps)
        rx_busy, rx_busy_fraction = busy(samples, s0[0], s1[0], 2 * i + 1, bps)
        tcp = read_tcp(os.path.join(a.out, f"tcp-{host}.txt"))
        hosts.append({
            "host": host,
            "address": f"{a.subnet}.{i + 2}",
            "tx_bytes": tx,
            "rx_bytes": rx,
            "tx_utilisation": tx * 8 / (window_s * bps) if bps else None,
            "rx_utilisation": rx * 8 / (window_s * bps) if bps else None,
            "tx_busy_utilisation": tx_busy,
            "rx_busy_utilisation": rx_busy,
            "tx_busy_fraction": tx_busy_fraction,
            "rx_busy_fraction": rx_busy_fraction,
            "tcp_retransmitted_segments": tcp.get("TcpRetransSegs"),
            "tcp_timeouts": tcp.get("TcpExtTCPTimeouts"),
        })
    cpu_busy = 1 - (s1[2] - s0[2]) / max(1, s1[1] - s0[1])
    links = [(h[f"{d}_utilisation"], f"{h['host']} {d}") for h in hosts for d in ("tx", "rx")
             if h[f"{d}_utilisation"] is not None]
    busiest_utilisation, busiest_link = max(links) if links else (None, None)
    step_time_s = (end_ns - start_ns) / 1e9 / window_steps
    model_bytes = 4 * reports[0]["model_parameters"]  # fp32 on the wire
    link_bytes = system_link_bytes(a.system, model_bytes, a.workers, a.servers)
    payload_bound_s = link_bytes * 8 / bps if bps and link_bytes else None
    link_bound_s = payload_bound_s * WIRE if payload_bound_s else None
    split = reports[0]["time_split"]
    split_total = sum(split.values())
    results = {
        "run": a.prefix,
        "system": a.system,
        "workers": a.workers,
        "servers": a.servers,
        "rate": a.rate,
        "rate_bits_per_second": bps,
        "delay_ms": a.delay,
        "delay_method": a.delay_method,
        "congestion": a.congestion,
        "model": a.model,
        "compute": a.compute,
        "replay_step_s": reports[0].get("replay_step_s", 0),
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
        "warmup_steps": a.warmup_steps,
        "window_steps": window_steps,
        "step_time_s": step_time_s,
        "step_time_median_s": statistics.median(periods),
        "model_bytes": model_bytes,
        "window_s": window_s,
        "run_window_s": a.run_window_ns / 1e9,
        "hosts": hosts,
        "max_link_utilisation": busiest_utilisation,
        "busiest_link": busiest_link,
        "link_bound_s": link_bound_s,
        "step_over_link_bound": step_time_s / link_bound_s if link_bound_s else None,
        "payload_bound_s": payload_bound_s,
        "step_over_payload_bound": step_time_s / payload_bound_s if payload_bound_s else None,
        "max_busy_utilisation": max(
            (h[k] for h in hosts for k in ("tx_busy_utilisation", "rx_busy_utilisation")
             if h[k] is not None), default=None),
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
        append_row(a.csv, row)

    util = (f"max link utilisation {results['max_link_utilisation']:.2f}"
            if bps else "unshaped links")
    print(f"run: {results['samples_per_second']:.0f} samples/s, {util}, "
          f"CPU {100 * cpu_busy:.0f}% busy{' (CPU-bound)' if results['cpu_bound'] else ''}; "
          f"worker 0: " + ", ".join(f"{k[:-2]} {100 * v:.0f}%"
                                    for k, v in results["time_split_fraction"].items()))
    if link_bound_s:
        print(f"run: {a.system}: step {step_time_s:.3f} s = {results['step_over_link_bound']:.3f} x what "
              f"the busiest link needs a step in frames ({link_bound_s:.3f} s), "
              f"{results['step_over_payload_bound']:.3f} x for the tensors' bytes alone "
              f"({payload_bound_s:.3f} s)")
    if any(h["tcp_retransmitted_segments"] is not None for h in hosts):
        print("run: TCP segments sent again (timeouts) over the run: " + ", ".join(
            f"{h['host']} {h['tcp_retransmitted_segments']} ({h['tcp_timeouts']})"
            for h in hosts))
    print(f"run: results in {a.out}/results.json, results.csv; timeline {a.out}/trace.json")


if __name__ == "__main__":
    main()
