#!/usr/bin/env bash
# Installs what the network experiments need: the build's main set (run.sh
# builds the daemons with bazel) and the experiments' own tools
# (packages.sh: iproute2, iptables, libnetfilter-queue-dev, gcc, iperf3,
# ping, python3, matplotlib, simgrid), through deploy/setup.sh's one idempotent
# installer. Run as root.
set -euo pipefail
exec bash "$(dirname "$0")/../setup.sh" experiments
