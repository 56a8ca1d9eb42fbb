#!/usr/bin/env python3
"""Merges Chrome trace-event files, one per process, into one timeline.

    python3 deploy/trace/merge_traces.py -o job.json server.json worker0.json worker1.json

Each input is a file written by --trace (common/chrome_trace.h) or any
Chrome trace-event JSON file: an object with a "traceEvents" list, or a bare
list of events. Every process keeps its own row group and metadata
(process_name, thread_name, ...): a file whose pid another file already
used is renumbered to the next free pid, and a line on stderr says so.

Times: files that record "otherData": {"clock_origin_ns": N} (ours do) are
shifted onto the earliest origin, so the processes of one host, whose steady
clocks agree, line up; files without one keep their times as they are.

Open the result in https://ui.perfetto.dev or chrome://tracing. Standard
library only. Exit status 0, or 2 with a message naming the bad file.
"""

import argparse
import json
import os
import sys


class TraceError(Exception):
    pass


def load(path):
    """Returns (events, other_data) of one trace file; TraceError if bad."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: not JSON: {e}") from None
    if isinstance(doc, list):
        events, other = doc, {}
    elif isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        events, other = doc["traceEvents"], doc.get("otherData") or {}
    else:
        raise TraceError(f'{path}: not a Chrome trace (no "traceEvents" list)')
    for i, e in enumerate(events):
        if not isinstance(e, dict) or "ph" not in e or "pid" not in e:
            raise TraceError(f'{path}: event {i} is not a trace event (needs "ph" and "pid")')
        if e["ph"] != "M" and not isinstance(e.get("ts"), (int, float)):
            raise TraceError(f'{path}: event {i} has no numeric "ts"')
    if not isinstance(other, dict):
        raise TraceError(f'{path}: "otherData" is not an object')
    return events, other


def merge(paths, log=sys.stderr):
    """The merged document of the files at `paths`."""
    loaded = [(path,) + load(path) for path in paths]

    # 1. A common origin, when every file states its own.
    origins = [other.get("clock_origin_ns") for _, _, other in loaded]
    aligned = all(isinstance(o, int) for o in origins)
    base = min(origins) if aligned and origins else None
    if not aligned and any(isinstance(o, int) for o in origins):
        print("merge_traces: not every file records clock_origin_ns; times are not shifted",
              file=log)

    # 2. Pids distinct across files, in the order the files are given.
    used = set()
    metadata, timed = [], []
    dropped = 0
    for (path, events, other), origin in zip(loaded, origins):
        pids = sorted({e["pid"] for e in events},
                      key=lambda p: (isinstance(p, str), p if isinstance(p, int) else str(p)))
        mapping = {}
        for pid in pids:
            new = pid
            if new in used:
                new = max([p for p in used if isinstance(p, int)] + [-1]) + 1
                print(f"merge_traces: {path}: pid {pid} is taken, renumbered {new}", file=log)
            mapping[pid] = new
            used.add(new)
        shift_us = (origin - base) / 1e3 if base is not None else 0.0
        for e in events:
            e = dict(e, pid=mapping[e["pid"]])
            if e["ph"] == "M":
                metadata.append(e)
            else:
                e["ts"] = e["ts"] + shift_us
                timed.append(e)
        if isinstance(other.get("dropped_events"), int):
            dropped += other["dropped_events"]

    # 3. Metadata first, then every process's events by start (stable, so
    #    each file's own order of equal starts stands).
    timed.sort(key=lambda e: e["ts"])
    other = {"sources": list(paths), "dropped_events": dropped}
    if base is not None:
        other["clock_origin_ns"] = base
    return {"traceEvents": metadata + timed, "displayTimeUnit": "ms", "otherData": other}


def write(doc, path):
    """Writes `doc` as our files are, one event per line, atomically."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write('{"traceEvents":[\n')
        f.write(",\n".join(json.dumps(e, separators=(",", ":")) for e in doc["traceEvents"]))
        f.write('\n],\n"displayTimeUnit":"ms",\n"otherData":')
        f.write(json.dumps(doc["otherData"], separators=(",", ":")))
        f.write("}\n")
    os.replace(tmp, path)


def main(argv):
    parser = argparse.ArgumentParser(
        prog="merge_traces.py",
        description="Merge Chrome trace-event files (one per process) into one timeline.")
    parser.add_argument("-o", "--output", required=True, help="the merged trace to write")
    parser.add_argument("inputs", nargs="+", metavar="TRACE", help="trace files to merge")
    args = parser.parse_args(argv)
    try:
        doc = merge(args.inputs)
        write(doc, args.output)
    except TraceError as e:
        parser.exit(2, f"merge_traces.py: error: {e}\n")
    except OSError as e:
        parser.exit(2, f"merge_traces.py: error: {args.output}: cannot write: {e.strerror}\n")
    processes = len({e["pid"] for e in doc["traceEvents"]})
    print(f"merged {len(args.inputs)} files ({processes} processes, "
          f"{len(doc['traceEvents'])} events) into {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
