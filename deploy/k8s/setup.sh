#!/usr/bin/env bash
# Installs what the offline manifest check (check.py, //deploy/k8s:manifests_test)
# needs: python3 with Debian's python3-yaml, Node.js and npm from apt when
# missing, and npm's typescript and kubernetes-types at pinned versions into
# $PS_K8S_CHECK_DIR/node_modules (default /var/cache/ps-k8s-check), outside
# the repository so no build or `git status` sees them. Idempotent: nothing
# is touched when everything is present at these versions. Run as root.
set -euo pipefail

TYPESCRIPT_VERSION=5.9.3        # tsc; needs Node.js >= 14.17 (Debian 12 has 18)
KUBERNETES_TYPES_VERSION=1.30.0 # the Kubernetes 1.30 API as TypeScript types
dir="${PS_K8S_CHECK_DIR:-/var/cache/ps-k8s-check}"

# apt: Debian's nodejs brings node; npm is its own package there, but other
# builds of nodejs (NodeSource's) ship npm inside and conflict with it, so
# npm is only asked for when no npm command exists.
source "$(dirname "$0")/../apt.sh"
packages=(python3 python3-yaml)
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)
apt_install "k8s setup" "${packages[@]}"

# The version an installed npm package says it is ("" when absent).
installed_version() {
  local manifest="$dir/node_modules/$1/package.json"
  [[ -f "$manifest" ]] || return 0
  node -e 'process.stdout.write(String(require(process.argv[1]).version))' "$manifest"
}

if [[ "$(installed_version typescript)" == "$TYPESCRIPT_VERSION" &&
      "$(installed_version kubernetes-types)" == "$KUBERNETES_TYPES_VERSION" ]]; then
  echo "k8s setup: typescript $TYPESCRIPT_VERSION and kubernetes-types $KUBERNETES_TYPES_VERSION present in $dir"
  exit 0
fi

# Installed into a fresh folder beside the final one, then moved into place,
# so an interrupted install never leaves a half-filled node_modules that the
# version check above would take for a good one.
echo "k8s setup: installing typescript@$TYPESCRIPT_VERSION kubernetes-types@$KUBERNETES_TYPES_VERSION into $dir"
mkdir -p "$(dirname "$dir")"
staging=$(mktemp -d "$dir.new.XXXXXX")
trap 'rm -rf "$staging"' EXIT
npm install --prefix "$staging" --no-audit --no-fund --ignore-scripts --save-exact \
  "typescript@$TYPESCRIPT_VERSION" "kubernetes-types@$KUBERNETES_TYPES_VERSION"
chmod 755 "$staging"
rm -rf "$dir"
mv "$staging" "$dir"
trap - EXIT
echo "k8s setup: done ($dir/node_modules)"
