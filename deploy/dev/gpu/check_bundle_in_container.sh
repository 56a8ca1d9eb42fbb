#!/usr/bin/env bash
# Proves the GPU bundle runs on a machine that has none of the build's
# packages, without a GPU: three podman containers, no network.
#
#   bash deploy/dev/gpu/check_bundle_in_container.sh [--bundle=out/gpu_bundle]
#
#   1. bare Debian 12 (localhost/ps-fresh-debian12: mmdebstrap --variant=minbase,
#      as deploy/dev/fresh/run.sh makes it; no absl, gRPC, OpenBLAS, libstdc++'s
#      build, no xz, no python3), with this machine's CUDA toolkit libraries
#      mounted at /usr/local/cuda/lib64 as the GPU machine's stand-in and no
#      driver: deploy/dev/gpu/run_bundle.sh --allow-no-gpu must pass, every test
#      binary passing with its GPU cases skipping ("no usable CUDA GPU"), the
#      CPU training, the server with two workers and the benchmarks running,
#      the archive unpacked by the bundle's busybox;
#   2. the same without the CUDA libraries: the run must stop at once, exit
#      3, naming them;
#   3. no C library at all (a root filesystem of the bundle's static busybox
#      alone): a test binary and a short CPU training run through the
#      bundled loader, which proves the binaries need nothing of the
#      machine's C library.
# Prints each container's summary; logs in /var/cache/ps-gpu-bundle/container.
# Exit status 0 when all three behave. Needs podman, runc (and mmdebstrap the
# first time), as root; builds the bundle first if there is none. About 1-2
# minutes with the image and the bundle made. Not part of `bazel test //...`.
set -euo pipefail
cd "$(dirname "$0")/../../.."
repo=$PWD
bundle=out/gpu_bundle
for arg in "$@"; do
  case "$arg" in
    --bundle=*) bundle="${arg#*=}" ;;
    -h|--help) sed -n '2,24p' "$0" | sed -e 's/^# //' -e 's/^#$//'; exit 0 ;;
    *) echo "check_bundle_in_container: unknown argument $arg" >&2; exit 2 ;;
  esac
done
[[ -d "$bundle" ]] || bash deploy/dev/gpu/build_bundle.sh --out="$bundle"
bundle=$(cd "$bundle" && pwd)
[[ "$bundle" == "$repo"/* ]] || { echo "check_bundle_in_container: the bundle must lie in the repository" >&2; exit 2; }

source "$repo/deploy/apt.sh"
apt_install check_bundle_in_container podman runc mmdebstrap
export CONTAINERS_CONF="${CONTAINERS_CONF:-$repo/deploy/images/containers.conf}"

logs=/var/cache/ps-gpu-bundle/container
rm -rf "$logs"
mkdir -p "$logs"/{out1,out2,work,rootfs}

# The bare Debian 12 image, as deploy/dev/fresh/run.sh makes it.
image=ps-fresh-debian12
if ! podman image exists "$image"; then
  echo "check_bundle_in_container: making $image (mmdebstrap --variant=minbase)"
  mmdebstrap --variant=minbase --mode=root \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/etc/apt/sources.list.d/* "$1"/etc/apt/sources.list' \
    bookworm "$logs/rootfs.tar" /etc/apt/sources.list.d/debian.sources
  podman import "$logs/rootfs.tar" "$image" > /dev/null
  rm -f "$logs/rootfs.tar"
fi
cuda_lib=$(realpath "${CUDA_PATH:-/usr/local/cuda}/lib64")
rel=${bundle#"$repo"/}
ok=1

# 1. Bare Debian, CUDA libraries, no driver.
echo "=== 1. bare Debian 12, CUDA libraries at /usr/local/cuda/lib64, no driver"
rc=0
podman run --rm --network=none \
  -v "$repo:/src:ro" -v "$cuda_lib:/usr/local/cuda/lib64:ro" \
  -v "$logs/out1:/out" -v "$logs/work:/work" -w /src \
  "$image" bash deploy/dev/gpu/run_bundle.sh --bundle="$rel" --out=/out --work=/work \
    --allow-no-gpu > "$logs/run1.log" 2>&1 || rc=$?
cat "$logs/out1/summary.txt" 2>/dev/null || tail -20 "$logs/run1.log"
if ((rc != 0)); then echo "FAILED: exit $rc (log: $logs/run1.log)"; ok=0; fi
grep -q "with the bundle's busybox" "$logs/out1/summary.txt" ||
  { echo "FAILED: the archive was not unpacked by the bundle's busybox"; ok=0; }
grep -q "(no GPU here: the GPU cases skip, as they should)" "$logs/out1/summary.txt" ||
  { echo "FAILED: the tests did not all pass with their GPU cases skipped"; ok=0; }

# 2. The same without the CUDA libraries.
echo "=== 2. bare Debian 12 without the CUDA libraries"
rc=0
podman run --rm --network=none -v "$repo:/src:ro" -v "$logs/out2:/out" -v "$logs/work:/work" \
  -w /src "$image" bash deploy/dev/gpu/run_bundle.sh --bundle="$rel" --out=/out --work=/work \
    --allow-no-gpu > "$logs/run2.log" 2>&1 || rc=$?
grep ABSENT "$logs/out2/summary.txt" || tail -5 "$logs/run2.log"
if ((rc != 3)) || ! grep -q "ABSENT: CUDA libraries not found" "$logs/out2/summary.txt"; then
  echo "FAILED: expected exit 3 naming the CUDA libraries, got exit $rc"; ok=0
fi

# 3. No C library: the static busybox alone, the bundle unpacked by run 1.
echo "=== 3. a root filesystem of busybox alone (no C library)"
root="$logs/rootfs"
mkdir -p "$root"/{bin,tmp,proc,dev,sys,b,cuda}
cp "$bundle/busybox" "$root/bin/busybox"
ln -sf busybox "$root/bin/sh"
unpacked=$(ls -d "$logs"/work/bundle-*/ps-gpu-bundle | head -1)
script='set -e
L="/b/lib/ld-linux-x86-64.so.2 --library-path /b/lib:/cuda"
echo "C libraries here: $(ls /lib /lib64 /usr/lib 2>&1 | tr "\n" " ")"
TEST_TMPDIR=/tmp $L /b/bin/tests/device_test --gtest_brief=1 2>&1 | tail -n 3
$L /b/bin/worker --model=lenet --dataset=synthetic --devices=cpu --batch_size=256 --epochs=1 \
  --max_steps=8 --progress=false --evaluate=false --report=/tmp/r.json > /tmp/w.log 2>&1
grep -E "\"(steps|samples_per_second)\"" /tmp/r.json'
rc=0
podman run --rm --network=none -v "$unpacked:/b:ro" -v "$cuda_lib:/cuda:ro" --rootfs "$root" \
  /bin/sh -c "$script" > "$logs/run3.log" 2>&1 || rc=$?
cat "$logs/run3.log"
if ((rc != 0)) || ! grep -q '"steps": 8' "$logs/run3.log"; then
  echo "FAILED: exit $rc"; ok=0
fi

((ok)) && echo "check_bundle_in_container: all three behave" && exit 0
echo "check_bundle_in_container: FAILED (logs: $logs)"
exit 1
