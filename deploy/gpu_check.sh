#!/usr/bin/env bash
# One prepared pass over everything that needs a GPU, for a session that has a
# CUDA machine: run it once, from the repository root or anywhere,
#
#   bash deploy/gpu_check.sh
#
# Steps (each logged to its own file, and a summary at the end):
#   1. deploy/setup.sh: the build dependencies from apt. A bare machine
#      without an apt mirror cannot get Bazel; the script then stops with a
#      message saying so.
#   2. nvidia-smi, nvcc and NCCL versions.
#   3. bazel test //kernels/... //worker/... //tests/...: the GPU tests run
#      instead of skipping; the summary lists any test that still skipped
#      for want of a GPU.
#   4. //kernels:kernels_benchmark, //worker:trainer_benchmark --models=lenet.
#   5. A short GPU training run on one GPU (--devices=cuda) and on two logical
#      devices sharing GPU 0 (--devices=cuda:0,0), with JSON reports.
#
# Logs go to $OUT when it is set (the device tool's output folder), else to
# /tmp/gpu_check.<time>. The whole pass keeps to a time budget
# (GPU_CHECK_BUDGET_S, default 450 s): each step gets what is left, and steps
# that no longer fit are skipped and named in the summary. A failed step does
# not stop the later ones. Exit status: 0 when the tests passed, 1 otherwise.

set -u

cd "$(dirname "$0")/.." || exit 1
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET_S:-450}
LOGS=${OUT:-/tmp/gpu_check.$(date +%Y%m%d-%H%M%S)}
mkdir -p "$LOGS"
LOGS=$(cd "$LOGS" && pwd)  # absolute: `bazel run` changes directory
SUMMARY="$LOGS/summary.txt"
: > "$SUMMARY"

note() { echo "$*" | tee -a "$SUMMARY"; }
elapsed() { echo $(( $(date +%s) - START )); }
remaining() { echo $(( BUDGET - $(elapsed) )); }

# run_step NAME CAP_S CMD...: runs CMD with a timeout of min(CAP_S, time
# left), output to $LOGS/NAME.log, and records the outcome.
run_step() {
  local name=$1 cap=$2
  shift 2
  local left
  left=$(remaining)
  if (( left < 20 )); then
    note "SKIPPED $name: out of time budget ($(elapsed) s of $BUDGET s used)"
    return 99
  fi
  local limit=$(( cap < left ? cap : left ))
  echo "=== $name (limit ${limit} s, at $(elapsed) s): $*"
  local t0 rc
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$LOGS/$name.log" 2>&1
  rc=$?
  if (( rc == 124 || rc == 137 )); then
    note "TIMEOUT $name after ${limit} s (log: $name.log)"
  elif (( rc != 0 )); then
    note "FAILED  $name: exit $rc in $(( $(date +%s) - t0 )) s (log: $name.log)"
  else
    note "OK      $name in $(( $(date +%s) - t0 )) s"
  fi
  tail -n 25 "$LOGS/$name.log"
  return $rc
}

# 1. Dependencies.
if ! run_step setup 200 bash deploy/setup.sh; then
  note "setup.sh failed: is there an apt mirror, and are we root? (see setup.log)"
fi
if ! command -v bazel > /dev/null; then
  note "ABORT: bazel is not installed and setup.sh could not install it; this machine needs"
  note "       Debian's bazel-bootstrap and the packages listed in deploy/setup.sh."
  exit 1
fi

# 2. The machine.
{
  echo "--- nvidia-smi"; nvidia-smi 2>&1
  echo "--- nvcc"; /usr/local/cuda/bin/nvcc --version 2>&1
  echo "--- NCCL header"; grep -E '^#define NCCL_(MAJOR|MINOR|PATCH)' /usr/local/cuda/include/nccl.h 2>&1
  echo "--- CPUs: $(nproc)"
} > "$LOGS/machine.log" 2>&1
cat "$LOGS/machine.log"
if ! nvidia-smi > /dev/null 2>&1; then note "WARNING: nvidia-smi fails: the GPU tests will skip"; fi
if [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  note "WARNING: no CUDA toolkit at /usr/local/cuda: the CUDA build will fail"
fi

# 3. Tests. Build first so a build failure is told apart from test failures.
TARGETS=(//kernels/... //worker/... //tests/...)
tests_ok=0
build_ok=0
if run_step build 300 bazel build "${TARGETS[@]}"; then
  build_ok=1
  if run_step test 240 bazel test --test_output=errors "${TARGETS[@]}"; then tests_ok=1; fi
  # Which tests ran on the GPU and which still skipped for want of one.
  mkdir -p "$LOGS/testlogs"
  find -L bazel-testlogs/ -name test.log 2> /dev/null | while read -r f; do
    dest="$LOGS/testlogs/$(dirname "${f#bazel-testlogs/}" | tr / _).log"
    cp "$f" "$dest"
  done
  skipped=$(grep -l "no usable CUDA GPU" "$LOGS"/testlogs/*.log 2> /dev/null | xargs -r -n1 basename)
  if [[ -n "$skipped" ]]; then
    note "GPU tests that SKIPPED (no usable GPU seen):"
    note "$skipped"
  else
    note "no test reported a missing GPU"
  fi
else
  note "build failed: tests, benchmarks and training runs skipped"
fi

# 4. Benchmarks (figures, not pass/fail).
if (( build_ok == 1 )); then
  run_step kernels_benchmark 90 bazel run //kernels:kernels_benchmark -- --benchmark_min_time=0.05
  run_step trainer_benchmark 120 bazel run //worker:trainer_benchmark -- --models=lenet --steps=20

  # 5. Short GPU training runs.
  DATA_FLAGS=()
  if [[ ! -d /usr/share/datasets/fashion-mnist ]]; then
    note "no Fashion-MNIST at /usr/share/datasets/fashion-mnist: training on --dataset=synthetic"
    DATA_FLAGS=(--dataset=synthetic)
  fi
  run_step train_cuda 90 bazel run //worker:worker -- --devices=cuda --epochs=1 \
    --max_steps=200 --progress=false "${DATA_FLAGS[@]}" --report="$LOGS/train_cuda.json"
  run_step train_cuda_0_0 90 bazel run //worker:worker -- --devices=cuda:0,0 --epochs=1 \
    --max_steps=200 --progress=false "${DATA_FLAGS[@]}" --report="$LOGS/train_cuda_0_0.json"
fi

note "total $(elapsed) s; logs in $LOGS"
(( tests_ok == 1 )) && exit 0 || exit 1
