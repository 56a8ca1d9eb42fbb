#!/usr/bin/env bash
# Runs the README's two commands, exactly as written, on a fresh Debian 12:
# a container made from a minimal Debian root filesystem (no CUDA toolkit,
# nothing of this project installed), with only apt access, as a new user's
# machine would be. Prints how long each command took.
#
#   bash deploy/dev/fresh/run.sh [--keep]     # as root; about 20-30 minutes
#   bash deploy/dev/fresh/run.sh --images     # instead: deploy/images/build.sh
#   bash deploy/dev/fresh/run.sh --cluster-only -- --epochs=1
#
# --images runs the image build on the fresh machine instead (privileged,
# since mmdebstrap mounts /proc in its chroot and podman runs nested, on
# the vfs storage driver); the images stay inside that container.
# --cluster-only runs deploy/local_cluster.sh alone (not deploy/test.sh);
# arguments after `--` go to local_cluster.sh. --disk-cache lends the
# container this machine's Bazel disk cache (/var/cache/ps-bazel-disk,
# read-only): the build is then no fresh machine's, but setup still is.
#
# Each command's newly installed Debian packages are listed in
# /tmp/ps-fresh/packages-<command>.txt, and the run fails if the cluster's
# setup installed a test-only one (PyTorch, Prometheus, docker-compose,
# Node.js, npm, GoogleTest).
#
# The checkout's committed HEAD is cloned into the container's work folder,
# so uncommitted changes are not part of the run. Logs: /tmp/ps-fresh/*.log.
# Needs podman, runc and mmdebstrap (installed from apt here); podman runs
# with deploy/images/containers.conf, the settings ../shared/ENVIRONMENT.md
# describes (runc, explicit ulimits, cgroupfs).
set -euo pipefail
cd "$(dirname "$0")/../../.."
keep=0 images=0 cluster_only=0 disk_cache=0 cluster_args=()
while (($#)); do
  case "$1" in
    --keep) keep=1 ;;
    --images) images=1 ;;
    --cluster-only) cluster_only=1 ;;
    --disk-cache) disk_cache=1 ;;
    --) shift; cluster_args=("$@"); break ;;
    *) echo "fresh/run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

work=/tmp/ps-fresh
mkdir -p "$work"
source deploy/apt.sh
apt_install fresh/run.sh podman runc mmdebstrap

# shellcheck source=deploy/images/engine.sh
source deploy/images/engine.sh
use_engine podman  # podman's settings for these machines (containers.conf)

# 1. A minimal Debian 12 root filesystem, its apt lists removed.
if ! podman image exists ps-fresh-debian12; then
  rm -f "$work/rootfs.tar"
  mmdebstrap --variant=minbase --mode=root \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/etc/apt/sources.list.d/* "$1"/etc/apt/sources.list' \
    bookworm "$work/rootfs.tar" /etc/apt/sources.list.d/debian.sources
  podman import "$work/rootfs.tar" ps-fresh-debian12
  rm -f "$work/rootfs.tar"
fi

# 2. The project as a user would get it: a clone of the committed HEAD.
rm -rf "$work/src"
git clone -q "$PWD" "$work/src"

# 3. The README's two commands, each timed, in one fresh container. The
# host's apt sources are the only way out; minbase lacks the man folder
# openjdk's post-install wants (a normal Debian install has it).
# Each command's new packages: the installed list diffed before and after.
printf -v quoted_args ' %q' "${cluster_args[@]}"
((${#cluster_args[@]})) || quoted_args=""
script='set -uo pipefail
mkdir -p /usr/share/man/man1
cd /src
rm -f /logs/times /logs/packages-*.txt
installed() { dpkg-query -W -f="\${Status} \${Package}\n" | sed -n "s/^install ok installed //p" | sort; }
timed() {
  local log=$1; shift
  local t0=$(date +%s) rc=0
  installed > /tmp/before
  "$@" > "/logs/$log.log" 2>&1 || rc=$?
  echo "$*: $(($(date +%s) - t0)) s, exit $rc" >> /logs/times
  installed | comm -13 /tmp/before - > "/logs/packages-$log.txt"
  return $rc
}
'
if ((cluster_only)); then
  script+="timed cluster bash deploy/local_cluster.sh$quoted_args"
else
  script+="timed cluster bash deploy/local_cluster.sh$quoted_args && timed test bash deploy/test.sh"
fi
run_flags=()
if ((disk_cache)); then
  run_flags+=(-v /var/cache/ps-bazel-disk:/var/cache/ps-bazel-disk:ro)
  script="echo build --disk_cache=/var/cache/ps-bazel-disk > /root/.bazelrc
$script"
fi
# npm's registry is reached through this machine's egress proxy, whose CA
# the host trusts system-wide: the fresh machine trusts it too (node reads
# NODE_EXTRA_CA_CERTS), as apt's plain-HTTP mirror needs nothing.
ca=/etc/ssl/certs/ca-certificates.crt
[[ -f "$ca" ]] && run_flags+=(-v "$ca:/etc/host-ca.crt:ro" -e NODE_EXTRA_CA_CERTS=/etc/host-ca.crt)
# Nested podman (the image build, and deploy/test.sh, which builds the
# images and runs the container tests): overlay cannot stack on the outer
# container's overlay, so the inner one stores images with vfs; privileged,
# as mmdebstrap mounts /proc in its chroot.
nested="mkdir -p /etc/containers
printf \"[storage]\\ndriver = \\\"vfs\\\"\\nrunroot = \\\"/run/containers/storage\\\"\\ngraphroot = \\\"/var/lib/containers/storage\\\"\\n\" > /etc/containers/storage.conf
"
if ((images)); then
  script="${script%%timed cluster*}${nested}timed images bash deploy/images/build.sh"
  run_flags+=(--privileged)
elif ((!cluster_only)); then
  script="${script/timed cluster/${nested}timed cluster}"
  run_flags+=(--privileged)
fi
name=ps-fresh-run
podman rm -f "$name" >/dev/null 2>&1 || true
rc=0
podman run --name "$name" --network=host "${run_flags[@]}" \
  -v /etc/apt/sources.list.d:/etc/apt/sources.list.d:ro \
  -v "$work/src:/src" -v "$work:/logs" \
  ps-fresh-debian12 bash -c "$script" || rc=$?
((keep)) || podman rm -f "$name" >/dev/null 2>&1 || true
echo "fresh machine: exit $rc"
cat "$work/times" 2>/dev/null || true
if ((images)); then
  grep -E "^  localhost/|no CUDA toolkit" "$work/images.log" || tail -20 "$work/images.log"
  exit "$rc"
fi
grep -E "final test accuracy|setup: no CUDA" "$work/cluster.log" || tail -20 "$work/cluster.log"
((cluster_only)) || tail -3 "$work/test.log" 2>/dev/null || true
# The main job installs the build, the libraries and the data only.
if [[ -f "$work/packages-cluster.txt" ]]; then
  echo "local_cluster.sh installed $(wc -l < "$work/packages-cluster.txt") packages ($work/packages-cluster.txt)"
  test_only=$(grep -xE 'python3-torch|prometheus|docker-compose|nodejs|npm|libgtest-dev|libgmock-dev|libbenchmark-dev' \
    "$work/packages-cluster.txt" || true)
  if [[ -n "$test_only" ]]; then
    echo "fresh machine: local_cluster.sh installed test-only packages:" $test_only >&2
    rc=1
  fi
fi
exit "$rc"
