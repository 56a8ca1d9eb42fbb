#!/usr/bin/env bash
# Throughput of the local cluster with W = 1 and W = 2 workers against the
# one-process trainer, and the bytes each worker moves per step against the
# model's size. Prints a table; not a test.
#
#   bash deploy/dev/bench/cluster_scaling.sh [--model=lenet] [--epochs=2] [--devices=cpu:1]
#
# samples/s counts all workers together and excludes the first epoch (the
# reports' global_samples_per_second). On a 2-core machine W = 2 gives each
# worker one core while the one-process run gets both: the comparison shows
# what the parameter server costs, not a speed-up.
set -euo pipefail
cd "$(dirname "$0")/../../.."

model=lenet epochs=2 devices=cpu:1
for arg in "$@"; do
  case "$arg" in
    --model=*) model="${arg#*=}" ;;
    --epochs=*) epochs="${arg#*=}" ;;
    --devices=*) devices="${arg#*=}" ;;
    *) echo "cluster_scaling: unknown flag $arg" >&2; exit 2 ;;
  esac
done
out=$(mktemp -d /tmp/ps-scaling.XXXXXX)
bazel build //server:server //worker:worker >/dev/null 2>&1
bin=$(bazel info bazel-bin 2>/dev/null)

"$bin/worker/worker" --model="$model" --epochs="$epochs" --devices=cpu --progress=false \
  --evaluate=false --report="$out/local.json" >"$out/local.log" 2>&1
for w in 1 2; do
  bash deploy/local_cluster.sh --workers="$w" --model="$model" --epochs="$epochs" \
    --devices="$devices" --logs="$out/w$w" --report="$out/w$w.json" -- --evaluate=false \
    >"$out/w$w.log" 2>&1
done

/usr/bin/python3 - "$out" <<'PY'
import json, re, sys, glob, os
out = sys.argv[1]
def load(name):
    with open(os.path.join(out, name)) as f:
        return json.load(f)
local = load("local.json")
base = local["global_samples_per_second"]
model_bytes = local["model_parameters"] * 4
print(f"model {local['model']}: {local['model_parameters']} parameters, {model_bytes} bytes; "
      f"global batch {local['global_batch_size']}")
print(f"{'configuration':<34}{'samples/s':>11}{'vs local':>10}{'push B/step':>13}{'pull B/step':>13}")
print(f"{'one process (SGD in process)':<34}{base:>11.0f}{1.0:>10.2f}{'-':>13}{'-':>13}")
for w in (1, 2):
    r = load(f"w{w}.json")
    logs = "".join(open(p).read() for p in glob.glob(os.path.join(out, f"w{w}", "worker-*.log")))
    m = re.findall(r"pushed (\d+) and pulled (\d+) bytes per step", logs)
    push = max(int(a) for a, _ in m) if m else -1
    pull = max(int(b) for _, b in m) if m else -1
    s = r["global_samples_per_second"]
    split = r["time_split"]
    print(f"{'cluster, ' + str(w) + ' worker(s) x ' + ','.join(r['devices']):<34}"
          f"{s:>11.0f}{s / base:>10.2f}{push:>13}{pull:>13}")
    total = sum(split.values())
    print("    worker 0 time: " + ", ".join(f"{k[:-2]} {100 * v / total:.0f}%" for k, v in split.items()))
print(f"logs and reports in {out}")
PY
