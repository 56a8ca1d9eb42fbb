# The container engine for the image and Compose scripts, sourced:
#   pick_engine        prints podman if installed, else docker if its daemon
#                      answers, else podman (to be installed)
#   use_engine NAME    makes engine_cmd run NAME; for podman, points
#                      CONTAINERS_CONF at deploy/images/containers.conf
#                      unless the caller set it
#   engine_cmd ARGS    runs the engine
#   engine_packages NAME  the Debian packages NAME needs here, with Compose
# shellcheck shell=bash

pick_engine() {
  if command -v podman >/dev/null 2>&1; then echo podman
  elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then echo docker
  else echo podman
  fi
}

use_engine() {
  case "$1" in
    podman)
      # These machines need runc (crun fails on their hybrid cgroups),
      # explicit ulimits (root may not raise its limits) and cgroupfs; see
      # ../shared/ENVIRONMENT.md.
      export CONTAINERS_CONF="${CONTAINERS_CONF:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/containers.conf}"
      ;;
    docker) ;;
    *) echo "engine: unknown container engine '$1' (podman or docker)" >&2; return 2 ;;
  esac
  ENGINE=$1
}

engine_cmd() { "$ENGINE" "$@"; }

# podman needs runc here (crun fails on these machines' hybrid cgroups),
# catatonit for the pause image of pods (`podman kube play`) and, with its
# CNI network backend, the dnsname plugin, without which containers cannot
# resolve each other's service names ("Domain name not found").
engine_packages() {
  case "$1" in
    podman) echo podman runc catatonit podman-compose golang-github-containernetworking-plugin-dnsname ;;
    docker) echo docker-compose ;;
  esac
}
