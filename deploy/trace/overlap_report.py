#!/usr/bin/env python3
"""How much of a worker's communication its compute hides, from its --trace.

    python3 deploy/trace/overlap_report.py worker0.json [--skip=1] [--json]

Reads one worker's Chrome trace (common/chrome_trace.h; a merged timeline
works too, with --pid to pick the worker) and prints, per step and over the
steps after the first --skip (warm-up):

  backward_end    when the step's last layer backward ended, on any device
                  (a worker of several devices: its slowest replica)
  first_push      when its first push message started, relative to that:
                  negative means the push started while backward still ran
  comm_s          the union of its push and pull messages' intervals
  hidden          the part of comm_s under the union of the step's forward
                  and backward passes (the next step's forward included,
                  which is where a step's pulls are awaited), as a fraction
  first_layer_in  when the pull carrying the first tensor ended, relative to
                  the pull carrying the last tensor (a message's lane is its
                  place in the flat order): negative means the front layer's
                  parameters arrived first. Rarely so: the last layer's
                  gradients come first out of backward, and a small last
                  layer is pushed, updated and pulled before the first
                  layer's gradients exist
  front_ahead     when the last pull of the front layer ended (every message
                  whose first tensor belongs to the first tensor's layer:
                  its name up to the last '.'), relative to the step's last
                  pull to end, of any layer: negative means the next forward
                  could begin its first layer while later layers' parameters
                  were still arriving. The front layer's gradients are the
                  last computed, so under first-come order its parameters
                  come in last; priority (front layers first, P3) sends them
                  ahead of the back layers' bytes still queued

A push or pull message belongs to the step its args.step says (a pull of
version v carries step v - 1). Standard library only; exit status 2 with a
message for a file that is not such a trace.
"""

import argparse
import json
import sys


def fail(message):
    """Exits with status 2 and the message on stderr (the docstring's
    contract; a bare SystemExit(str) would exit 1)."""
    print(f"overlap_report: {message}", file=sys.stderr)
    sys.exit(2)


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        fail(f"{path}: {e}")
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        fail(f"{path}: no traceEvents list")
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]


def union(intervals):
    """Sorted, merged [start, end) intervals."""
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def length(intervals):
    return sum(e - s for s, e in intervals)


def intersection(a, b):
    """Total length of the overlap of two merged interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


DEVICE0_LANE = 1  # DeviceLane(0), common/timed_event.h
RPC0_LANE = 1 << 16  # RpcLane(0): device lanes lie below it


def is_device_lane(lane):
    return isinstance(lane, int) and DEVICE0_LANE <= lane < RPC0_LANE


def layer_of(tensor):
    """The layer a tensor belongs to: its name up to the last '.'
    ("fc1.weight" -> "fc1"; a name without one is its own layer)."""
    return tensor.rsplit(".", 1)[0]


def report(events, pid=None, skip=1):
    if pid is None:
        pids = sorted({e.get("pid") for e in events if e.get("cat") == "push_message"})
        if not pids:
            fail("no push messages in the trace")
        pid = pids[0]
    events = [e for e in events if e.get("pid") == pid]

    def spans(cat, on_devices=False):
        by_step = {}
        for e in events:
            if e.get("cat") != cat or (on_devices and not is_device_lane(e.get("tid"))):
                continue
            step = e.get("args", {}).get("step", -1)
            by_step.setdefault(step, []).append(e)
        return by_step

    backward = spans("backward", on_devices=True)
    forward = spans("forward", on_devices=True)
    pushes = spans("push_message")
    pulls = spans("pull_message")
    steps = sorted(s for s in pushes if s >= 0)
    rows = []
    for step in steps:
        if step not in backward or step not in pulls:
            continue
        bw_end = max(e["ts"] + e["dur"] for e in backward[step])
        first_push = min(e["ts"] for e in pushes[step])
        comm = union([(e["ts"], e["ts"] + e["dur"]) for e in pushes[step] + pulls[step]])
        compute = union([(e["ts"], e["ts"] + e["dur"])
                         for s in (step, step + 1)
                         for e in backward.get(s, []) + forward.get(s, [])])
        comm_us = length(comm)
        hidden = intersection(comm, compute) / comm_us if comm_us > 0 else 0.0
        # A message's lane is its index in the flat order (RpcLane(m); with
        # shards, shard s's messages follow shard s - 1's): the lowest lane
        # carries the first tensor, the highest the last.
        first = min(pulls[step], key=lambda e: e["tid"])
        last = max(pulls[step], key=lambda e: e["tid"])
        front_layer = layer_of(first["name"])
        front_in = max(e["ts"] + e["dur"] for e in pulls[step]
                       if layer_of(e["name"]) == front_layer)
        all_in = max(e["ts"] + e["dur"] for e in pulls[step])
        rows.append({
            "step": step,
            "backward_end_ms": bw_end / 1e3,
            "first_push_vs_backward_end_ms": (first_push - bw_end) / 1e3,
            "comm_s": comm_us / 1e6,
            "hidden": hidden,
            "first_tensor": first["name"],
            "last_tensor": last["name"],
            "first_layer_in_vs_last_ms":
                ((first["ts"] + first["dur"]) - (last["ts"] + last["dur"])) / 1e3,
            "front_layer": front_layer,
            "front_layer_in_vs_all_in_ms": (front_in - all_in) / 1e3,
        })
    timed = [r for r in rows if r["step"] >= skip]
    total_comm = sum(r["comm_s"] for r in timed)
    summary = {
        "pid": pid,
        "steps": len(timed),
        "hidden_fraction": (sum(r["hidden"] * r["comm_s"] for r in timed) / total_comm
                            if total_comm > 0 else 0.0),
        "steps_pushing_before_backward_ends": sum(
            1 for r in timed if r["first_push_vs_backward_end_ms"] < 0),
        "steps_first_layer_in_first": sum(
            1 for r in timed if r["first_layer_in_vs_last_ms"] < 0),
        "steps_front_layer_ahead": sum(
            1 for r in timed if r["front_layer_in_vs_all_in_ms"] < 0),
    }
    return rows, summary


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace")
    parser.add_argument("--pid", type=int, default=None, help="the worker's pid in the trace")
    parser.add_argument("--skip", type=int, default=1, help="warm-up steps left out of the summary")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    rows, summary = report(load(args.trace), args.pid, args.skip)
    if args.json:
        print(json.dumps({"steps": rows, "summary": summary}, indent=1))
        return 0
    print(f"{'step':>5} {'first push vs bw end':>21} {'comm s':>8} {'hidden':>7} "
          f"{'first layer in vs last':>23} {'front layer in vs all in':>25}")
    for r in rows:
        print(f"{r['step']:>5} {r['first_push_vs_backward_end_ms']:>18.1f} ms "
              f"{r['comm_s']:>8.3f} {r['hidden']:>6.0%} "
              f"{r['first_layer_in_vs_last_ms']:>20.1f} ms "
              f"{r['front_layer_in_vs_all_in_ms']:>22.1f} ms")
    front = rows[0]["front_layer"] if rows else "-"
    print(f"over {summary['steps']} steps after {args.skip} warm-up: "
          f"{summary['hidden_fraction']:.0%} of communication time under compute; "
          f"first push before backward ended in {summary['steps_pushing_before_backward_ends']}; "
          f"front layer's parameters in before the back layer's in "
          f"{summary['steps_first_layer_in_first']}; "
          f"front layer ({front}) all in before the step's last parameters in "
          f"{summary['steps_front_layer_ahead']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
