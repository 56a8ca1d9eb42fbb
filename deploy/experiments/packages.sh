# The Debian 12 packages of the network experiments, sourced by
# deploy/setup.sh (one installer, one apt-get update for everything).
# shellcheck disable=SC2034  # used by the script that sources this
EXPERIMENT_PACKAGES=(
  iproute2                # ip netns, veth, bridge, tc tbf, nstat
  iptables                # iptables-legacy: the NFQUEUE rule of --delay (nft has no queue support here)
  libnetfilter-queue-dev  # nfq_delay.c, the delayer (no netem in this kernel)
  gcc libc6-dev           # builds nfq_delay.c
  iperf3 iputils-ping     # run.sh --check
  python3                 # results.py, counters.py, sweep.py, model.py
  python3-matplotlib      # plot.py (Agg backend, no display)
)
