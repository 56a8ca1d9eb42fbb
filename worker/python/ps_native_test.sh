#!/bin/sh
# Runs ps_native_test.py with Debian's python3 (Bazel 4.2.3's py_test stub
# runs `python`, which Debian 12 does not install; the `python3` first on
# some PATHs is another one).
exec /usr/bin/python3 "$(dirname "$0")/ps_native_test.py" "$@"
