#!/bin/sh
# Runs the test script given first with Debian's python3 (PyTorch 1.13;
# Bazel 4.2.3's py_test stub runs `python`, which Debian 12 does not install).
script="$1"
shift
exec /usr/bin/python3 "$script" "$@"
