#!/usr/bin/env bash
# One network-bottleneck experiment: S parameter-server shards and W workers,
# each in its own network namespace behind an emulated link (netns.sh), trained
# for a bounded number of steps (or, --system=ddp, the ring all-reduce
# baseline: PyTorch DDP over gloo on the W worker hosts, no servers); writes
# what was measured to OUT/results.json and OUT/results.csv (one row) with the
# merged timeline OUT/trace.json.
# Removes every namespace, link, qdisc, rule and process of the run when it
# ends, fails, or gets Ctrl-C or SIGTERM. As root.
#
#   bash deploy/experiments/run.sh                 # no arguments: the default sweep (sweep.py)
#   bash deploy/experiments/run.sh --workers=2 --rate=100mbit --model=lenet --max_steps=100
#   bash deploy/experiments/run.sh --rate=1gbit --delay=5 --check   # the link itself
#
# Flags (defaults in brackets):
#   --system=ps|ddp [ps]        ps: our parameter server and workers; ddp: the
#                               baseline, one ddp_worker.py rank (PyTorch DDP,
#                               gloo's ring all-reduce, DDP's default buckets)
#                               per worker host, the same job, no server hosts
#   --workers=W [2]             worker hosts
#   --servers=S [1]             server hosts (shards; every worker gets the list of all S)
#   --rate=R [1gbit]            each host's link, both directions: 100mbit, 1gbit, ... or unshaped
#   --delay=D [0]               one-way latency between two hosts in ms (ping RTT 2D)
#   --congestion=NAME [cubic]   TCP congestion control in every host (cubic: Debian 12's
#                               default; a host whose kernel defaults to another, e.g. bbr,
#                               would otherwise give other figures)
#   --model=NAME [lenet] --dataset=NAME [fashion_mnist] --data_dir=DIR
#   --model_profile=FILE        train a model from outside: every worker replays this
#                               model profile (profiles/*.json, model_profile.py's
#                               format) as its model (worker --model=profile): the
#                               profile's tensors on the wire, its per-layer times
#                               scaled by the worker's batch / the profile's. Replaces
#                               --model; synthetic data unless --dataset is given;
#                               the servers need nothing special
#   --batch_size=B [256, global] --epochs=N [1] --max_steps=N [0: whole epochs]
#   --warmup_steps=N [1]        worker 0's first N steps are left out of the measured window
#   --sample_ms=MS [10]         period of the link and CPU counter samples
#   --lr=X [0.9] --devices=SPEC [cpu:1] --threads=N [cores/W; replay: cores]
#   --chunk_bytes=B [the server's 4 MiB]  the servers' chunk (message) size
#   --server_flags="F ..."      more flags for every server (e.g. --max_push_lead_bytes=B)
#   --compute=real|replay [real]  replay: each worker times its real pass alone
#                               (workers start one after another, each once the
#                               one before has measured), then sleeps through it
#                               each step: for more workers than cores
#   --out=DIR [a temporary directory]   logs, reports, traces, results
#   --csv=PATH                  also append the row to PATH (header when new)
#   --prefix=NAME [psx<pid>]    names of the run's namespaces (NAME-br, NAME-s0, NAME-w0, ...)
#   --time_limit=S [1800]       every process of the run stops by itself after S seconds
#   --bin=DIR                   prebuilt daemons DIR/server/server, DIR/worker/worker (no setup, no bazel)
#   --check                     measure the link instead of training: iperf3 w0 -> s0 for
#                               --check_seconds [5], ping RTT (--ping_count [20]); OUT/check.json
# Anything after `--` goes to every worker unchanged (ddp: ddp_worker.py takes
# --mlp_hidden and --bucket_cap_mb, and refuses the rest).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# No arguments: the default sweep, its results and plots into
# deploy/experiments/sweep/ (sweep.py calls this script once per run).
if (($# == 0)); then
  exec python3 "$here/sweep.py"
fi
export PATH="$PATH:/usr/sbin:/sbin"
# shellcheck source=netns.sh
source "$here/netns.sh"

system=ps workers=2 servers=1 servers_given=0 warmup_steps=1 sample_ms=10 rate=1gbit delay=0 model=lenet dataset=fashion_mnist
model_profile="" dataset_given=0
data_dir=/usr/share/datasets/fashion-mnist batch_size=256 epochs=1 max_steps=0 lr=0.9
devices=cpu:1 compute=real chunk_bytes="" server_flags="" congestion=cubic threads="" out="" csv="" prefix="psx$$" time_limit=1800 bin="" check=0
check_seconds=5 ping_count=20
extra=()
while (($#)); do
  case "$1" in
    --workers=*) workers="${1#*=}" ;;
    --system=*) system="${1#*=}" ;;
    --servers=*) servers="${1#*=}"; servers_given=1 ;;
    --warmup_steps=*) warmup_steps="${1#*=}" ;;
    --sample_ms=*) sample_ms="${1#*=}" ;;
    --rate=*) rate="${1#*=}" ;;
    --delay=*) delay="${1#*=}" ;;
    --model=*) model="${1#*=}" ;;
    --dataset=*) dataset="${1#*=}"; dataset_given=1 ;;
    --model_profile=*) model_profile="${1#*=}" ;;
    --data_dir=*) data_dir="${1#*=}" ;;
    --batch_size=*) batch_size="${1#*=}" ;;
    --epochs=*) epochs="${1#*=}" ;;
    --max_steps=*) max_steps="${1#*=}" ;;
    --lr=*) lr="${1#*=}" ;;
    --devices=*) devices="${1#*=}" ;;
    --compute=*) compute="${1#*=}" ;;
    --server_flags=*) server_flags="${1#*=}" ;;
    --congestion=*) congestion="${1#*=}" ;;
    --chunk_bytes=*) chunk_bytes="${1#*=}" ;;
    --threads=*) threads="${1#*=}" ;;
    --out=*) out="${1#*=}" ;;
    --csv=*) csv="${1#*=}" ;;
    --prefix=*) prefix="${1#*=}" ;;
    --time_limit=*) time_limit="${1#*=}" ;;
    --bin=*) bin="${1#*=}" ;;
    --check) check=1 ;;
    --check_seconds=*) check_seconds="${1#*=}" ;;
    --ping_count=*) ping_count="${1#*=}" ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "run: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
fail() { echo "run: $*" >&2; exit 1; }
[[ "$system" == ps || "$system" == ddp ]] || fail "--system is ps or ddp"
[[ "$workers" =~ ^[1-9][0-9]*$ ]] && ((workers <= 200)) || fail "--workers must be 1..200"
[[ "$servers" =~ ^[1-9][0-9]?$ ]] || fail "--servers must be 1..99"
[[ "$warmup_steps" =~ ^[0-9]+$ ]] || fail "--warmup_steps is a whole number"
[[ "$sample_ms" =~ ^[1-9][0-9]{0,3}$ ]] || fail "--sample_ms is 1..9999"
[[ "$delay" =~ ^[0-9]+$ ]] || fail "--delay is whole milliseconds"
[[ "$time_limit" =~ ^[1-9][0-9]*$ ]] || fail "--time_limit is whole seconds"
[[ "$compute" == real || "$compute" == replay ]] || fail "--compute is real or replay"
[[ -z "$chunk_bytes" || "$chunk_bytes" =~ ^[1-9][0-9]*$ ]] || fail "--chunk_bytes is a byte count"
[[ "$check_seconds" =~ ^[1-9][0-9]?$ ]] || fail "--check_seconds is 1..99"
[[ "$ping_count" =~ ^[1-9][0-9]{0,2}$ ]] || fail "--ping_count is 1..999"
netns_valid_prefix "$prefix" || fail "--prefix must match [a-z][a-z0-9]{2,15}"
# The baseline has no servers and trains on the CPU with real compute; a
# flag it cannot honour is refused rather than ignored.
ddp_python=/usr/bin/python3  # Debian's, with python3-torch
if [[ "$system" == ddp ]]; then
  ((servers_given == 0)) || fail "--system=ddp has no server hosts: leave out --servers"
  [[ -z "$chunk_bytes" && -z "$server_flags" ]] ||
    fail "--system=ddp has no servers: leave out --chunk_bytes and --server_flags"
  [[ "$compute" == real ]] || fail "--system=ddp computes for real: leave out --compute=replay"
  [[ "$devices" == cpu:1 ]] || fail "--system=ddp trains on one CPU device: leave out --devices"
  ((check == 0)) || fail "--check measures w0 -> s0: run it without --system=ddp"
  ((max_steps > 0)) || fail "--system=ddp trains --max_steps steps: give --max_steps"
  servers=0
fi
# A profile is the worker's model and its compute: it replays the measured
# times itself, so timing the replay again (--compute=replay) would measure
# sleeps. The validator names a malformed file's field before any host is made.
if [[ -n "$model_profile" ]]; then
  [[ "$system" == ps ]] || fail "--model_profile is for our workers (--system=ps)"
  [[ "$compute" == real ]] ||
    fail "--model_profile replays the profile's times already: leave out --compute=replay"
  [[ -r "$model_profile" ]] || fail "--model_profile: cannot read $model_profile"
  python3 "$here/model_profile.py" "$model_profile" >/dev/null || fail "--model_profile is not a valid profile"
  model_profile="$(cd "$(dirname "$model_profile")" && pwd)/$(basename "$model_profile")"
  model="profile:$(basename "$model_profile" .json)"
  ((dataset_given)) || dataset=synthetic
fi
# The emulated hosts share one kernel and PID namespace: shared memory would
# carry the bytes past the shaped links this run measures.
for arg in "${extra[@]}"; do
  [[ "$arg" == --shared_memory || "$arg" == --shared_memory=true ]] &&
    fail "--shared_memory would move the tensor bytes around the emulated links; leave it out"
done
((EUID == 0)) || fail "needs root (network namespaces)"
# Real compute shares the machine's cores among the workers; a replaying
# worker times its pass alone, with all of them (an emulated host's CPU).
if [[ -z "$threads" ]]; then
  if [[ "$compute" == replay ]]; then
    threads=$(nproc)
  else
    threads=$(( $(nproc) / workers > 0 ? $(nproc) / workers : 1 ))
  fi
fi
[[ -z "$out" ]] && out=$(mktemp -d /tmp/ps-experiment.XXXXXX)
mkdir -p "$out"
out="$(cd "$out" && pwd)"

# With --bin (prebuilt daemons, as in tests) nothing is installed or built:
# the tools must be there already.
[[ -z "$bin" ]] && bash "$here/setup.sh" >/dev/null
for tool in ip tc timeout python3; do
  command -v "$tool" >/dev/null || fail "no $tool: run deploy/experiments/setup.sh"
done
if [[ "$system" == ddp ]]; then
  "$ddp_python" -c "import torch.distributed" 2>/dev/null ||
    fail "--system=ddp needs $ddp_python with PyTorch (Debian's python3-torch)"
fi
if [[ -n "$(netns_namespaces "$prefix")" ]]; then
  fail "namespaces of $prefix exist already (bash deploy/experiments/netns.sh cleanup $prefix)"
fi

# Every process the run starts is in one of its namespaces; cleanup stops
# the daemons (SIGTERM: the server writes its timeline), then netns_down
# removes whatever is left with the namespaces.
daemon_pids=()
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for pid in "${daemon_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${daemon_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  netns_down "$prefix" || rc=1
  if [[ -n "$allowed_congestion_before" ]]; then
    sysctl -qw net.ipv4.tcp_allowed_congestion_control="$allowed_congestion_before" || rc=1
  fi
  exit "$rc"
}
allowed_congestion_before=""  # the kernel's list, when this run extended it
trap cleanup EXIT
trap 'echo "run: interrupted; removing $prefix" >&2; exit 130' INT
trap 'echo "run: terminated; removing $prefix" >&2; exit 143' TERM

hosts=()
for ((s = 0; s < servers; s++)); do hosts+=("s$s"); done
for ((r = 0; r < workers; r++)); do hosts+=("w$r"); done
netns_up "$prefix" "$rate" "$delay" "$out" "$((time_limit + 30))" "${hosts[@]}" ||
  fail "could not set up the hosts"
# A namespace other than the initial one may only pick an algorithm on the
# kernel's allowed list, which need not hold the one asked for even when it
# is available (a kernel defaulting to bbr may allow just "reno bbr"): add
# it for the run, and put the list back when the run ends.
allowed_congestion=$(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control)
if [[ " $allowed_congestion " != *" $congestion "* ]]; then
  sysctl -qw net.ipv4.tcp_allowed_congestion_control="$allowed_congestion $congestion" &&
    allowed_congestion_before=$allowed_congestion
fi
for host in "${hosts[@]}"; do
  ip netns exec "$prefix-$host" sysctl -qw net.ipv4.tcp_congestion_control="$congestion" ||
    fail "cannot use TCP congestion control '$congestion' (available: $(cat /proc/sys/net/ipv4/tcp_available_congestion_control))"
done
server_address=$(netns_address 0)
if [[ "$system" == ddp ]]; then
  where="ring all-reduce (PyTorch DDP, gloo)"
else
  where="server at $server_address"
  ((servers == 1)) || where+=" (+$((servers - 1)) shards)"
fi
echo "run: $prefix: $where, $workers workers, rate $rate, delay ${delay} ms" \
     "(${NETNS_DELAY_METHOD}), TCP $congestion, out $out"

if ((check)); then
  # 1. Throughput: one iperf3 stream from worker 0 to the server, bounded
  #    in time; the server end serves one test and exits.
  ip netns exec "$prefix-s0" timeout "$((check_seconds + 30))" \
    iperf3 -s -1 -B "$server_address" >"$out/iperf3-server.log" 2>&1 &
  daemon_pids+=($!)
  sleep 0.5
  ip netns exec "$prefix-w0" timeout "$((check_seconds + 20))" \
    iperf3 -c "$server_address" -t "$check_seconds" -J >"$out/iperf3.json" ||
    fail "iperf3 failed: $(tail -n 3 "$out/iperf3.json")"
  # 2. Round trip: a bounded count of pings.
  ip netns exec "$prefix-w0" ping -q -U -c "$ping_count" -i 0.05 -W 2 "$server_address" \
    >"$out/ping.log" || fail "ping failed: $(cat "$out/ping.log")"
  python3 - "$out" "$rate" "$delay" "$NETNS_DELAY_METHOD" <<'PY'
import json, os, re, sys
out, rate, delay, method = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
units = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
m = re.fullmatch(r"(\d+)(bit|kbit|mbit|gbit)", rate)
rate_bps = int(m.group(1)) * units[m.group(2)] if m else None
iperf = json.load(open(os.path.join(out, "iperf3.json")))
measured_bps = iperf["end"]["sum_received"]["bits_per_second"]
ping = open(os.path.join(out, "ping.log")).read()
rtt = re.search(r"= ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) ms", ping)
rtt_min, rtt_avg = float(rtt.group(1)), float(rtt.group(2))
check = {
    "rate": rate, "rate_bits_per_second": rate_bps,
    "iperf3_bits_per_second": measured_bps,
    "throughput_ratio": measured_bps / rate_bps if rate_bps else None,
    "delay_ms": delay, "delay_method": method, "expected_rtt_ms": 2 * delay,
    "ping_rtt_min_ms": rtt_min, "ping_rtt_avg_ms": rtt_avg,
    "rtt_ratio": rtt_avg / (2 * delay) if delay else None,
}
with open(os.path.join(out, "check.json"), "w") as f:
    json.dump(check, f, indent=2)
ratio = f" = {check['throughput_ratio']:.3f} x {rate}" if rate_bps else " (unshaped)"
rtt_text = f" = {check['rtt_ratio']:.3f} x {2 * delay} ms" if delay else ""
print(f"check: iperf3 {measured_bps / 1e6:.1f} Mbit/s{ratio}; "
      f"ping RTT avg {rtt_avg:.3f} ms (min {rtt_min:.3f}){rtt_text}")
PY
  exit 0
fi

if [[ "$system" == ddp ]]; then
  :  # no daemons of ours
elif [[ -z "$bin" ]]; then
  (cd "$here/../.." && bazel build //server:server //worker:worker >"$out/build.log" 2>&1) ||
    fail "bazel build //server:server //worker:worker failed: $(tail -n 20 "$out/build.log")"
  bin=$(cd "$here/../.." && bazel info bazel-bin 2>/dev/null)
fi
[[ "$system" == ddp || ( -x "$bin/server/server" && -x "$bin/worker/worker" ) ]] ||
  fail "no daemons under $bin"

read_bytes() {  # host -> "tx rx" of its eth0
  ip netns exec "$prefix-$1" cat /sys/class/net/eth0/statistics/tx_bytes \
    /sys/class/net/eth0/statistics/rx_bytes | tr '\n' ' '
}

# Each server binds its namespace's address; the port is free there by
# construction. Every worker gets the same list of all of them. Plaintext
# (--insecure): the namespaces' links reach nothing but each other, and the
# experiments measure the protocol, not TLS (tests/wire_benchmark does).
port=50051
read -ra server_flag_list <<<"$server_flags"
server_pids=()
server_list=""
for ((s = 0; s < servers; s++)); do
  address=$(netns_address "$s")
  ip netns exec "$prefix-s$s" timeout -k 10 "$time_limit" "$bin/server/server" \
    --bind_address="$address" --insecure --port="$port" --port_file="$out/port-s$s" \
    --num_workers="$workers" --lr="$lr" --trace="$out/trace-s$s.json" \
    ${chunk_bytes:+--chunk_bytes="$chunk_bytes"} "${server_flag_list[@]}" >"$out/server-s$s.log" 2>&1 &
  server_pids+=($!)
  daemon_pids+=($!)
  server_list+="${server_list:+,}$address:$port"
done
for ((s = 0; s < servers; s++)); do
  for _ in $(seq 100); do [[ -s "$out/port-s$s" ]] && break; sleep 0.1; done
  [[ -s "$out/port-s$s" ]] || fail "server s$s did not start; its log: $(cat "$out/server-s$s.log")"
done

# Counters: every host link's bytes and the machine's CPU, sampled every
# --sample_ms from the bridge namespace with the daemons' clock
# (counters.py), so results.py can take them over worker 0's training
# steps only (its trace says when they ran).
ip netns exec "$prefix-br" timeout -k 5 "$((time_limit + 30))" python3 "$here/counters.py" \
  "$out/counters.txt" "${#hosts[@]}" --period_ms="$sample_ms" --time_limit="$((time_limit + 20))" \
  >"$out/counters.log" 2>&1 &
counters_pid=$!
daemon_pids+=("$counters_pid")
# The workers start once the sampler has taken its first sample: the
# window is bracketed by samples, and Python's start-up on a loaded machine
# can outlast a short run's training.
for _ in $(seq 600); do
  [[ -s "$out/counters.txt" ]] && break
  kill -0 "$counters_pid" 2>/dev/null ||
    fail "the counter sampler exited before its first sample: $(tail -n 3 "$out/counters.log")"
  sleep 0.05
done
[[ -s "$out/counters.txt" ]] || fail "the counter sampler took no sample in 30 s"
start_ns=$(date +%s%N)

# The baseline's ranks meet at rank 0's host (gloo's rendezvous, then its
# ring over the hosts' eth0); port 29500 is free there by construction.
ddp_master="$(netns_address "$servers"):29500"
worker_pids=()
for ((r = 0; r < workers; r++)); do
  if [[ "$system" == ddp ]]; then
    flags=(--rank="$r" --world_size="$workers" --master="$ddp_master" --interface=eth0
           --model="$model" --dataset="$dataset" --data_dir="$data_dir"
           --batch_size="$batch_size" --max_steps="$max_steps" --lr="$lr" --threads="$threads"
           --timeout="$time_limit" --report="$out/report-w$r.json" --trace="$out/trace-w$r.json")
    ip netns exec "$prefix-w$r" timeout -k 10 "$time_limit" "$ddp_python" "$here/ddp_worker.py" \
      "${flags[@]}" "${extra[@]}" >"$out/worker-$r.log" 2>&1 &
    worker_pids+=($!)
    daemon_pids+=($!)
    continue
  fi
  model_flags=(--model="$model")
  [[ -n "$model_profile" ]] && model_flags=(--model=profile --model_profile="$model_profile")
  flags=(--server="$server_list" --worker_id="w$r" --rank="$r" "${model_flags[@]}"
         --dataset="$dataset" --data_dir="$data_dir" --batch_size="$batch_size"
         --epochs="$epochs" --max_steps="$max_steps" --devices="$devices" --threads="$threads"
         --evaluate=false --progress=false --report="$out/report-w$r.json"
         --trace="$out/trace-w$r.json" --compute="$compute")
  ip netns exec "$prefix-w$r" timeout -k 10 "$time_limit" "$bin/worker/worker" \
    "${flags[@]}" "${extra[@]}" >"$out/worker-$r.log" 2>&1 &
  worker_pids+=($!)
  daemon_pids+=($!)
  if [[ "$compute" == replay ]]; then
    # The next worker starts once this one has timed its pass, so each
    # measures alone (the ones before it wait for it at their first step).
    for _ in $(seq 1200); do
      grep -q "replaying compute" "$out/worker-$r.log" 2>/dev/null && break
      kill -0 "$!" 2>/dev/null || fail "worker $r exited before measuring: $(tail -n 3 "$out/worker-$r.log")"
      sleep 0.05
    done
    grep -q "replaying compute" "$out/worker-$r.log" || fail "worker $r did not measure its pass in 60 s"
  fi
done
echo "run: $workers workers training"

status=0
live=("${worker_pids[@]}")
while ((${#live[@]})); do
  finished=""
  if wait -n -p finished "${live[@]}"; then rc=0; else rc=$?; fi
  if ((rc != 0)); then
    status=1
    echo "run: worker process $finished failed (exit $rc); stopping the run." >&2
    tail -n 5 "$out"/worker-*.log "$out"/server-s*.log >&2 2>/dev/null || true
    break
  fi
  next=()
  for pid in "${live[@]}"; do [[ "$pid" != "$finished" ]] && next+=("$pid"); done
  live=("${next[@]}")
done
((status == 0)) || exit 1

end_ns=$(date +%s%N)
kill -TERM "$counters_pid" 2>/dev/null || true
wait "$counters_pid" || echo "run: the counter sampler exited with $?" >&2
# Each host's TCP loss recovery over the whole run (the namespace is the
# run's own, so its counters start at 0): segments sent again after a drop
# at a link's queue, and retransmission timeouts. Behind tbf these are what
# a slow run of the same command differs by.
for host in "${hosts[@]}"; do
  ip netns exec "$prefix-$host" nstat -az TcpRetransSegs TcpExtTCPTimeouts 2>/dev/null |
    awk 'NR > 1 {print $1, $2}' >"$out/tcp-$host.txt" || true
done

# The servers write their timelines when stopped.
traces=()
for ((s = 0; s < servers; s++)); do
  kill -TERM "${server_pids[$s]}" 2>/dev/null || true
  wait "${server_pids[$s]}" || echo "run: server s$s exited with $? when stopped" >&2
  traces+=("$out/trace-s$s.json")
done
for ((r = 0; r < workers; r++)); do traces+=("$out/trace-w$r.json"); done
python3 "$here/../trace/merge_traces.py" -o "$out/trace.json" "${traces[@]}" >"$out/merge.log" 2>&1 ||
  fail "merging the timelines failed: $(cat "$out/merge.log")"

python3 "$here/results.py" --out="$out" --prefix="$prefix" --workers="$workers" \
  --servers="$servers" --warmup_steps="$warmup_steps" --rate="$rate" \
  --delay="$delay" --delay_method="$NETNS_DELAY_METHOD" --congestion="$congestion" \
  --model="$model" --dataset="$dataset" \
  --batch_size="$batch_size" --epochs="$epochs" --max_steps="$max_steps" --compute="$compute" \
  --run_window_ns="$((end_ns - start_ns))" --subnet="$NETNS_SUBNET" --system="$system" \
  ${csv:+--csv="$csv"}
