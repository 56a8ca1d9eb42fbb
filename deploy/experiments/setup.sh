#!/usr/bin/env bash
# Installs what the network experiments need (packages.sh: iproute2,
# iptables, libnetfilter-queue-dev, gcc, iperf3, ping, python3) together
# with the build's own packages (run.sh builds the daemons with bazel):
# deploy/setup.sh holds the one idempotent installer and takes the
# experiments' list from packages.sh. Run as root.
set -euo pipefail
exec bash "$(dirname "$0")/../setup.sh"
