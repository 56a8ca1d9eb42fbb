#!/usr/bin/env bash
# The test command: installs whatever is missing, then runs every test.
# Extra arguments go to `bazel test` (e.g. --config=cpu_only).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
bazel test "$@" //...
