#!/usr/bin/env bash
# Emulated hosts and links for the network experiments: one network
# namespace per host and one bridge namespace (the switch) between them,
# each host joined to the bridge by a veth pair, addresses from a private
# range that exists only inside these namespaces.
#
#   host namespace PREFIX-NAME      eth0  SUBNET.(2+i)/24
#        | veth (both ends shaped: egress of eth0 = the host's uplink,
#        |       egress of the bridge end vI = its downlink)
#   bridge namespace PREFIX-br      br0 with v0, v1, ...
#
# Sourced by run.sh for its functions (netns_up, netns_down); run alone it
# removes what a run left behind:
#
#   bash deploy/experiments/netns.sh cleanup PREFIX   # namespaces, links, qdiscs,
#                                                     # rules, processes of a run
#   bash deploy/experiments/netns.sh list             # prefixes of runs still present
#
# Everything a run creates lives inside its namespaces: the veths, the
# qdiscs, the iptables rules and the delay processes (ip netns exec). So
# removing a run is: stop every process in its namespaces, then delete the
# namespaces, which deletes the rest with them. Nothing is added to the
# machine's own namespace.
#
# Shaping: `--rate` is each host's link rate in each direction, a tc tbf on
# both ends of its veth (tbf, not htb or netem: see README.md for what this
# kernel has). Delay: `--delay=D` ms is the one-way latency between any two
# hosts (ping RTT 2D), added where each packet arrives at its host: with
# netem where the kernel has it (on the bridge end of the veth), otherwise
# by an NFQUEUE rule in the host's PREROUTING served by nfq_delay.c. When
# neither works the run is refused, never run without its delay.

# Sizes of one run: names must fit the kernel's 15 characters for
# interfaces only inside the namespaces (eth0, vN), so prefixes are free up
# to the check below.
NETNS_SUBNET="${NETNS_SUBNET:-10.213.0}"
NETNS_DELAY_METHOD=""   # netem | nfqueue | none, set by netns_up

netns_log() { echo "netns: $*" >&2; }

# netns_valid_prefix PREFIX: a lowercase name, so cleanup can never match
# anything but a run's own namespaces.
netns_valid_prefix() {
  [[ "$1" =~ ^[a-z][a-z0-9]{2,15}$ ]]
}

# Bytes per second of a tc rate ("100mbit", "1gbit", "500kbit", "10000000bit").
netns_rate_bytes() {
  local r="$1" n unit
  if [[ ! "$r" =~ ^([0-9]+)(bit|kbit|mbit|gbit)$ ]]; then return 1; fi
  n="${BASH_REMATCH[1]}" unit="${BASH_REMATCH[2]}"
  case "$unit" in
    bit) echo $((n / 8)) ;;
    kbit) echo $((n * 1000 / 8)) ;;
    mbit) echo $((n * 1000000 / 8)) ;;
    gbit) echo $((n * 1000000000 / 8)) ;;
  esac
}

# netns_tbf NAMESPACE DEV RATE: one tbf as DEV's root qdisc. The bucket
# holds 4 ms at the rate and at least two 64 KiB GSO packets (a smaller
# bucket than one such packet makes tbf segment every packet); 20 ms of
# queue before it drops.
netns_tbf() {
  local ns="$1" dev="$2" rate="$3" bps burst
  bps=$(netns_rate_bytes "$rate") || { netns_log "bad rate $rate"; return 1; }
  burst=$((bps / 250))
  ((burst < 131072)) && burst=131072
  tc -n "$ns" qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 20ms
}

# True when this kernel has netem (here it has not: "Specified qdisc kind
# is unknown"). Tried on the bridge namespace's loopback, then removed.
netns_have_netem() {
  local ns="$1"
  if tc -n "$ns" qdisc add dev lo root netem delay 1ms 2>/dev/null; then
    tc -n "$ns" qdisc del dev lo root 2>/dev/null
    return 0
  fi
  return 1
}

# netns_build_delayer WORKDIR: compiles nfq_delay.c into WORKDIR; prints its path.
netns_build_delayer() {
  local dir="$1" src
  src="$(dirname "${BASH_SOURCE[0]}")/nfq_delay.c"
  if ! gcc -O2 -Wall -o "$dir/nfq_delay" "$src" -lnetfilter_queue -lnfnetlink \
      >"$dir/nfq_delay.build.log" 2>&1; then
    netns_log "cannot build $src (libnetfilter-queue-dev from deploy/experiments/setup.sh?):"
    cat "$dir/nfq_delay.build.log" >&2
    return 1
  fi
  echo "$dir/nfq_delay"
}

# netns_up PREFIX RATE DELAY_MS WORKDIR TIME_LIMIT_S HOST...
# Creates the bridge and one namespace per HOST (PREFIX-HOST, address
# SUBNET.2, .3, ... in order), shaped to RATE ("unshaped": no qdisc) with
# DELAY_MS one-way (0: none). Delay processes stop by themselves after
# TIME_LIMIT_S. Prints nothing; on failure says why and returns non-zero,
# leaving the removal to the caller's netns_down.
netns_up() {
  local prefix="$1" rate="$2" delay_ms="$3" workdir="$4" time_limit="$5"
  shift 5
  local br="$prefix-br" i=0 host ns delayer=""
  netns_valid_prefix "$prefix" || { netns_log "bad prefix '$prefix'"; return 1; }
  if [[ "$rate" != unshaped ]]; then
    netns_rate_bytes "$rate" >/dev/null || { netns_log "bad rate '$rate' (e.g. 100mbit, 1gbit, unshaped)"; return 1; }
  fi

  ip netns add "$br" || { netns_log "cannot create network namespace $br"; return 1; }
  ip -n "$br" link set lo up
  ip -n "$br" link add br0 type bridge
  ip -n "$br" link set br0 up

  NETNS_DELAY_METHOD=none
  if [[ "$delay_ms" != 0 ]]; then
    if netns_have_netem "$br"; then
      NETNS_DELAY_METHOD=netem
    elif command -v iptables-legacy >/dev/null; then
      delayer=$(netns_build_delayer "$workdir") || return 1
      NETNS_DELAY_METHOD=nfqueue
    else
      netns_log "no netem in this kernel and no iptables-legacy for the NFQUEUE delayer: cannot emulate --delay=$delay_ms; refusing to run"
      return 1
    fi
  fi

  for host in "$@"; do
    ns="$prefix-$host"
    ip netns add "$ns" || { netns_log "cannot create network namespace $ns"; return 1; }
    ip -n "$br" link add "v$i" type veth peer name eth0 netns "$ns"
    ip -n "$br" link set "v$i" master br0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$NETNS_SUBNET.$((i + 2))/24" dev eth0
    ip -n "$ns" link set eth0 up
    case "$NETNS_DELAY_METHOD" in
      netem)
        # Downlink: netem holds arrivals, tbf below it shapes them.
        tc -n "$br" qdisc add dev "v$i" root handle 1: netem delay "${delay_ms}ms" limit 100000
        if [[ "$rate" != unshaped ]]; then
          local bps burst
          bps=$(netns_rate_bytes "$rate"); burst=$((bps / 250)); ((burst < 131072)) && burst=131072
          tc -n "$br" qdisc add dev "v$i" parent 1: handle 2: tbf rate "$rate" burst "$burst" latency 20ms
        fi
        ;;
      *)
        [[ "$rate" != unshaped ]] && { netns_tbf "$br" "v$i" "$rate" || return 1; }
        ;;
    esac
    [[ "$rate" != unshaped ]] && { netns_tbf "$ns" eth0 "$rate" || return 1; }
    if [[ "$NETNS_DELAY_METHOD" == nfqueue ]]; then
      # The delayer first, bound to its queue, then the rule that feeds it
      # (without --queue-bypass: if the delayer dies, traffic stops rather
      # than flowing undelayed).
      netns_start_delayer "$ns" "$delayer" "$((delay_ms * 1000))" "$time_limit" \
        "$workdir/nfq_delay-$host.log" || return 1
      if ! ip netns exec "$ns" iptables-legacy -t mangle -A PREROUTING -i eth0 -j NFQUEUE --queue-num 0; then
        netns_log "cannot add the NFQUEUE rule in $ns: cannot emulate --delay=$delay_ms; refusing to run"
        return 1
      fi
    fi
    i=$((i + 1))
  done
  if [[ "$NETNS_DELAY_METHOD" == nfqueue && $# -ge 2 ]]; then
    netns_compensate_delayers "$prefix" "$delayer" "$delay_ms" "$time_limit" "$workdir" "$@" ||
      return 1
  fi
}

# netns_start_delayer NS DELAYER DELAY_US TIME_LIMIT LOG: starts the delayer
# in NS bound to queue 0 and waits until it is.
netns_start_delayer() {
  local ns="$1" delayer="$2" delay_us="$3" time_limit="$4" log="$5" bound=0
  ip netns exec "$ns" timeout -k 5 "$time_limit" "$delayer" -q 0 -d "$delay_us" \
    -t "$time_limit" >"$log" 2>&1 &
  for _ in $(seq 50); do
    grep -q "^nfq_delay: queue" "$log" 2>/dev/null && { bound=1; break; }
    sleep 0.1
  done
  ((bound)) || { netns_log "the delayer in $ns did not start:"; cat "$log" >&2; return 1; }
}

# netns_compensate_delayers PREFIX DELAYER DELAY_MS TIME_LIMIT WORKDIR HOSTS...:
# the delayer's own path (the trip to user space and back, its wake-up)
# adds to every packet's delay: measured here as the ping RTT between the
# first two hosts beyond 2 x DELAY_MS, and taken off again by restarting
# each delayer with that much less (half each way). Before any daemon runs,
# so only the delayers are stopped; the NFQUEUE rules stay (no bypass:
# packets wait for the new delayers). Says what it measured in
# WORKDIR/delay_compensation.txt.
netns_compensate_delayers() {
  local prefix="$1" delayer="$2" delay_ms="$3" time_limit="$4" workdir="$5"
  shift 5
  local rtt excess_us host ns p
  rtt=$(ip netns exec "$prefix-$1" ping -q -U -c 20 -i 0.01 -W 1 "$(netns_address 1)" 2>/dev/null |
        sed -n 's|.*= [0-9.]*/\([0-9.]*\)/.*|\1|p')
  [[ -n "$rtt" ]] || { netns_log "cannot ping between the hosts to measure the delayer's path"; return 1; }
  excess_us=$(awk -v r="$rtt" -v d="$delay_ms" 'BEGIN { e = (r - 2 * d) * 1000; print (e > 0 ? int(e / 2) : 0) }')
  echo "ping RTT $rtt ms for 2 x $delay_ms ms; each delayer holds $excess_us us less" \
    >"$workdir/delay_compensation.txt"
  ((excess_us > 0)) || return 0
  ((excess_us < delay_ms * 1000)) || excess_us=$((delay_ms * 1000 - 1))
  for host in "$@"; do
    ns="$prefix-$host"
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$p" 2>/dev/null || true; done
    for _ in $(seq 50); do [[ -z "$(ip netns pids "$ns" 2>/dev/null)" ]] && break; sleep 0.05; done
    netns_start_delayer "$ns" "$delayer" "$((delay_ms * 1000 - excess_us))" "$time_limit" \
      "$workdir/nfq_delay-$host.log" || return 1
  done
}

# netns_address INDEX: the address of the INDEX-th host given to netns_up.
netns_address() { echo "$NETNS_SUBNET.$(($1 + 2))"; }

# netns_namespaces PREFIX: the namespaces of a run, one a line.
netns_namespaces() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$1-" || true
}

# netns_down PREFIX: stops every process inside the run's namespaces
# (SIGTERM, then SIGKILL after 5 s) and deletes the namespaces, which takes
# their veths, qdiscs and iptables rules with them.
netns_down() {
  local prefix="$1" ns pids=() p
  netns_valid_prefix "$prefix" || { netns_log "bad prefix '$prefix'"; return 1; }
  for ns in $(netns_namespaces "$prefix"); do
    for p in $(ip netns pids "$ns" 2>/dev/null); do pids+=("$p"); done
  done
  if ((${#pids[@]})); then
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for _ in $(seq 50); do
      local alive=0
      for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
      ((alive)) || break
      sleep 0.1
    done
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  fi
  # Hosts first, then the bridge: each deletion takes its veth pair along.
  for ns in $(netns_namespaces "$prefix" | grep -v -- "-br$"); do ip netns del "$ns" 2>/dev/null || true; done
  ip netns del "$prefix-br" 2>/dev/null || true
  local left
  left=$(netns_namespaces "$prefix")
  if [[ -n "$left" ]]; then netns_log "could not remove: $left"; return 1; fi
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  export PATH="$PATH:/usr/sbin:/sbin"
  case "${1:-}" in
    cleanup)
      [[ $# -eq 2 ]] || { echo "usage: netns.sh cleanup PREFIX" >&2; exit 2; }
      netns_down "$2"
      echo "netns: removed every namespace of $2"
      ;;
    list)
      ip netns list 2>/dev/null | awk '{print $1}' | sed -n 's/-br$//p'
      ;;
    *)
      sed -n '2,17p' "$0" | sed -e 's/^# //' -e 's/^#$//'
      exit 2
      ;;
  esac
fi
