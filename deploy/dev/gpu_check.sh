#!/usr/bin/env bash
# The GPU check: everything that needs a GPU, as a bundle built here and run
# on the GPU machine (which has no Bazel, no apt, no network and a C library
# of its own). From the repository root or anywhere:
#
#   bash deploy/dev/gpu_check.sh build [ARGS]   # here: deploy/dev/gpu/build_bundle.sh
#   bash deploy/dev/gpu_check.sh run [ARGS]     # there: deploy/dev/gpu/run_bundle.sh
#   bash deploy/dev/gpu_check.sh                # build where Bazel and nvcc are,
#                                               # else run the bundle found
#
# With the device tool (a session lent a GPU machine): build here, then
#   run  carry ["out/gpu_bundle"]  timeout_s 360
#        command "bash deploy/dev/gpu_check.sh run --out=$OUT"
# The run (at most 5 minutes: --budget=300) prints the GPU, runs every
# bundled GPU test, LeNet and the seed's ResNet-18 (D2L 13.6) training on one GPU and on two
# logical devices sharing it, the same models in that machine's PyTorch, a
# server with two workers, and the CPU benchmarks; it writes summary.txt,
# summary.json and logs.tar.gz to $OUT. See deploy/dev/gpu/run_bundle.sh --help
# for its parts and exit statuses, deploy/dev/gpu/build_bundle.sh --help for
# what the bundle holds; deploy/dev/gpu/check_bundle_in_container.sh runs it in
# a bare Debian container (no GPU: the GPU cases skip).
#
# Idempotent: a rebuild builds what changed and replaces the bundle whole; a
# rerun of the same bundle unpacks nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-auto}
[[ $# -gt 0 ]] && shift
if [[ "$mode" == auto ]]; then
  if command -v bazel > /dev/null && [[ -x "${CUDA_PATH:-/usr/local/cuda}/bin/nvcc" ]]; then
    mode=build
  elif [[ -d out/gpu_bundle ]]; then
    mode=run
  else
    echo "gpu_check: neither Bazel with the CUDA toolkit (to build the bundle) nor a bundle at" >&2
    echo "  out/gpu_bundle (to run it) here; build it where the toolkit is and carry it" >&2
    exit 3
  fi
fi
case "$mode" in
  build) exec bash deploy/dev/gpu/build_bundle.sh "$@" ;;
  run) exec bash deploy/dev/gpu/run_bundle.sh --bundle=out/gpu_bundle "$@" ;;
  -h|--help) sed -n '2,24p' "$0" | sed -e 's/^# //' -e 's/^#$//' ;;
  *) echo "gpu_check: build or run, not '$mode' (see --help)" >&2; exit 2 ;;
esac
