#!/usr/bin/env bash
# The test command: installs whatever the tests need and is missing
# (`deploy/setup.sh test`: the main set plus the test tools), then runs every
# test and ends with a one-line count ("N passed, N failed"). Extra arguments
# go to `bazel test` (e.g. --config=cpu_only).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh test
log=$(mktemp /tmp/ps-test.XXXXXX)
trap 'rm -f "$log"' EXIT
rc=0
bazel test "$@" //... 2>&1 | tee "$log" || rc=$?
passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log" || true)
failed=$(grep -cE '^//[^ ]+ +(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD)' "$log" || true)
echo "${passed} passed, ${failed} failed"
exit "$rc"
