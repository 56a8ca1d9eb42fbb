#!/bin/sh
# Runs ps_torch_test.py with Debian's python3 (PyTorch 1.13; Bazel 4.2.3's
# py_test stub runs `python`, which Debian 12 does not install).
exec /usr/bin/python3 "$(dirname "$0")/ps_torch_test.py" "$@"
