#!/usr/bin/env python3
"""Runs run.sh over a grid of configurations, one run after another, and
collects them: OUT/sweep.csv (one row per run, appended as each ends),
OUT/sweep.json (every run's results.json with its configuration), then the
analytic model (model.py: OUT/model.json, OUT/model.csv) and the plots
(plot.py: OUT/*.png). As root (run.sh's namespaces); standard library.

    python3 deploy/experiments/sweep.py                        # the default sweep, OUT=deploy/experiments/sweep
    python3 deploy/experiments/sweep.py --out=/tmp/s --workers=1,2 --rates=1gbit --models=lenet
    python3 deploy/experiments/sweep.py --spec=my_sweep.json   # the same keys as the flags
    python3 deploy/experiments/sweep.py --out=DIR --replot     # model and plots again, no runs

Grid (every combination, in this order): --models (lenet, mlp:4096x4096
for --model=mlp --mlp_hidden=4096,4096, resnet18, ...), --computes (real,
replay: run.sh --compute), --overlaps (on, off: the workers' --overlap),
--rates (100mbit, 1gbit, unshaped, ...), --delays (ms), --servers (shards),
--workers. --batch_per_worker=B makes the global batch B x workers (weak
scaling, each worker's compute fixed) instead of --batch_size.
Steps per run: enough for --run_seconds of predicted step time (model.py's
stop-and-wait estimate from the model's bytes and a rough compute
estimate, before any measurement),
between --min_steps and --max_steps; worker 0's first --warmup_steps are
outside the measured window. Synthetic data, global batch --batch_size.

A spec file is a JSON object with any of the keys workers, rates, delays,
models, servers, computes, overlaps (lists) and max_steps, min_steps,
warmup_steps, run_seconds, batch_size, batch_per_worker (numbers); flags
given on the command line win.
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import model  # noqa: E402  (this folder's analytic model)

DEFAULTS = {
    "workers": [1, 2, 4],
    "rates": ["100mbit", "1gbit", "unshaped"],
    "delays": [0],
    "models": ["lenet", "mlp:4096x4096"],
    "servers": [1],
    "max_steps": 40,
    "min_steps": 3,
    "warmup_steps": 1,
    "run_seconds": 15,
    "batch_size": 256,
    "batch_per_worker": 0,
    "computes": ["real"],
    "overlaps": ["on"],
}

# The default sweep: the DEFAULTS grid (real compute on the two cores the
# workers share), then two parts with compute replayed (each emulated host
# times its pass alone, so 16 of them fit on two cores): LeNet at 512
# samples a worker behind 1 Gbit/s, where one server's link saturates
# between 8 and 16 workers and more shards win it back; and the 20 M MLP at
# 2048 a worker, which scales behind 10 Gbit/s and not behind 1 Gbit/s.
DEFAULT_PARTS = [
    {"part": "models"},
    {"part": "scaling", "models": ["lenet"], "computes": ["replay"], "rates": ["1gbit"],
     "servers": [1, 2, 4], "workers": [1, 2, 4, 8, 16], "batch_per_worker": 512,
     "min_steps": 20, "max_steps": 30, "warmup_steps": 3},
    {"part": "mlp replayed", "models": ["mlp:4096x4096"], "computes": ["replay"],
     "rates": ["1gbit", "10gbit"], "workers": [1, 2, 4], "batch_per_worker": 2048,
     "min_steps": 6, "max_steps": 6, "warmup_steps": 2},
]

COLUMNS = [
    "config", "model", "workers", "servers", "rate", "delay_ms", "compute", "overlap",
    "batch_size", "steps", "window_steps",
    "model_bytes", "samples_per_second", "step_time_s",
    "compute_s", "push_s", "wait_s", "pull_s", "other_s",
    "server_rx_utilisation", "server_tx_utilisation", "worker_max_utilisation",
    "server_busy_utilisation",
    "cpu_busy", "cpu_bound", "load_before", "wall_s", "out",
]

# Parameter counts of the models the daemons know, for the step budget
# before anything is measured (the measured bytes replace them after).
PARAMETERS = {"lenet": 61706, "resnet18": 11173962, "softmax": 7850}


def parameters(spec):
    name, _, hidden = spec.partition(":")
    if name != "mlp":
        return PARAMETERS.get(name, 10**6)
    widths = [784] + [int(h) for h in (hidden or "256").split("x")] + [10]
    return sum(a * b + b for a, b in zip(widths, widths[1:]))


def grid(c):
    for m in c["models"]:
        for compute in c["computes"]:
            for overlap in c["overlaps"]:
                for rate in c["rates"]:
                    for delay in c["delays"]:
                        for servers in c["servers"]:
                            for workers in c["workers"]:
                                yield {"model": m, "rate": rate, "delay_ms": int(delay),
                                       "servers": int(servers), "workers": int(workers),
                                       "compute": compute, "overlap": overlap,
                                       "batch_per_worker": int(c["batch_per_worker"]),
                                       "part": c.get("part", "")}


def batch_of(g, c):
    """The global batch: batch_per_worker x workers when set (weak scaling:
    each worker's compute stays the same), else batch_size."""
    return c["batch_per_worker"] * g["workers"] if c["batch_per_worker"] else c["batch_size"]


def config_name(g):
    name = (f"{g['model'].replace(':', '-')}_w{g['workers']}_s{g['servers']}_{g['rate']}"
            f"_d{g['delay_ms']}")
    if g.get("compute", "real") != "real":
        name += "_" + g["compute"]
    if g.get("overlap", "on") != "on":
        name += "_overlap-" + g["overlap"]
    return name


def steps_for(g, c):
    # Compute: about 6 x parameters x batch flops at 20 Gflop/s (this machine).
    step = (model.stop_and_wait_comm_s(4 * parameters(g["model"]), g["workers"], g["servers"],
                                       model.rate_bps(g["rate"]), g["delay_ms"])
            + 6 * parameters(g["model"]) * batch_of(g, c) / g["workers"] / 20e9)
    budget = int(c["run_seconds"] / max(step, 1e-3))
    return max(c["min_steps"], min(c["max_steps"], budget))


def load():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def row_of(g, name, r, wall_s, load_before, out, batch):
    split = {k[:-2]: v / max(1, r["steps"]) for k, v in r["time_split_s"].items()}
    servers = [h for h in r["hosts"] if h["host"].startswith("s")]
    workers = [h for h in r["hosts"] if h["host"].startswith("w")]

    def most(hosts, keys):
        values = [h[k] for h in hosts for k in keys if h[k] is not None]
        return round(max(values), 4) if values else ""

    return {
        "config": name, "model": g["model"], "workers": g["workers"], "servers": g["servers"],
        "rate": g["rate"], "delay_ms": g["delay_ms"], "compute": r.get("compute", "real"),
        "overlap": g.get("overlap", "on"), "batch_size": batch, "steps": r["steps"],
        "window_steps": r["window_steps"], "model_bytes": int(r["model_bytes"]),
        "samples_per_second": round(r["samples_per_second"], 1),
        "step_time_s": round(r["step_time_s"], 6),
        "compute_s": round(split["data"] + split["compute"] + split["reduce"] + split["copy"], 6),
        "push_s": round(split["push"], 6), "wait_s": round(split["wait"], 6),
        "pull_s": round(split["pull"], 6),
        "other_s": round(max(0.0, r["step_time_s"] - sum(split.values())), 6),
        "server_rx_utilisation": most(servers, ["rx_utilisation"]),
        "server_tx_utilisation": most(servers, ["tx_utilisation"]),
        "worker_max_utilisation": most(workers, ["tx_utilisation", "rx_utilisation"]),
        "server_busy_utilisation": most(servers, ["tx_busy_utilisation", "rx_busy_utilisation"]),
        "cpu_busy": round(r["cpu_busy"], 3), "cpu_bound": r["cpu_bound"],
        "load_before": load_before, "wall_s": round(wall_s, 1), "out": out,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(HERE, "sweep"))
    p.add_argument("--spec", default="")
    for key in ("workers", "rates", "delays", "models", "servers", "computes", "overlaps"):
        p.add_argument("--" + key, default=None, help="comma-separated")
    for key in ("max_steps", "min_steps", "warmup_steps", "run_seconds", "batch_size",
                "batch_per_worker"):
        p.add_argument("--" + key, type=int, default=None)
    p.add_argument("--bin", default="",
                   help="prebuilt daemons (run.sh --bin) [setup.sh and bazel build once]")
    p.add_argument("--prefix", default=f"psw{os.getpid() % 100000}")
    p.add_argument("--runs_dir", default="", help="per-run folders [a new /tmp/ps-sweep.*]")
    p.add_argument("--replot", action="store_true", help="no runs: model and plots of OUT")
    p.add_argument("--no_plots", action="store_true")
    a = p.parse_args()

    c = dict(DEFAULTS)
    parts = None  # the default sweep's, unless a spec or a grid flag says otherwise
    if a.spec:
        with open(a.spec) as f:
            spec = json.load(f)
        unknown = set(spec) - set(DEFAULTS)
        if unknown:
            sys.exit(f"sweep: unknown keys in {a.spec}: {sorted(unknown)}")
        c.update(spec)
        parts = [c]
    for key in ("workers", "rates", "delays", "models", "servers", "computes", "overlaps"):
        if getattr(a, key) is not None:
            c[key] = getattr(a, key).split(",")
            parts = [c]
    for key in ("max_steps", "min_steps", "warmup_steps", "run_seconds", "batch_size",
                "batch_per_worker"):
        if getattr(a, key) is not None:
            c[key] = getattr(a, key)
            parts = [c]
    if parts is None:
        parts = [{**DEFAULTS, **part} for part in DEFAULT_PARTS]

    os.makedirs(a.out, exist_ok=True)
    csv_path, json_path = os.path.join(a.out, "sweep.csv"), os.path.join(a.out, "sweep.json")
    if not a.replot:
        runs_dir = a.runs_dir or tempfile.mkdtemp(prefix="ps-sweep.")
        print(f"sweep: each run's logs, reports and traces under {runs_dir}")
        configs = [(g, part) for part in parts for g in grid(part)]
        if not a.bin:
            # Install and build once, not once per run (run.sh --bin).
            root = os.path.dirname(os.path.dirname(HERE))
            subprocess.check_call(["bash", os.path.join(HERE, "setup.sh")],
                                  stdout=subprocess.DEVNULL)
            subprocess.check_call(["bazel", "build", "//server:server", "//worker:worker"],
                                  cwd=root)
            a.bin = subprocess.check_output(["bazel", "info", "bazel-bin"], cwd=root,
                                            text=True, stderr=subprocess.DEVNULL).strip()
        doc = {"spec": parts, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "load_before": load(), "runs": []}
        with open(csv_path, "w", newline="") as f:
            csv.DictWriter(f, fieldnames=COLUMNS).writeheader()
        t0 = time.monotonic()
        for i, (g, c) in enumerate(configs):
            name = config_name(g)
            run_out = os.path.join(runs_dir, name)
            steps = steps_for(g, c)
            m, _, hidden = g["model"].partition(":")
            batch = batch_of(g, c)
            cmd = ["bash", os.path.join(HERE, "run.sh"), f"--workers={g['workers']}",
                   f"--servers={g['servers']}", f"--rate={g['rate']}", f"--delay={g['delay_ms']}",
                   f"--model={m}", "--dataset=synthetic", f"--batch_size={batch}",
                   f"--compute={g['compute']}", "--epochs=1000",
                   f"--max_steps={steps}", f"--warmup_steps={c['warmup_steps']}",
                   f"--out={run_out}", f"--prefix={a.prefix}", "--lr=0.01"]
            if a.bin:
                cmd.append(f"--bin={a.bin}")
            worker_flags = []
            if hidden:
                worker_flags.append("--mlp_hidden=" + hidden.replace("x", ","))
            if g["overlap"] != "on":
                worker_flags.append("--overlap=false")
            if worker_flags:
                cmd += ["--"] + worker_flags
            load_before = load()
            print(f"sweep: [{i + 1}/{len(configs)}] {name}: {steps} steps (load {load_before})",
                  flush=True)
            started = time.monotonic()
            rc = subprocess.call(cmd)
            wall = time.monotonic() - started
            if rc != 0:
                print(f"sweep: {name} failed (exit {rc}); see {run_out}", file=sys.stderr)
                doc["runs"].append({"config": name, **g, "failed": rc})
                continue
            with open(os.path.join(run_out, "results.json")) as f:
                r = json.load(f)
            row = row_of(g, name, r, wall, load_before, run_out, batch)
            with open(csv_path, "a", newline="") as f:
                csv.DictWriter(f, fieldnames=COLUMNS).writerow(row)
            doc["runs"].append({"config": name, **g, "row": row, "results": r})
            doc["wall_s"] = round(time.monotonic() - t0, 1)
            with open(json_path, "w") as f:
                json.dump(doc, f, indent=1)
                f.write("\n")
        doc["load_after"] = load()
        with open(json_path, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        print(f"sweep: {len(configs)} runs in {doc.get('wall_s', 0):.0f} s; {csv_path}, {json_path}")
        if any("failed" in r for r in doc["runs"]):
            print("sweep: some runs failed (see above)", file=sys.stderr)
    model.main([a.out])
    if not a.no_plots:
        # Debian's python3 has Debian's matplotlib; a python3 earlier on PATH
        # (pyenv, a venv) may not.
        python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
        subprocess.check_call([python, os.path.join(HERE, "plot.py"), a.out])
    return 1 if not a.replot and any("failed" in r for r in doc["runs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
