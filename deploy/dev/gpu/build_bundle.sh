#!/usr/bin/env bash
# Builds the GPU check's bundle, here, for a GPU machine that has no Bazel, no
# apt, no network and a C library of its own:
#
#   bash deploy/dev/gpu/build_bundle.sh [--out=out/gpu_bundle] [--no-data] [--gzip]
#
# The bundle is one archive (out/gpu_bundle/ps-gpu-bundle.tar.xz, with its
# sha256, BUNDLE.txt, the manifest, and a static busybox to unpack it where
# neither xz nor python3 is installed) that deploy/dev/gpu/run_bundle.sh unpacks
# and runs there. It holds:
#   bin/tests/       every cc_test with CUDA cases (deploy/dev/gpu/targets.sh)
#   bin/benchmarks/  the benchmarks; bin/ the daemons (server, worker,
#                    health_check)
#   lib/             every non-CUDA shared library they load, libc, libstdc++
#                    and Debian's dynamic loader (ld-linux-x86-64.so.2) among
#                    them, so they run as lib/ld-linux-x86-64.so.2
#                    --library-path lib:<CUDA libs> bin/X, whatever C library
#                    the machine has
#   runfiles/        the tests' data; py/ the PyTorch comparison
#   data/            Fashion-MNIST (30 MB, already compressed), unless
#                    --no-data, or left out when it would not travel
#   cuda_libs.txt    the CUDA libraries the binaries need and the bundle does
#                    not hold (cudart, cuBLAS, cuBLASLt, NCCL: 800 MB); the
#                    machine has them (its toolkit or PyTorch's wheels), and
#                    its driver brings libcuda.so.1
#
# The binaries are the CUDA build (sm_80 and sm_90 machine code plus
# compute_90 PTX; the CPU code needs x86-64-v3, i.e. AVX2), optimised and
# stripped (--config=gpu_bundle in .bazelrc), from their own output base
# (/var/cache/ps-gpu-bundle/bazel), so the default build's outputs stay.
# Needs the CUDA toolkit here (nvcc); runs deploy/setup.sh first. Idempotent:
# a rerun rebuilds what changed and replaces the bundle whole. xz halves what
# gzip leaves of the binaries and libraries (14 against 29 MB; --gzip for a
# .tar.gz); the run unpacks with xz, else python3's lzma, else the busybox
# beside the archive (Debian's busybox-static, fetched with apt-get download).
#
# What travels to the GPU machine is the working tree plus the carried
# bundle, 64 MiB in all: the script prints both sizes and fails when their sum
# is over.
set -euo pipefail
cd "$(dirname "$0")/../../.."

out=out/gpu_bundle data=auto compress=xz
for arg in "$@"; do
  case "$arg" in
    --out=*) out="${arg#*=}" ;;
    --no-data) data=no ;;
    --gzip) compress=gzip ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "build_bundle: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done

# shellcheck source=deploy/dev/gpu/targets.sh
source deploy/dev/gpu/targets.sh
cuda="${CUDA_PATH:-/usr/local/cuda}"
if [[ ! -x "$cuda/bin/nvcc" ]]; then
  echo "build_bundle: no CUDA toolkit at $cuda (nvcc): the bundle is the CUDA build" >&2
  exit 1
fi
if ! setup_log=$(bash deploy/setup.sh 2>&1); then
  echo "$setup_log" >&2
  echo "build_bundle: deploy/setup.sh failed" >&2
  exit 1
fi

# Every test source with CUDA cases must be in GPU_TESTS (a new GPU test
# joins the bundle by one line in targets.sh).
unlisted=""
while read -r src; do
  label="//$(dirname "$src"):$(basename "$src" .cc)"
  [[ " ${GPU_TESTS[*]} " == *" $label "* ]] || unlisted+=" $label"
done < <(git ls-files -co --exclude-standard '*_test.cc' | xargs grep -l -e PS_SKIP_WITHOUT_GPU \
  -e 'no usable CUDA GPU' -e PS_WITH_CUDA -e CudaGpuCount)
if [[ -n "$unlisted" ]]; then
  echo "build_bundle: tests with CUDA cases missing from deploy/dev/gpu/targets.sh:$unlisted" >&2
  exit 1
fi

cache=/var/cache/ps-gpu-bundle
mkdir -p "$cache"
bazel_b=(bazel --output_base="$cache/bazel")
targets=("${GPU_TESTS[@]}" "${BENCHMARKS[@]}" "${DAEMONS[@]}")

# 1. The binaries.
echo "build_bundle: building ${#targets[@]} targets (--config=gpu_bundle, output base $cache/bazel)"
"${bazel_b[@]}" build --config=gpu_bundle --symlink_prefix="$cache/bazel-" "${targets[@]}" 2>&1 |
  tail -n 4
bin=$("${bazel_b[@]}" info --config=gpu_bundle bazel-bin 2>/dev/null)

stage_root="$cache/stage"
stage="$stage_root/ps-gpu-bundle"
rm -rf "$stage_root"
mkdir -p "$stage"/{bin/tests,bin/benchmarks,lib,runfiles/ps,py}

label_path() {  # //a/b:name -> a/b/name
  local l=${1#//}
  echo "${l%%:*}/${l#*:}"
}
binaries=()
place() {  # place LABEL DEST_DIR
  local src dest
  src="$bin/$(label_path "$1")"
  dest="$stage/$2/${1##*:}"
  [[ -e "$dest" ]] && { echo "build_bundle: two targets named ${1##*:}" >&2; exit 1; }
  cp -L "$src" "$dest"
  chmod 755 "$dest"
  strip --strip-unneeded "$dest"
  binaries+=("$dest")
}
for t in "${GPU_TESTS[@]}"; do place "$t" bin/tests; done
for t in "${BENCHMARKS[@]}"; do place "$t" bin/benchmarks; done
for t in "${DAEMONS[@]}"; do place "$t" bin; done

# 2. The shared libraries: every one ldd resolves, but the CUDA toolkit's,
# under its soname; and the program interpreter. A library that does not
# resolve here stops the build.
cuda_real=$(realpath "$cuda")
declare -A cuda_sonames=()
for b in "${binaries[@]}"; do
  # ldd's listing held, not piped: under pipefail `ldd | grep -q` can fail
  # by SIGPIPE exactly when grep finds what it looks for.
  needed=$(ldd "$b")
  if grep -q 'not found' <<<"$needed"; then
    grep 'not found' <<<"$needed" >&2
    echo "build_bundle: $b needs libraries not found here" >&2
    exit 1
  fi
  while read -r soname path; do
    real=$(realpath "$path")
    if [[ "$real" == "$cuda_real"/* ]]; then
      cuda_sonames[$soname]=1
    elif [[ ! -e "$stage/lib/$soname" ]]; then
      cp -L "$path" "$stage/lib/$soname"
    fi
  done < <(ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
done
# cuBLAS is loaded when the first CUDA device is created (dlopen, see
# common/cublas_library.h), so ldd does not list it: name it and what it
# loads, by their sonames in the toolkit.
for lib in libcublas libcublasLt; do
  soname=$(readelf -dW "$cuda/lib64/$lib.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
  [[ -n "$soname" ]] || { echo "build_bundle: no $lib.so in $cuda/lib64" >&2; exit 1; }
  cuda_sonames[$soname]=1
done
interp=$(readelf -l "${binaries[0]}" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
cp -L "$interp" "$stage/lib/ld-linux-x86-64.so.2"
chmod 755 "$stage/lib/ld-linux-x86-64.so.2"
printf '%s\n' "${!cuda_sonames[@]}" | sort > "$stage/cuda_libs.txt"

# Every binary must load with the bundled loader from lib/ and the toolkit's
# libraries alone, in an empty environment.
cuda_lib=$(realpath "$cuda/lib64")
for b in "${binaries[@]}"; do
  listing=$(env -i "$stage/lib/ld-linux-x86-64.so.2" --library-path "$stage/lib:$cuda_lib" \
    --list "$b")
  outside=$(awk '$2 == "=>" {print $3}' <<<"$listing" |
    grep -v -e "^$stage/lib/" -e "^$cuda_lib/" || true)
  if [[ -n "$outside" ]] || grep -q 'not found' <<<"$listing"; then
    echo "$listing" >&2
    echo "build_bundle: $(basename "$b") loads libraries from outside the bundle: $outside" >&2
    exit 1
  fi
done

# 3. Data, scripts.
for f in "${TEST_DATA[@]}"; do
  mkdir -p "$stage/runfiles/ps/$(dirname "$f")"
  cp "$f" "$stage/runfiles/ps/$f"
done
for pair in "${PY_FILES[@]}"; do cp "${pair#*=}" "$stage/${pair%%=*}"; done
fmnist=/usr/share/datasets/fashion-mnist
data_choice=$data
if [[ "$data" == auto ]]; then
  if [[ -s "$fmnist/train-images-idx3-ubyte.gz" ]]; then data=yes; else
    data=no; echo "build_bundle: no Fashion-MNIST at $fmnist: the bundle trains on synthetic data only"
  fi
fi

# 4. The manifest.
# The GPU code in the worker (and so in every binary: the same kernels).
objcopy -O binary --only-section=.nv_fatbin "$stage/bin/worker" "$stage_root/fatbin.bin"
archs=$(python3 deploy/dev/gpu/fatbin_archs.py "$stage_root/fatbin.bin" || true)
rm -f "$stage_root/fatbin.bin"
if [[ " $archs " != *" sm_90 "* ]]; then
  echo "build_bundle: the worker holds no sm_90 machine code for the H200 (found: ${archs:-none})" >&2
  exit 1
fi
commit=$(git rev-parse --short HEAD)
git diff --quiet HEAD -- . 2>/dev/null || commit+=" (with uncommitted changes)"
{
  echo "ps GPU bundle"
  echo "built:     $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), commit $commit"
  echo "compiler:  $(gcc --version | head -1); $("$cuda/bin/nvcc" --version | tail -1)"
  echo "NCCL:      headers $(awk '/^#define NCCL_(MAJOR|MINOR|PATCH) /{printf "%s.", $3}' \
    "$cuda/include/nccl.h" | sed 's/\.$//')"
  echo "C library: $(ldd --version | head -1) (bundled, with its loader)"
  echo "GPU code:  $archs (machine code, and PTX the driver can compile)"
  echo "CPU:       x86-64-v3 (AVX2, FMA, BMI2)"
  echo "needs:     $(tr '\n' ' ' < "$stage/cuda_libs.txt")from the machine, and its driver's libcuda.so.1"
  echo "data:      $([[ $data == yes ]] && echo "Fashion-MNIST ($fmnist)" || echo "synthetic only")"
  echo
  echo "bundled libraries and their Debian packages:"
  cache_listing=$(ldconfig -p)
  for l in "$stage"/lib/*; do
    src=$(awk -v n="$(basename "$l")" '$1 == n {print $NF; exit}' <<<"$cache_listing")
    [[ -z "$src" ]] && src=$interp
    pkg=$(dpkg -S "$(realpath "$src")" 2>/dev/null || dpkg -S "$(realpath "$src" | sed 's|^/usr||')" \
      2>/dev/null || echo "?")
    printf '  %-48s %9d  %s\n' "$(basename "$l")" "$(stat -c %s "$l")" "${pkg%%:*}"
  done
  echo
  echo "binaries:"
  for b in "${binaries[@]}"; do printf '  %-48s %9d\n' "${b#"$stage"/}" "$(stat -c %s "$b")"; done
} > "$stage/BUNDLE.txt"
if [[ "$data" == yes ]]; then
  mkdir -p "$stage/data/fashion-mnist"
  cp "$fmnist"/*-ubyte.gz "$stage/data/fashion-mnist/"
fi

# 5. The archive, replacing the last bundle whole, and a static busybox
# (its xz and tar) beside it for machines without xz or python3.
busybox="$cache/busybox/bin/busybox"
if [[ ! -x "$busybox" ]]; then
  rm -rf "$cache/busybox" && mkdir -p "$cache/busybox"
  (cd "$cache/busybox" && apt-get download -q -o APT::Sandbox::User=root busybox-static > /dev/null &&
    dpkg-deb -x busybox-static_*.deb .)
fi
mkdir -p "$(dirname "$out")"
tmp="$out.tmp"
case "$compress" in
  gzip) archive=ps-gpu-bundle.tar.gz; filter=(gzip -9) ;;
  xz) archive=ps-gpu-bundle.tar.xz; filter=(xz -9 -T2) ;;
esac
# What travels is the working tree (tracked and untracked, not ignored,
# files) and the carried bundle, 64 MiB together.
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
tree_bytes=$(git ls-files -z -co --exclude-standard | du -cb --files0-from=- 2>/dev/null |
  tail -1 | cut -f1)
limit=$((64 * 1048576))
pack() {  # the bundle into $tmp; sets bundle_bytes
  echo "build_bundle: packing ($compress)"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  tar -C "$stage_root" --owner=0 --group=0 -cf - ps-gpu-bundle | "${filter[@]}" > "$tmp/$archive"
  (cd "$tmp" && sha256sum "$archive" > "$archive.sha256")
  cp "$stage/BUNDLE.txt" "$tmp/BUNDLE.txt"
  cp "$busybox" "$tmp/busybox"
  bundle_bytes=$(du -cb "$tmp"/* | tail -1 | cut -f1)
}
pack
if ((bundle_bytes + tree_bytes > limit)) && [[ "$data" == yes && "$data_choice" == auto ]]; then
  echo "build_bundle: with Fashion-MNIST it would be $(mib $((bundle_bytes + tree_bytes))) with" \
    "the working tree: leaving the data out (the run trains on synthetic data alone)"
  rm -rf "$stage/data"
  data=no
  sed -i 's|^data: .*|data:      synthetic only (Fashion-MNIST left out: it would not travel)|' \
    "$stage/BUNDLE.txt"
  pack
fi
rm -rf "$out"
mv "$tmp" "$out"

# 6. Sizes.
unpacked=$(du -sb "$stage" | cut -f1)
total=$((bundle_bytes + tree_bytes))
echo "build_bundle: $out: $(mib "$bundle_bytes") ($(mib "$unpacked") unpacked:" \
  "$(find "$stage/bin/tests" -type f | wc -l) tests, ${#BENCHMARKS[@]} benchmarks," \
  "${#DAEMONS[@]} daemons, $(find "$stage/lib" -type f | wc -l) libraries, data: $data)"
echo "build_bundle: with the working tree ($(mib "$tree_bytes")): $(mib "$total") of 64 MiB"
if ((total > limit)); then
  hint=""
  [[ "$data" == yes ]] && hint=": try --no-data"
  echo "build_bundle: over the 64 MiB the device tool carries$hint" >&2
  exit 1
fi
echo "build_bundle: run it on the GPU machine with the device tool's run:"
echo "  carry [\"$out\"], command: bash deploy/dev/gpu/run_bundle.sh --bundle=$out --out=\$OUT"
