#!/usr/bin/env python3
"""Runs the simulator (simulate.py) on every configuration of an emulator
CSV and prints its step time against the measured one, per configuration:
how far the simulator is from the emulator it stands in for.

    /usr/bin/python3 deploy/experiments/calibrate.py CSV [--profiles=DIR] [--out=ROWS.csv]
        [--tolerance=0.10] [--share=0.8] [--filter=SUBSTRING] [-- simulate.py flags...]

CSV is either sweep.py's OUT/sweep.csv or rows that run.sh --csv (results.py)
appended. Each row's model names its profile, DIR/<model>.json (":" read
as "-": mlp:4096x4096 -> mlp-4096x4096.json; default DIR
deploy/experiments/profiles). The simulator runs the PS the emulator ran
(dedicated server hosts, the worker's range shard plan) with the row's
workers, servers, rate and delay, and with the row's own compute: its
layers scaled so that a pass takes what the run measured (--compute_ms:
a replayed run's replay_step_s; otherwise sweep.csv's compute_s, or
results.csv's split of data, compute, reduce and copy times the step), so
the comparison is of communication and overlap, not of this machine's
CPU. Rows of unshaped links are skipped (the simulator's links are ideal;
the emulator's copies and serialisation set those steps).

error = (simulated - measured) / measured. The last line says how many
rows are within --tolerance, and exits 1 when fewer than --share of them
are (the acceptance: 10 % on step time for 80 % of a W = 2 ... 16 grid).
Figures measured on a loaded machine are preliminary: say so beside them.
"""

import argparse
import csv
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SPLIT_COMPUTE = ("split_data", "split_compute", "split_reduce", "split_copy")


def compute_ms(row):
    """The run's own compute per step in ms, or None."""
    if row.get("compute") == "replay" and float(row.get("replay_step_s") or 0) > 0:
        return 1000 * float(row["replay_step_s"])
    if row.get("compute_s") not in (None, ""):
        return 1000 * float(row["compute_s"])
    if all(row.get(k) not in (None, "") for k in SPLIT_COMPUTE):
        return 1000 * float(row["step_time_s"]) * sum(float(row[k]) for k in SPLIT_COMPUTE)
    return None


def simulate(row, profile, extra):
    """The simulated row (simulate.py --json) for an emulator row."""
    out = f"/tmp/calibrate-{os.getpid()}.json"
    args = [sys.executable, os.path.join(HERE, "simulate.py"), "--protocol=ps",
            "--placement=dedicated", "--shard_plan=range", f"--workers={row['workers']}",
            f"--servers={row['servers']}", f"--rate={row['rate']}",
            f"--delay={row['delay_ms']}", f"--profile={profile}", f"--json={out}"]
    ms = compute_ms(row)
    if ms is not None:
        args.append(f"--compute_ms={ms}")
    r = subprocess.run(args + extra, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"simulate.py failed: {r.stderr.strip()[-500:]}")
    import json
    with open(out) as f:
        result = json.load(f)
    os.unlink(out)
    return result


def main(argv):
    extra = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv")
    p.add_argument("--profiles", default=os.path.join(HERE, "profiles"))
    p.add_argument("--out", default="", help="also write each comparison as a CSV row here")
    p.add_argument("--tolerance", type=float, default=0.10)
    p.add_argument("--share", type=float, default=0.80)
    p.add_argument("--filter", default="", help="only rows whose config (or model) contains this")
    a = p.parse_args(argv)

    with open(a.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    compared = []
    print(f"{'configuration':40} {'measured':>10} {'simulated':>10} {'error':>7}  compute")
    for row in rows:
        name = row.get("config") or (f"{row['model']}_w{row['workers']}_s{row['servers']}_"
                                     f"{row['rate']}_d{row['delay_ms']}_{row.get('compute', '')}")
        if a.filter and a.filter not in name and a.filter not in row.get("model", ""):
            continue
        if row["rate"] == "unshaped":
            print(f"{name:40} skipped: unshaped links")
            continue
        profile = os.path.join(a.profiles, row["model"].replace(":", "-") + ".json")
        if not os.path.exists(profile):
            print(f"{name:40} skipped: no profile {profile}")
            continue
        measured = float(row["step_time_s"])
        sim = simulate(row, profile, extra)
        error = (sim["step_time_s"] - measured) / measured
        compared.append({"config": name, "model": row["model"], "workers": row["workers"],
                         "servers": row["servers"], "rate": row["rate"],
                         "delay_ms": row["delay_ms"], "compute": row.get("compute", ""),
                         "compute_ms": round(compute_ms(row) or 0, 3),
                         "measured_step_s": measured, "simulated_step_s": sim["step_time_s"],
                         "simulated_bound_s": sim["bound_s"], "error": round(error, 4)})
        print(f"{name:40} {1000 * measured:9.1f}m {1000 * sim['step_time_s']:9.1f}m "
              f"{100 * error:+6.1f}%  {compute_ms(row) or 0:.1f} ms")
    if a.out and compared:
        with open(a.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(compared[0]))
            w.writeheader()
            w.writerows(compared)
    if not compared:
        print("calibrate: no configuration to compare")
        return 1
    within = sum(abs(c["error"]) <= a.tolerance for c in compared)
    ok = within >= a.share * len(compared)
    print(f"calibrate: {within} of {len(compared)} within {100 * a.tolerance:.0f} % "
          f"({100 * within / len(compared):.0f} %; {'meets' if ok else 'misses'} the "
          f"{100 * a.share:.0f} % asked)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
