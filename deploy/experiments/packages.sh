# The Debian 12 packages of the network experiments, on top of the build's
# main set: sourced by deploy/setup.sh for its experiments and test sets
# (one installer, one apt-get update for everything).
# shellcheck disable=SC2034  # used by the script that sources this
EXPERIMENT_PACKAGES=(
  iproute2                # ip netns, veth, bridge, tc tbf, nstat
  iptables                # iptables-legacy: the NFQUEUE rule of --delay (nft has no queue support here)
  libnetfilter-queue-dev  # nfq_delay.c, the delayer (no netem in this kernel)
  gcc libc6-dev           # builds nfq_delay.c
  iperf3 iputils-ping     # run.sh --check
  python3                 # results.py, counters.py, sweep.py, model.py
  python3-matplotlib      # plot.py (Agg backend, no display)
  python3-simgrid         # simulate.py: the flow-level simulator (SimGrid 3.32) for 64-2,048 workers
)
