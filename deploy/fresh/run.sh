#!/usr/bin/env bash
# Runs the README's two commands, exactly as written, on a fresh Debian 12:
# a container made from a minimal Debian root filesystem (no CUDA toolkit,
# nothing of this project installed), with only apt access, as a new user's
# machine would be. Prints how long each command took.
#
#   bash deploy/fresh/run.sh [--keep]     # as root; about 20-30 minutes
#   bash deploy/fresh/run.sh --images     # instead: deploy/images/build.sh
#
# --images runs the image build on the fresh machine instead (privileged,
# since mmdebstrap mounts /proc in its chroot and podman runs nested, on
# the vfs storage driver); the images stay inside that container.
#
# The checkout's committed HEAD is cloned into the container's work folder,
# so uncommitted changes are not part of the run. Logs: /tmp/ps-fresh/*.log.
# Needs podman, runc and mmdebstrap (installed from apt here); podman runs
# with deploy/images/containers.conf, the settings ../shared/ENVIRONMENT.md
# describes (runc, explicit ulimits, cgroupfs).
set -euo pipefail
cd "$(dirname "$0")/../.."
keep=0 images=0
for arg in "$@"; do
  case "$arg" in
    --keep) keep=1 ;;
    --images) images=1 ;;
    *) echo "fresh/run.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
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
script='set -uo pipefail
mkdir -p /usr/share/man/man1
cd /src
rm -f /logs/times
timed() {
  local log=$1; shift
  local t0=$(date +%s) rc=0
  "$@" > "/logs/$log.log" 2>&1 || rc=$?
  echo "$*: $(($(date +%s) - t0)) s, exit $rc" >> /logs/times
  return $rc
}
timed cluster bash deploy/local_cluster.sh && timed test bash deploy/test.sh'
run_flags=()
# npm's registry is reached through this machine's egress proxy, whose CA
# the host trusts system-wide: the fresh machine trusts it too (node reads
# NODE_EXTRA_CA_CERTS), as apt's plain-HTTP mirror needs nothing.
ca=/etc/ssl/certs/ca-certificates.crt
[[ -f "$ca" ]] && run_flags+=(-v "$ca:/etc/host-ca.crt:ro" -e NODE_EXTRA_CA_CERTS=/etc/host-ca.crt)
if ((images)); then
  # Nested podman: overlay cannot stack on the outer container's overlay,
  # so the inner one stores images with vfs.
  script="${script%%timed cluster*}mkdir -p /etc/containers
printf \"[storage]\\ndriver = \\\"vfs\\\"\\nrunroot = \\\"/run/containers/storage\\\"\\ngraphroot = \\\"/var/lib/containers/storage\\\"\\n\" > /etc/containers/storage.conf
timed images bash deploy/images/build.sh"
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
tail -3 "$work/test.log" 2>/dev/null || true
exit "$rc"
