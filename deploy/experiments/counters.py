#!/usr/bin/env python3
"""Samples a run's link byte counters and the machine's CPU time while it
trains, so results.py can take them over exactly the training steps.

    ip netns exec PREFIX-br python3 counters.py OUT/counters.txt HOSTS [--period_ms=10] [--time_limit=S]

Runs in the bridge namespace, where every host's link ends (vI is host I's
veth end: what host I sends is vI's received bytes, what it receives is
vI's sent bytes). Each line of the output is

    MONOTONIC_NS CPU_TOTAL CPU_IDLE RX0 TX0 RX1 TX1 ...

with CLOCK_MONOTONIC (the clock of the daemons' trace origins), the first
line of /proc/stat summed as results.py does (jiffies) and each vI's
counters from /proc/net/dev (per namespace). Stops on SIGTERM or after
--time_limit seconds; standard library only.
"""

import argparse
import signal
import sys
import time


def cpu():
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:9]]
    return sum(values), values[3] + values[4]


def links(n):
    counters = {}
    with open("/proc/net/dev") as f:
        for line in f.readlines()[2:]:
            name, data = line.split(":", 1)
            fields = data.split()
            counters[name.strip()] = (fields[0], fields[8])  # rx bytes, tx bytes
    return " ".join(" ".join(counters.get(f"v{i}", ("0", "0"))) for i in range(n))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("hosts", type=int)
    p.add_argument("--period_ms", type=float, default=10)
    p.add_argument("--time_limit", type=float, default=1800)
    a = p.parse_args()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    deadline = time.monotonic() + a.time_limit
    with open(a.out, "w") as f:
        while True:
            total, idle = cpu()
            f.write(f"{time.monotonic_ns()} {total} {idle} {links(a.hosts)}\n")
            f.flush()
            if stop or time.monotonic() > deadline:
                return 0
            time.sleep(a.period_ms / 1000)


if __name__ == "__main__":
    sys.exit(main())
