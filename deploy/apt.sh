# Installing Debian packages the way every setup script here does, sourced:
#
#   apt_install LABEL PACKAGE...
#
# installs the packages that are not installed yet (one `apt-get update`,
# then `apt-get install --no-install-recommends`), saying "LABEL: installing
# ..." first, or "LABEL: all packages present" and touching nothing. Run as
# root.
# shellcheck shell=bash

apt_install() {
  local label=$1 p missing=()
  shift
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  if ((${#missing[@]} == 0)); then
    echo "$label: all packages present"
    return 0
  fi
  echo "$label: installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}
