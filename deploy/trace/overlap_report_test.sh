#!/bin/sh
# Runs overlap_report_test.py with the system's python3 (Bazel 4.2.3's py_test
# stub runs `python`, which Debian 12 does not install).
exec python3 "$(dirname "$0")/overlap_report_test.py" "$@"
