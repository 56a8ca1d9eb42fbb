#!/usr/bin/env bash
# Builds the container images offline, from Debian packages only (no
# registry is reachable, so there is no base image to pull):
#
#   localhost/ps-server:TAG      the server, CPU-only build
#   localhost/ps-worker:TAG      the worker, CPU-only build, with Fashion-MNIST
#   localhost/ps-worker-gpu:TAG  the worker's CUDA build plus the CUDA runtime
#                                libraries (only where the toolkit is installed)
#
#   bash deploy/images/build.sh [--engine=podman|docker] [--tag=TAG] [--no-gpu]
#                               [--if_changed] [--disk_cache=DIR]
#
# --if_changed keeps an image whose inputs are unchanged: each image carries
# the label ps.build-key, a SHA-256 over its binaries (as Bazel built them),
# this script, engine.sh, make_job_certs.sh and the name=version of every
# Debian package it installs (as this machine's apt would resolve them);
# only an image whose key differs is made again (deploy/test.sh uses this).
# --disk_cache=DIR is passed to Bazel.
#
# Each image is one root filesystem made by mmdebstrap from this machine's
# apt sources: Debian's Essential packages (no apt, no package lists inside),
# catatonit as the init that forwards SIGTERM to the daemon, and exactly the
# packages owning the libraries `ldd` finds the binary needs. Man pages,
# documentation (but the copyright files) and translations are left out. The
# daemons run as the user ps (uid 10001). Then `import` with the entrypoint,
# user and ports set. Prints each image's size at the end.
#
# The binaries come from Bazel: the CPU-only build in its own output base
# (/var/cache/ps-images/bazel), so it does not evict the default build's
# outputs, and the default (CUDA) build for the GPU image. They are built
# with -march=x86-64-v3 (see .bazelrc): the hosts need AVX2.
#
# Container engine: podman if installed, else docker if its daemon answers,
# else podman is installed (with podman-compose, for deploy/compose). Podman runs with deploy/images/containers.conf
# (runc, explicit ulimits, cgroupfs) unless CONTAINERS_CONF is set. Run as
# root; about 3-5 minutes when the binaries are built.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD

engine="" tag=latest gpu=auto if_changed=0 bazel_flags=()
for arg in "$@"; do
  case "$arg" in
    --engine=*) engine="${arg#*=}" ;;
    --tag=*) tag="${arg#*=}" ;;
    --no-gpu) gpu=no ;;
    --if_changed) if_changed=1 ;;
    --disk_cache=*) bazel_flags+=("$arg") ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done

# The build's own dependencies (setup.sh main: Bazel, the libraries), then
# the images' (mmdebstrap and the container engine).
bash deploy/setup.sh main
# shellcheck source=deploy/images/engine.sh
source deploy/images/engine.sh
need=(mmdebstrap)
[[ -z "$engine" ]] && engine=$(pick_engine)
# shellcheck disable=SC2207  # package names have no spaces
need+=($(engine_packages "$engine"))
# shellcheck source=deploy/apt.sh
source deploy/apt.sh
apt_install build.sh "${need[@]}"
use_engine "$engine"

cache=/var/cache/ps-images
mkdir -p "$cache"
cuda="${CUDA_PATH:-/usr/local/cuda}"
if [[ "$gpu" == auto ]]; then
  if [[ -x "$cuda/bin/nvcc" ]]; then gpu=yes; else
    gpu=no; echo "build.sh: no CUDA toolkit at $cuda: no GPU image" >&2
  fi
fi

# 1. The binaries.
echo "build.sh: building the CPU-only binaries (output base $cache/bazel)"
bazel --output_base="$cache/bazel" build "${bazel_flags[@]}" --config=cpu_only \
  --symlink_prefix="$cache/bazel-" //server:server //server:health_check //worker:worker
cpu_bin="$cache/bazel-bin"
if [[ "$gpu" == yes ]]; then
  echo "build.sh: building the CUDA worker (the default build)"
  bazel build "${bazel_flags[@]}" //worker:worker
  gpu_bin=$(bazel info bazel-bin)
fi

# The Debian packages that own the shared libraries `binary` loads; a
# library no package owns (e.g. the CUDA toolkit's) is printed on stderr
# and left to the caller.
packages_for() {
  local binary=$1 lib real owner
  ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r lib; do
    real=$(realpath "$lib")
    # usrmerge: dpkg may know the file under /lib or under /usr/lib.
    owner=$(dpkg -S "$real" 2>/dev/null || dpkg -S "${real#/usr}" 2>/dev/null || true)
    if [[ -z "$owner" ]]; then echo "$lib" >&2; else echo "${owner%%:*}"; fi
  done | sort -u
}

# build_image NAME PORTS "PACKAGES" "COPY-IN..." : one root filesystem made by
# mmdebstrap, imported as localhost/NAME:$tag running `catatonit -- ENTRY`.
# Each COPY-IN is SOURCE=DEST, copied in as root (links followed, mode kept).
build_image() {
  local name=$1 entry=$2 ports=$3 packages=$4 copies=$5
  local tar="$cache/$name.tar" hooks=() copy key
  key=$(build_key "$packages" "$copies")
  if ((if_changed)) && [[ "$(engine_cmd image inspect --format '{{index .Labels "ps.build-key"}}' \
                             "localhost/$name:$tag" 2>/dev/null)" == "$key" ]]; then
    echo "build.sh: $name: unchanged (ps.build-key ${key:0:12}), kept"
    return
  fi
  for copy in $copies; do
    hooks+=(--customize-hook="mkdir -p \"\$1$(dirname "${copy#*=}")\" && cp -L --preserve=mode \"${copy%%=*}\" \"\$1${copy#*=}\"")
  done
  echo "build.sh: $name: mmdebstrap with ${packages// /,}"
  rm -f "$tar"
  # merged-usr: /bin, /lib and /sbin as links set up by mmdebstrap's hook
  # (with the empty usr-is-merged package) instead of the usrmerge
  # package, which pulls in perl (55 MB).
  mmdebstrap --variant=essential --mode=root --format=tar \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --include="${packages// /,}" \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/lintian/*' \
    --customize-hook='echo "ps:x:10001:10001:parameter server:/var/lib/ps:/usr/sbin/nologin" >> "$1/etc/passwd"' \
    --customize-hook='echo "ps:x:10001:" >> "$1/etc/group"' \
    --customize-hook='echo "ps:!:19000::::::" >> "$1/etc/shadow"' \
    --customize-hook='mkdir -p "$1/var/lib/ps/checkpoints" "$1/var/lib/ps/reports" && chown -R 10001:10001 "$1/var/lib/ps"' \
    "${hooks[@]}" \
    --customize-hook='chroot "$1" ldconfig' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/etc/apt/sources.list.d/* "$1"/etc/apt/sources.list "$1"/var/cache/apt/* "$1"/var/cache/debconf/*-old "$1"/var/log/*' \
    bookworm "$tar" /etc/apt/sources.list.d/*.sources
  # An imported image has no environment: PATH is set as a Debian shell's,
  # for `exec ps-health` and the manifests' `sh -c`.
  local changes=(--change "USER ps" --change "WORKDIR /var/lib/ps"
                 --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
                 --change "ENTRYPOINT [\"/usr/bin/catatonit\", \"--\", \"$entry\"]"
                 --change "LABEL org.opencontainers.image.title=$name"
                 --change "LABEL ps.build-key=$key")
  local port
  for port in $ports; do changes+=(--change "EXPOSE $port"); done
  engine_cmd rmi -f "localhost/$name:$tag" >/dev/null 2>&1 || true
  engine_cmd import "${changes[@]}" "$tar" "localhost/$name:$tag" >/dev/null
  rm -f "$tar"
}

# The image's cache key (--if_changed): what goes into it. Package versions
# are the candidates of this machine's apt (what mmdebstrap installs from
# the same sources), not the versions installed here.
build_key() {  # packages copies
  local copy pkg
  {
    sha256sum deploy/images/build.sh deploy/images/engine.sh deploy/tls/make_job_certs.sh
    for copy in $2; do echo "${copy#*=} $(sha256sum <"${copy%%=*}")"; done
    for pkg in $1; do
      echo "$pkg=$(apt-cache policy "$pkg" 2>/dev/null | awk '/Candidate:/ {print $2}')"
    done
  } | sha256sum | cut -c1-64
}

health="$cpu_bin/server/health_check=/usr/local/bin/ps-health"

# 2. The server: gRPC on 50051, metrics on 9100. With openssl and
# make_job_certs.sh (as ps-make-job-certs), so that Compose's init service
# makes the job's certificates from this image.
build_image ps-server /usr/local/bin/ps-server "50051 9100" \
  "catatonit openssl $(packages_for "$cpu_bin/server/server" | tr '\n' ' ')" \
  "$cpu_bin/server/server=/usr/local/bin/ps-server $health $repo/deploy/tls/make_job_certs.sh=/usr/local/bin/ps-make-job-certs"

# 3. The CPU worker, with Debian's Fashion-MNIST at its usual path.
build_image ps-worker /usr/local/bin/ps-worker "9101" \
  "catatonit dataset-fashion-mnist $(packages_for "$cpu_bin/worker/worker" | tr '\n' ' ')" \
  "$cpu_bin/worker/worker=/usr/local/bin/ps-worker $health"

# 4. The GPU worker: the CUDA build and the toolkit's runtime libraries at
# the path of the binary's RUNPATH (the driver comes from the host, through
# the NVIDIA container toolkit).
if [[ "$gpu" == yes ]]; then
  # One pass: the packages on stdout, the libraries no package owns on stderr.
  gpu_packages=$(packages_for "$gpu_bin/worker/worker" 2>"$cache/unowned-libraries" | tr '\n' ' ')
  cuda_libs=$(sort -u "$cache/unowned-libraries")
  # cuBLAS is loaded when the first CUDA device is created (dlopen, see
  # common/cublas_library.h), so ldd does not list it: it goes beside
  # cudart, in the directory of the binary's RUNPATH.
  runpath_dir=$(dirname "$(grep -m1 '/libcudart\.so' <<<"$cuda_libs")")
  for lib in "$runpath_dir"/libcublas.so.* "$runpath_dir"/libcublasLt.so.*; do
    [[ "$lib" =~ \.so\.[0-9]+$ ]] && cuda_libs+=$'\n'"$lib"
  done
  copies="$gpu_bin/worker/worker=/usr/local/bin/ps-worker $health"
  for lib in $cuda_libs; do copies+=" $lib=$lib"; done
  build_image ps-worker-gpu /usr/local/bin/ps-worker "9101" \
    "catatonit dataset-fashion-mnist $gpu_packages" "$copies"
fi

# 5. Sizes.
echo
echo "build.sh: images ($engine):"
for name in ps-server ps-worker ps-worker-gpu; do
  bytes=$(engine_cmd image inspect --format '{{.Size}}' "localhost/$name:$tag" 2>/dev/null) || continue
  printf '  %-28s %6d MB\n' "localhost/$name:$tag" $((bytes / 1000000))
done
