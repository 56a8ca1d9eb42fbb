#!/usr/bin/env bash
# Starts S parameter-server shards and W workers on loopback, trains to the end,
# prints the final accuracy and stops everything it started: also on Ctrl-C,
# and as soon as any process fails.
#
#   deploy/local_cluster.sh                      # LeNet, Fashion-MNIST, 2 workers
#   deploy/local_cluster.sh --workers=1 --epochs=1 --model=mlp
#   deploy/local_cluster.sh --servers=2         # the model cut over 2 shards
#
# It installs what the job needs first (`deploy/setup.sh main`: the build
# toolchain, the libraries and the data, nothing test-only) and builds the
# daemons with Bazel, unless --bin names daemons built already.
#
# Flags (defaults in brackets):
#   --workers=W [2]           worker processes
#   --servers=S [1]           server shards, each on its own free port; every
#                             worker gets the list and cuts the model over them
#   --devices=SPEC [cpu:1]    devices of each worker (cpu:N, cuda, cuda:0,1)
#   --threads=N [cores/W]     CPU threads of each worker
#   --model=NAME [lenet]      softmax, mlp, lenet, lenet_relu, resnet18,
#                             resnet18_cifar
#   --epochs=N [10] --batch_size=B [256, global] --lr=X [0.9]
#   --steps=N [0: all]        stop after N steps in all (the workers'
#                             --max_steps); the last epoch is cut short
#   --momentum=X [0] --weight_decay=X [0] --seed=N [0]
#   --dataset=NAME [fashion_mnist] --data_dir=DIR [/usr/share/datasets/fashion-mnist]
#   --port=P [0: any free port; shard s of several: P + s]
#   --logs=DIR [a temporary directory]
#   --bin=DIR                 run DIR/server/server and DIR/worker/worker,
#                             built already (e.g. a test's runfiles): nothing
#                             is installed or built [deploy/setup.sh main,
#                             then bazel build, then bazel-bin]
#   --report=PATH             worker 0's JSON report
#   --checkpoint_dir=DIR      server checkpoints (resumed from at start when
#                             it holds some) [LOGS/checkpoints with
#                             --restart_server, else none]
#   --checkpoint_every_steps=N [100]
#   --restart_server          when the server dies while workers train, start
#                             it again on its port: it resumes from its newest
#                             checkpoint and the workers roll back to it (one
#                             server shard only)
#   --consistency=MODE [sync] the servers' sync, async or ssp:S
#   --loss_scale=MODE [none]  the servers' none or dynamic (for workers with
#                             -- --precision=fp16: the servers scale the loss)
#   --slowdown=F [1]          the last worker emulates a host F times slower at
#                             compute (worker --slowdown), for experiments
#   --slowdown_period=P [0]   with --slowdown: every worker is slowed, in turns
#                             of P steps (a straggler that moves)
# Anything after `--` goes to every worker unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

workers=2 servers=1 devices=cpu:1 threads="" model=lenet epochs=10 steps=0 batch_size=256 lr=0.9
momentum=0 weight_decay=0 seed=0 dataset=fashion_mnist
data_dir=/usr/share/datasets/fashion-mnist port=0 logs="" report="" bin=""
checkpoint_dir="" checkpoint_every_steps=100 restart_server=0 consistency=sync loss_scale=none slowdown=1
slowdown_period=0
extra=()
# Every --name=value flag sets the variable of its name; the defaults above
# are the list of them.
value_flags=" workers servers devices threads model epochs steps batch_size lr momentum weight_decay seed dataset data_dir port logs bin report checkpoint_dir checkpoint_every_steps consistency loss_scale slowdown slowdown_period "
while (($#)); do
  case "$1" in
    --restart_server) restart_server=1 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    --*=*)
      name="${1%%=*}" && name="${name#--}"
      if [[ "$value_flags" != *" $name "* ]]; then
        echo "local_cluster: unknown flag $1 (see --help)" >&2; exit 2
      fi
      printf -v "$name" '%s' "${1#*=}" ;;
    *) echo "local_cluster: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if ! [[ "$servers" =~ ^[1-9][0-9]*$ ]]; then
  echo "local_cluster: --servers must be a positive integer, got '$servers'" >&2; exit 2
fi
if ! [[ "$steps" =~ ^[0-9]+$ ]]; then
  echo "local_cluster: --steps must be a non-negative integer, got '$steps'" >&2; exit 2
fi
if ((restart_server && servers > 1)); then
  echo "local_cluster: --restart_server takes one server shard (--servers=1)" >&2; exit 2
fi
if [[ -z "$bin" ]]; then
  bash deploy/setup.sh main >/dev/null
  bazel build //server:server //worker:worker 2>&1 | tail -n 3
  bin=$(bazel info bazel-bin 2>/dev/null)
fi
for daemon in server/server worker/worker; do
  if [[ ! -x "$bin/$daemon" ]]; then
    echo "local_cluster: no $daemon under $bin" >&2; exit 2
  fi
done
[[ -z "$threads" ]] && threads=$(( $(nproc) / workers > 0 ? $(nproc) / workers : 1 ))
[[ -z "$logs" ]] && logs=$(mktemp -d /tmp/ps-cluster.XXXXXX)
mkdir -p "$logs"
((restart_server)) && [[ -z "$checkpoint_dir" ]] && checkpoint_dir="$logs/checkpoints"


pids=()
cleanup() {
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'echo "local_cluster: interrupted" >&2; exit 130' INT TERM

# Each server is told only the job's size and the optimizer: the workers
# state the model (worker 0 sends its seeded initial parameters) and the steps
# per epoch. With several shards each is an ordinary server; the workers cut
# the model over them, so every shard gets its part of the model.
addresses=()
server_pids=()
server_flags=(--num_workers="$workers" --lr="$lr" --momentum="$momentum"
              --weight_decay="$weight_decay" --consistency="$consistency"
              --loss_scale="$loss_scale")
[[ -n "$checkpoint_dir" ]] && server_flags+=(--checkpoint_dir="$checkpoint_dir"
                                             --checkpoint_every_steps="$checkpoint_every_steps")
# start_server S PORT: starts shard S on PORT (0: any free one), appending to
# its log, and sets started_port to the port it bound.
start_server() {
  local s=$1 shard_port=$2 name=server port_file="$logs/port"
  ((servers > 1)) && name="server-$s" port_file="$logs/server-$s.port"
  rm -f "$port_file"  # a reused --logs folder holds the last run's port
  "$bin/server/server" --port="$shard_port" --port_file="$port_file" "${server_flags[@]}" \
    >>"$logs/$name.log" 2>&1 &
  server_pids[s]=$!
  pids+=($!)
  for _ in $(seq 100); do [[ -s "$port_file" ]] && break; sleep 0.1; done
  if [[ ! -s "$port_file" ]]; then
    echo "local_cluster: $name did not start; its log:" >&2; cat "$logs/$name.log" >&2; exit 1
  fi
  started_port=$(cat "$port_file")
}
for ((s = 0; s < servers; s++)); do
  shard_port=$port; ((port != 0 && servers > 1)) && shard_port=$((port + s))
  start_server "$s" "$shard_port"
  addresses+=("127.0.0.1:$started_port")
done
address=$(IFS=,; echo "${addresses[*]}")
if ((servers > 1)); then
  echo "local_cluster: $servers server shards at $address, $workers workers, logs in $logs"
else
  echo "local_cluster: server at $address, $workers workers, logs in $logs"
fi

worker_pids=()
for ((r = 0; r < workers; r++)); do
  flags=(--server="$address" --worker_id="worker-$r" --rank="$r" --model="$model" --dataset="$dataset"
         --data_dir="$data_dir" --batch_size="$batch_size" --epochs="$epochs" --max_steps="$steps"
         --seed="$seed" --devices="$devices" --threads="$threads" --progress=false)
  ((r == 0)) && [[ -n "$report" ]] && flags+=(--report="$report")
  ((r != 0)) && flags+=(--evaluate=false)
  if [[ "$slowdown" != 1 ]] && ((slowdown_period > 0 || r == workers - 1)); then
    flags+=(--slowdown="$slowdown" --slowdown_period="$slowdown_period")
  fi
  # The log exists before the worker starts: the progress tail below opens
  # it at once, and a background job's redirection happens in the child,
  # after the parent has moved on (tail lost that race and showed nothing).
  : >"$logs/worker-$r.log"
  "$bin/worker/worker" "${flags[@]}" "${extra[@]}" >>"$logs/worker-$r.log" 2>&1 &
  worker_pids+=($!)
  pids+=($!)
done
# Show worker 0's progress as it goes.
tail -n +1 -s 0.2 -f "$logs/worker-0.log" --pid="${worker_pids[0]}" &
tail_pid=$!
pids+=($tail_pid)

# Stop everything as soon as one worker fails; otherwise wait for all. With
# --restart_server a server that dies is started again on its port.
status=0
live=("${worker_pids[@]}")
while ((${#live[@]})); do
  finished=""
  if wait -n -p finished "${live[@]}" "${server_pids[@]}"; then rc=0; else rc=$?; fi
  shard=-1
  for s in "${!server_pids[@]}"; do [[ "$finished" == "${server_pids[s]}" ]] && shard=$s; done
  if ((shard >= 0)); then
    if ((restart_server)); then
      echo "local_cluster: the server exited (status $rc); restarting it on port ${addresses[0]##*:}" >&2
      start_server 0 "${addresses[0]##*:}"
      continue
    fi
    status=1
    echo "local_cluster: server shard $shard exited (status $rc); stopping the cluster." >&2
    tail -n 5 "$logs"/server*.log >&2
    break
  fi
  if ((rc != 0)); then
    status=1
    echo "local_cluster: worker process $finished failed (exit $rc); stopping the cluster." >&2
    tail -n 5 "$logs"/worker-*.log "$logs"/server*.log >&2
    break
  fi
  next=()
  for pid in "${live[@]}"; do [[ "$pid" != "$finished" ]] && next+=("$pid"); done
  live=("${next[@]}")
done
if ((status == 0)); then
  # The progress tail prints worker 0's last lines and exits once it sees
  # that worker gone (within its 0.2 s poll).
  wait "$tail_pid" 2>/dev/null || true
  echo "local_cluster: done; logs in $logs"
fi
exit $status
