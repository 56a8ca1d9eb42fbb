#!/usr/bin/env bash
# The test command: installs whatever the tests need and is missing
# (`deploy/setup.sh test`: the main set plus the test tools), builds the CPU
# container images that compose_test and k8s_play_test run (kept when their
# inputs are unchanged: deploy/images/build.sh --if_changed), then runs every
# test and ends with a one-line count ("N passed, N failed"). Extra arguments
# go to `bazel test` (e.g. --config=cpu_only); a --disk_cache=DIR among them
# goes to the images' build too. --test_tag_filters=-benchmark,-container
# leaves the container tests out (the images are built all the same).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh test
image_args=(--no-gpu --if_changed)
for arg in "$@"; do
  case "$arg" in --disk_cache=*) image_args+=("$arg") ;; esac
done
bash deploy/images/build.sh "${image_args[@]}"
log=$(mktemp /tmp/ps-test.XXXXXX)
trap 'rm -f "$log"' EXIT
rc=0
bazel test "$@" //... 2>&1 | tee "$log" || rc=$?
passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log" || true)
failed=$(grep -cE '^//[^ ]+ +(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD)' "$log" || true)
echo "${passed} passed, ${failed} failed"
exit "$rc"
