#!/usr/bin/env python3
"""The analytic alpha-beta model of a synchronous step, compared with a
sweep's measurements (sweep.py writes OUT/sweep.json):

    python3 deploy/experiments/model.py OUT      # OUT/model.json, OUT/model.csv, a table

Per step, W workers, S server shards, model bytes M, link rate R (each
host, each direction), one-way delay d:

  compute   c1 / W: the measured single-worker compute (data + compute +
            reduce + copy per step; the least over the W = 1 runs of the
            same model, compute mode and batch rule, the least disturbed)
            split over W workers of their own CPUs; c1 itself when the
            global batch grows with W (sweep.py --batch_per_worker: each
            worker's compute is fixed). Replayed compute (run.sh --compute=
            replay) is the run's own replay_step_s, the pass its workers
            sleep through. `shared` uses W x that instead: W workers on
            this machine's cores share them.
  push      2d + max(0, wire(max(M, W M / S)) - b) x 8 / R: every worker
            sends M, each server receives W M / S of it, so the busier end
            (a worker's uplink or a server's downlink) sets the time; one
            round trip for the acknowledgement. b is the tbf bucket of that
            link end (netns.sh: 4 ms at R, at least 128 KiB), full at the
            start of each transfer (it refills while the link is idle in
            the other phases), which passes at the veth's own speed.
  pull      the same the other way (a server's uplink carries W M / S).
  wire(B)   B x 1514 / 1448: Ethernet, IP and TCP headers per full segment
            (tbf counts frames; the veth counters results.py reads count
            about the payload, see its tx/rx_bytes).
  step      compute + comm, where comm is push + pull when the model is
            one message (its pull can only follow its push), and otherwise
            max(push, pull) + push / n for its n messages (about M / 4 MiB):
            the workers push and pull message by message (the scheduler
            pulls each as soon as its push is accepted), so the two
            directions overlap and only the last message's pull trails.
            Compute hidden under communication is left out (the forward needs
            the new parameters, the backward makes the gradients), so this
            errs long by at most the overlap; max(compute, comm) is the
            bound with compute and communication fully overlapped, for
            reference.

Unshaped links get R = UNSHAPED_BPS (iperf3's one stream on this kind of
machine); the model ignores serialisation and copies, which dominate there.
error = (predicted - measured) / measured; beyond 15 % the row says why,
from what the run measured. Standard library only.
"""

import csv
import json
import math
import os
import re
import sys

UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
UNSHAPED_BPS = 12.6e9
WIRE = 1514 / 1448
TOLERANCE = 0.15
CORES = os.cpu_count() or 1


def rate_bps(rate):
    m = re.fullmatch(r"(\d+)(bit|kbit|mbit|gbit)", rate)
    return int(m.group(1)) * UNITS[m.group(2)] if m else None


def bucket_bytes(bps):
    """netns.sh's tbf bucket at that rate (none when unshaped)."""
    return max(bps // 8 // 250, 131072) if bps else 0


def busiest_link_bytes(model_bytes, workers, servers):
    """Tensor bytes one way over the busiest link end in one push (or pull):
    a worker sends the model, a server receives W x M / S."""
    return max(model_bytes, workers * model_bytes / servers)


def ring_link_bytes(model_bytes, workers):
    """Tensor bytes one way over each worker's link in one ring all-reduce
    (run.sh --system=ddp): reduce-scatter and all-gather each pass W - 1 of
    the model's W chunks, so 2 (W - 1) / W x M, sent and received by every
    worker alike; 0 for one worker, which sends nothing."""
    return 2 * (workers - 1) * model_bytes / workers


def system_link_bytes(system, model_bytes, workers, servers):
    """The busiest link end's tensor bytes one way per step: "ps" (ours, S
    server hosts: busiest_link_bytes) or "ddp" (the ring: ring_link_bytes).
    Full duplex: the other way carries as much, at the same time."""
    if system == "ddp":
        return ring_link_bytes(model_bytes, workers)
    return busiest_link_bytes(model_bytes, workers, servers)


def transfer_s(model_bytes, workers, servers, bps, delay_ms):
    """One push (or one pull) of every worker, with the busiest link end."""
    busiest = busiest_link_bytes(model_bytes, workers, servers)
    shaped = max(0.0, busiest * WIRE - bucket_bytes(bps))
    return 2 * delay_ms / 1000 + shaped * 8 / (bps or UNSHAPED_BPS)


MESSAGE_BYTES = (4 << 20) - 4096  # the server's default chunk (4 MiB less the envelope)


def stop_and_wait_comm_s(model_bytes, workers, servers, bps, delay_ms):
    return 2 * transfer_s(model_bytes, workers, servers, bps, delay_ms)


def pipelined_comm_s(model_bytes, workers, servers, bps, delay_ms):
    """Push and pull message by message (see the module comment)."""
    messages = max(1, math.ceil(model_bytes / MESSAGE_BYTES))
    if messages == 1:
        return stop_and_wait_comm_s(model_bytes, workers, servers, bps, delay_ms)
    one_way = transfer_s(model_bytes, workers, servers, bps, delay_ms)
    return one_way + one_way / messages


def weak(r):
    """Whether the run's global batch grew with its workers."""
    return bool(r.get("batch_per_worker"))


def family(r):
    """Runs whose single-worker compute is the same: model, compute mode,
    batch rule."""
    return (r["model"], r["row"].get("compute", "real"), weak(r))


def single_worker_compute(runs):
    """{family: c1 seconds per step}: the least of its W = 1 runs' compute
    (the least disturbed by whatever else the machine ran)."""
    c1 = {}
    for r in runs:
        if r["workers"] == 1:
            c1[family(r)] = min(c1.get(family(r), math.inf), r["row"]["compute_s"])
    return c1


def why(r, pred, pred_shared, c1):
    row, reasons = r["row"], []
    measured = row["step_time_s"]
    if row["cpu_bound"] in (True, "True"):
        reasons.append(f"CPU-bound ({100 * row['cpu_busy']:.0f} % busy)")
    replayed = row.get("compute") == "replay"
    per_worker = c1 if weak(r) else c1 / r["workers"]
    if r["workers"] == 1 and not replayed and row["compute_s"] > 1.3 * c1:
        reasons.append(f"compute took {1000 * row['compute_s']:.1f} ms/step, "
                       f"{row['compute_s'] / c1:.1f} x the least single-worker run's "
                       f"{1000 * c1:.1f} ms (the same work: this machine's speed varied)")
    if r["workers"] > 1 and row["compute_s"] > 1.3 * per_worker and not replayed:
        reasons.append(f"compute shared: {r['workers']} workers on {CORES} cores took "
                       f"{1000 * row['compute_s']:.1f} ms/step, not "
                       f"{1000 * per_worker:.1f} ms")
    if r["workers"] > 1 and row["wait_s"] > 0.1 * measured:
        if replayed:
            reasons.append(f"waiting {1000 * row['wait_s']:.1f} ms/step for communication and "
                           "the slowest worker (each replays the pass it timed itself; the "
                           "slowest sets the pace)")
        else:
            reasons.append(f"waiting {1000 * row['wait_s']:.1f} ms/step for the slowest worker "
                           "(the workers share the cores, so their steps drift)")
    if r["rate"] == "unshaped":
        reasons.append("unshaped: serialisation and copies, not the link, take the time")
    elif measured < pred:
        if row["model_bytes"] <= MESSAGE_BYTES and r["workers"] > 1:
            reasons.append("faster than predicted: the workers' steps drift apart, so some "
                           "pull while others still push, and the server link carries both "
                           "directions at once (the model has them take turns)")
        else:
            reasons.append("faster than predicted: compute overlapped communication (pushes "
                           "start during backward, the next forward waits layer by layer)")
    if not reasons:
        reasons.append(f"{1000 * row['other_s']:.1f} ms/step outside the split"
                       if row["other_s"] > 0.1 * measured else "not explained")
    return "; ".join(reasons)


def predict(doc):
    runs = [r for r in doc["runs"] if "row" in r]
    c1s = single_worker_compute(runs)
    out = []
    for r in runs:
        row = r["row"]
        c1 = c1s.get(family(r))
        if c1 is None:
            continue
        comm = pipelined_comm_s(row["model_bytes"], r["workers"], r["servers"],
                                rate_bps(r["rate"]), r["delay_ms"])
        compute = c1 if weak(r) else c1 / r["workers"]
        if row.get("compute") == "replay" and r.get("results", {}).get("replay_step_s"):
            # A replaying worker's compute is the pass it replays, which each
            # run times anew (alone, before its workers start).
            compute = r["results"]["replay_step_s"]
        pred, pred_shared = compute + comm, compute * r["workers"] + comm
        measured = row["step_time_s"]
        p = {
            "config": r["config"], "model": r["model"], "workers": r["workers"],
            "compute": row.get("compute", "real"), "weak_scaling": weak(r),
            "servers": r["servers"], "rate": r["rate"], "delay_ms": r["delay_ms"],
            "model_bytes": row["model_bytes"], "c1_s": c1,
            "compute_s": compute, "comm_s": comm,
            "predicted_step_s": pred, "predicted_shared_cpu_step_s": pred_shared,
            "overlap_bound_step_s": max(compute, comm),
            "measured_step_s": measured,
            "error": (pred - measured) / measured,
            "error_shared_cpu": (pred_shared - measured) / measured,
            "cpu_bound": row["cpu_bound"] in (True, "True"),
        }
        p["explanation"] = (why(r, pred, pred_shared, c1) if abs(p["error"]) > TOLERANCE else "")
        out.append(p)
    return out


def main(argv):
    if len(argv) != 1:
        sys.exit("usage: model.py OUT  (OUT/sweep.json from sweep.py)")
    out = argv[0]
    with open(os.path.join(out, "sweep.json")) as f:
        doc = json.load(f)
    rows = predict(doc)
    for p in rows:
        for k, v in p.items():
            if isinstance(v, float) and not math.isfinite(v):
                sys.exit(f"model: {p['config']}: {k} is {v}")
    with open(os.path.join(out, "model.json"), "w") as f:
        json.dump({"unshaped_bps": UNSHAPED_BPS, "wire_factor": WIRE, "tolerance": TOLERANCE,
                   "cores": CORES, "rows": rows}, f, indent=1)
        f.write("\n")
    if rows:
        with open(os.path.join(out, "model.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            for p in rows:
                w.writerow({k: round(v, 6) if isinstance(v, float) else v for k, v in p.items()})
    print(f"{'config':34} {'measured':>9} {'model':>9} {'error':>7} {'shared':>9} {'error':>7}"
          f" {'overlap':>9}  why")
    for p in rows:
        print(f"{p['config']:34} {1000 * p['measured_step_s']:8.1f}m {1000 * p['predicted_step_s']:8.1f}m"
              f" {100 * p['error']:+6.0f}% {1000 * p['predicted_shared_cpu_step_s']:8.1f}m"
              f" {100 * p['error_shared_cpu']:+6.0f}% {1000 * p['overlap_bound_step_s']:8.1f}m"
              f"  {p['explanation']}")
    print(f"model: {os.path.join(out, 'model.json')}, model.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
