#!/bin/sh
# Runs simulate_test.py with Debian's python3 (python3-simgrid; Bazel 4.2.3's
# py_test stub runs `python`, which Debian 12 does not install).
exec /usr/bin/python3 "$(dirname "$0")/simulate_test.py" "$@"
