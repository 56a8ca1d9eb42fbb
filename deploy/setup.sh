#!/usr/bin/env bash
# Installs from Debian 12's apt what one use of the project needs, by set:
#
#   deploy/setup.sh main          # deploy/local_cluster.sh: build and train
#   deploy/setup.sh test          # deploy/test.sh: `bazel test //...`
#   deploy/setup.sh experiments   # deploy/experiments/run.sh and sweep.py
#   deploy/setup.sh k8s           # the Kubernetes manifests' offline check
#   deploy/setup.sh               # no set named: test, which holds all four
#
# Sets:
#   main         the build toolchain (Bazel, g++), the daemons' libraries and
#                Fashion-MNIST: `bazel build //server:server //worker:worker`
#                needs nothing else (GoogleTest is @system_test's, fetched
#                only for tests: third_party/system_libs.bzl)
#   test         main, plus what the tests use: GoogleTest and Benchmark,
#                PyTorch (the oracle), Prometheus, docker-compose, openssl,
#                matplotlib, and the experiments and k8s sets, whose harness
#                and manifests `bazel test //...` checks too
#   experiments  main, plus the network experiments' tools
#                (experiments/packages.sh: the experiments own their list)
#   k8s          Node.js, npm's typescript and kubernetes-types, python3-yaml
#                (k8s/setup.sh, which installs them itself)
# The container images (deploy/images/build.sh) take main and then their
# own engine and mmdebstrap. The lists of main and test live here, in one
# place; every set is installed through apt.sh's one installer.
#
# Idempotent: packages already present are not reinstalled, and apt is not
# touched at all when nothing is missing. Run as root.
set -euo pipefail
here="$(dirname "$0")"

# The build, the daemons' libraries and the data: what the README's first
# command (deploy/local_cluster.sh) needs, and no more.
MAIN_PACKAGES=(
  bazel-bootstrap        # Bazel 4.2.3, the build
  bazel-rules-java       # @rules_java, offline
  g++ pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev
  nlohmann-json3-dev     # JSON: the report and safetensors headers
  libdnnl-dev            # oneDNN 2.6: CPU GEMM and convolutions (kernels/gemm.h, conv_dnnl.h)
  zlib1g-dev
  prometheus-cpp-dev     # --metrics_port: the daemons' Prometheus metrics
  libgoogle-perftools-dev  # tcmalloc: the daemons' allocator (common/process_tuning.h)
  dataset-fashion-mnist  # real data: /usr/share/datasets/fashion-mnist
)

# What only the tests use, on top of main (and of the experiments and k8s
# sets, which test adds itself).
TEST_PACKAGES=(
  libgtest-dev libgmock-dev libbenchmark-dev  # @system_test: every test and benchmark
  openssl                # deploy/tls/make_test_certs.sh: test CAs and certificates
  prometheus             # tests/metrics_test scrapes a real Prometheus server
  docker-compose         # deploy/compose: `docker-compose config -q` checks compose.yaml
  python3 python3-numpy python3-torch  # PyTorch serves as a test oracle
  libopenblas0-pthread   # PyTorch's BLAS (the yardstick's Linear layers); else reference BLAS
  python3-matplotlib     # tests/training_curves_test: the worker's --plot
)

usage() {
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
}

sets=("$@")
((${#sets[@]})) || sets=(test)
packages=() k8s=0 label="setup ${sets[*]}"
for set in "${sets[@]}"; do
  case "$set" in
    main) packages+=("${MAIN_PACKAGES[@]}") ;;
    test)
      # shellcheck source=deploy/experiments/packages.sh
      source "$here/experiments/packages.sh"
      packages+=("${MAIN_PACKAGES[@]}" "${TEST_PACKAGES[@]}" "${EXPERIMENT_PACKAGES[@]}")
      k8s=1
      ;;
    experiments)
      # shellcheck source=deploy/experiments/packages.sh
      source "$here/experiments/packages.sh"
      packages+=("${MAIN_PACKAGES[@]}" "${EXPERIMENT_PACKAGES[@]}")
      ;;
    k8s) k8s=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "setup: unknown set '$set' (main, test, experiments, k8s; see --help)" >&2; exit 2 ;;
  esac
done

if ((${#packages[@]})); then
  # One apt-get update and one install for every set asked for.
  # shellcheck source=deploy/apt.sh
  source "$here/apt.sh"
  apt_install "$label" "${packages[@]}"
  # The build leaves CUDA out by itself where the toolkit is missing (see
  # the root BUILD); say so once, on stderr, which the launchers keep visible.
  cuda="${CUDA_PATH:-/usr/local/cuda}"
  if [[ ! -x "$cuda/bin/nvcc" ]]; then
    echo "setup: no CUDA toolkit at $cuda: building CPU-only" >&2
  fi
fi

# The Kubernetes manifests' offline check (//deploy/k8s:manifests_test):
# Node.js, python3-yaml, and npm's typescript and kubernetes-types in
# /var/cache/ps-k8s-check.
if ((k8s)); then
  bash "$here/k8s/setup.sh"
fi
