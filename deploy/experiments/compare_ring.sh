#!/usr/bin/env bash
# Ours against the ring all-reduce baseline on the same emulated links
# (issue 32): for each rate and worker count W, run.sh runs our parameter
# server with W dedicated server hosts (one shard each) and then
# run.sh --system=ddp (PyTorch DDP, gloo's ring, no server hosts), each with
# its default flags and the same job, over several rounds interleaved (the
# two systems' order alternates from round to round, so a drift in the
# machine's load falls on both). Appends every run's row to OUT/compare_ring.csv
# (results.py's columns, `system` ps or ddp), then prints, per rate and W,
# the median over rounds of each system's step (worker 0's mean step over its
# measured window; lowest-highest beside it) against its bound, the ring/ours ratio and the bandwidth
# prediction: the ring moves 2 (W - 1) / W of the model through each
# worker's link each way per step, ours with S = W servers moves the model
# (max(M, W M / S) = M), so the prediction is 2 (W - 1) / W. As root; a
# benchmark, minutes per run at 200 Mbit/s, never a test.
#
#   bash deploy/experiments/compare_ring.sh                                   # the whole grid, 3 rounds
#   bash deploy/experiments/compare_ring.sh --rates=200mbit --workers=2 --rounds=1 --max_steps=6
#   bash deploy/experiments/compare_ring.sh --table=OUT/compare_ring.csv     # the table again, no runs
#
# Flags (defaults in brackets):
#   --rates=R,... [200mbit,1gbit]   --workers=W,... [2,4]   --rounds=N [3]
#   --model=NAME [mlp] --mlp_hidden=H,... [4096,4096] (issue 33: 784-4096-4096-10, 80 MB)
#   --local_batch=B [16]            each worker's batch; the global batch is B x W
#   --max_steps=N [12] --warmup_steps=N [1]
#   --out=DIR [a temporary directory]   every run's folder, compare_ring.csv, table.txt
#   --bin=DIR                       prebuilt daemons (run.sh --bin); under `bazel run`/`bazel
#                                   test` the runfiles' own
#   --lr=X [0.01]                   SGD's step for both (run.sh's 0.9 makes this MLP diverge)
#   --time_limit=S [900]            per run (run.sh --time_limit)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# Under Bazel (//tests:compare_ring_benchmark) this script runs as
# tests/compare_ring_benchmark: the harness is in the runfiles.
[[ -n "${TEST_SRCDIR:-}" ]] && here="$TEST_SRCDIR/${TEST_WORKSPACE:-ps}/deploy/experiments"
rates=200mbit,1gbit workers_list=2,4 rounds=3 model=mlp mlp_hidden=4096,4096 local_batch=16
max_steps=12 warmup_steps=1 lr=0.01 out="" bin="" time_limit=900 table=""
while (($#)); do
  case "$1" in
    --rates=*) rates="${1#*=}" ;;
    --workers=*) workers_list="${1#*=}" ;;
    --rounds=*) rounds="${1#*=}" ;;
    --model=*) model="${1#*=}" ;;
    --mlp_hidden=*) mlp_hidden="${1#*=}" ;;
    --local_batch=*) local_batch="${1#*=}" ;;
    --max_steps=*) max_steps="${1#*=}" ;;
    --warmup_steps=*) warmup_steps="${1#*=}" ;;
    --out=*) out="${1#*=}" ;;
    --bin=*) bin="${1#*=}" ;;
    --lr=*) lr="${1#*=}" ;;
    --time_limit=*) time_limit="${1#*=}" ;;
    --table=*) table="${1#*=}" ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "compare_ring: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
fail() { echo "compare_ring: $*" >&2; exit 1; }

# The table: per rate and W, the median over rounds of each system's step
# and step / bound (payload_bound_s: the tensors' bytes through the busiest
# link end at the rate), ring / ours, and the prediction 2 (W - 1) / W.
print_table() {
  python3 - "$1" <<'PY'
import collections, csv, statistics, sys
runs = collections.defaultdict(list)
with open(sys.argv[1], newline="") as f:
    for row in csv.DictReader(f):
        runs[(row["rate"], int(row["workers"]), row.get("system") or "ps")].append(row)
def median(rows, key):
    values = [float(r[key]) for r in rows if r.get(key) not in (None, "")]
    return statistics.median(values) if values else None
def cell(rows):
    """Median step (lowest-highest over the rounds) and median step / bound."""
    if not rows:
        return "-"
    steps = [float(r["step_time_s"]) for r in rows]
    step, over = median(rows, "step_time_s"), median(rows, "step_over_payload_bound")
    spread = f" ({min(steps):.2f}-{max(steps):.2f})" if len(rows) > 1 else ""
    return f"{step:.3f} s{spread}" + (f" {over:.2f} x" if over is not None else "")
bps = {rate: float(rows[0].get("rate_bits_per_second") or "inf")
       for (rate, _, _), rows in runs.items()}
keys = sorted({(rate, w) for rate, w, _ in runs}, key=lambda k: (bps[k[0]], k[1]))
print(f"{'rate':>8} | {'W':>2} | {'ours step (x bound)':>30} | {'ring step (x bound)':>30} | "
      f"{'ring/ours':>9} | {'prediction':>10} | rounds | CPU busy (ours, ring)")
for rate, w in keys:
    ours, ring = runs[(rate, w, "ps")], runs[(rate, w, "ddp")]
    ratio = (median(ring, "step_time_s") / median(ours, "step_time_s")
             if ours and ring else None)
    # Ours with S = W servers: max(M, W M / S) = M; the ring: 2 (W - 1) / W M.
    prediction = 2 * (w - 1) / w
    busy = f"{median(ours, 'cpu_busy') or 0:.2f}, {median(ring, 'cpu_busy') or 0:.2f}"
    print(f"{rate:>8} | {w:>2} | {cell(ours):>30} | {cell(ring):>30} | "
          f"{(f'{ratio:.2f}' if ratio else '-'):>9} | {prediction:>10.2f} | "
          f"{len(ours)}, {len(ring)} | {busy}")
PY
}

if [[ -n "$table" ]]; then
  print_table "$table"
  exit 0
fi
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || fail "--rounds is a positive whole number"
[[ "$local_batch" =~ ^[1-9][0-9]*$ ]] || fail "--local_batch is a positive whole number"
[[ "$max_steps" =~ ^[1-9][0-9]*$ ]] || fail "--max_steps is a positive whole number"
# Under Bazel (the compare_ring_benchmark target) the daemons are the runfiles'.
if [[ -z "$bin" && -n "${TEST_SRCDIR:-}" ]]; then
  bin="$TEST_SRCDIR/${TEST_WORKSPACE:-ps}"
fi
if [[ -z "$out" ]]; then
  out=$(mktemp -d "${TEST_UNDECLARED_OUTPUTS_DIR:-/tmp}/compare-ring.XXXXXX")
fi
mkdir -p "$out"
out="$(cd "$out" && pwd)"
csv="$out/compare_ring.csv"
IFS=, read -ra rate_list <<<"$rates"
IFS=, read -ra worker_counts <<<"$workers_list"

# Each run's configuration: the job both systems train, its global batch
# local_batch x W, and ours with W dedicated server hosts.
run_one() {  # system rate W round
  local system=$1 rate=$2 w=$3 round=$4 dir
  dir="$out/$system-$rate-w$w-r$round"
  local flags=(--system="$system" --workers="$w" --rate="$rate" --model="$model"
               --dataset=synthetic --batch_size="$((local_batch * w))" --max_steps="$max_steps" --lr="$lr"
               --warmup_steps="$warmup_steps" --time_limit="$time_limit" --out="$dir"
               --csv="$csv" --prefix="cr$$$round$w")
  [[ "$system" == ps ]] && flags+=(--servers="$w")
  [[ -n "$bin" ]] && flags+=(--bin="$bin")
  echo "compare_ring: round $round, $system, $rate, W=$w; load average $(cut -d' ' -f1-3 /proc/loadavg)"
  # In the background, so a SIGTERM or Ctrl-C here reaches the run, whose
  # own trap removes its hosts.
  bash "$here/run.sh" "${flags[@]}" -- --mlp_hidden="$mlp_hidden" >"$dir.log" 2>&1 &
  run_pid=$!
  wait "$run_pid" || fail "run failed ($dir.log): $(tail -n 5 "$dir.log")"
  run_pid=""
  grep -E "^run: (ps|ddp): step" "$dir.log" || true
}

run_pid=""
stop() {
  if [[ -n "$run_pid" ]]; then kill -TERM "$run_pid" 2>/dev/null || true; wait "$run_pid" 2>/dev/null || true; fi
  echo "compare_ring: stopped; rows so far in $csv" >&2
  exit 143
}
trap stop INT TERM
echo "compare_ring: $model $mlp_hidden, local batch $local_batch, lr $lr, $max_steps steps" \
     "($warmup_steps warm-up), rates $rates, W $workers_list, $rounds round(s); out $out"
for ((round = 0; round < rounds; round++)); do
  for rate in "${rate_list[@]}"; do
    for w in "${worker_counts[@]}"; do
      if ((round % 2 == 0)); then order=(ps ddp); else order=(ddp ps); fi
      for system in "${order[@]}"; do run_one "$system" "$rate" "$w" "$round"; done
    done
  done
done
echo "compare_ring: load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
print_table "$csv" | tee "$out/table.txt"
echo "compare_ring: rows in $csv, table in $out/table.txt"
