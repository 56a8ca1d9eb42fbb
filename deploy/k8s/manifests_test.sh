#!/bin/sh
# Runs manifests_test.py with the system's python3 (Debian's, which has
# python3-yaml). A py_test would not start here: Bazel 4.2.3's Python stub
# runs `python`, which Debian 12 does not install.
exec python3 "$(dirname "$0")/manifests_test.py" "$@"
