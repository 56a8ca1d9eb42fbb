#!/usr/bin/env bash
# Installs every build, test and data dependency from Debian 12's apt
# repositories. Idempotent: packages already present are not reinstalled, and
# apt is not touched at all when nothing is missing. Run as root.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap        # Bazel 4.2.3, the build
  bazel-rules-java       # @rules_java, offline
  g++ pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev
  nlohmann-json3-dev     # JSON: the report and safetensors headers
  libgtest-dev libgmock-dev libbenchmark-dev
  libdnnl-dev            # oneDNN 2.6: CPU GEMM and convolutions (kernels/gemm.h, conv_dnnl.h)
  zlib1g-dev
  openssl                # deploy/tls/make_test_certs.sh: test CAs and certificates
  prometheus-cpp-dev     # --metrics_port: the daemons' Prometheus metrics
  prometheus             # tests/metrics_test scrapes a real Prometheus server
  docker-compose         # deploy/compose: `docker-compose config -q` checks compose.yaml
  dataset-fashion-mnist  # real data: /usr/share/datasets/fashion-mnist
  python3 python3-numpy python3-torch  # PyTorch serves as a test oracle
  libopenblas0-pthread   # PyTorch's BLAS (the yardstick's Linear layers); else reference BLAS
)
# The network experiments' tools (namespaces, tc, the NFQUEUE delayer,
# iperf3): tests/experiments_test runs that harness under `bazel test //...`.
source "$(dirname "$0")/experiments/packages.sh"
PACKAGES+=("${EXPERIMENT_PACKAGES[@]}")

source "$(dirname "$0")/apt.sh"
apt_install setup "${PACKAGES[@]}"

# The build leaves CUDA out by itself where the toolkit is missing (see the
# root BUILD); say so once, on stderr, which the launchers keep visible.
cuda="${CUDA_PATH:-/usr/local/cuda}"
if [[ ! -x "$cuda/bin/nvcc" ]]; then
  echo "setup: no CUDA toolkit at $cuda: building CPU-only" >&2
fi

# The Kubernetes manifests' offline check (//deploy/k8s:manifests_test):
# Node.js, python3-yaml, and npm's typescript and kubernetes-types in
# /var/cache/ps-k8s-check.
bash "$(dirname "$0")/k8s/setup.sh"
