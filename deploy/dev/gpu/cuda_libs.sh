# Where a GPU machine keeps the CUDA libraries the bundle leaves out, sourced
# by deploy/dev/gpu/run_bundle.sh and tested by //deploy/dev/gpu:bundle_scripts_test.
# shellcheck shell=bash

# cuda_lib_dirs PYTHON PREFIX: the folders to search, in order, one per line,
# each once and only those that exist: $LD_LIBRARY_PATH's; lib64, lib and
# targets/x86_64-linux/lib of $CUDA_HOME, $CUDA_PATH, PREFIX/cuda and
# PREFIX/cuda-* (PREFIX is /usr/local on a real machine); then, for each of
# PYTHON's site-packages folders (none when PYTHON is empty), PyTorch's CUDA
# wheels (nvidia/*/lib, nvidia/*/*/lib: nvidia/cu13/lib, nvidia/nccl/lib) and
# torch/lib; last the folders of ldconfig's cache. A toolkit comes before the
# wheels: it is the one nvcc on that machine matches.
cuda_lib_dirs() {
  local python=$1 prefix=$2 d root sp
  local -a search=() ld_dirs=() sites=()
  IFS=: read -r -a ld_dirs <<< "${LD_LIBRARY_PATH:-}"
  for d in "${ld_dirs[@]}"; do [[ -n "$d" ]] && search+=("$d"); done
  for root in "${CUDA_HOME:-}" "${CUDA_PATH:-}" "$prefix/cuda" "$prefix"/cuda-*; do
    [[ -n "$root" ]] && search+=("$root/lib64" "$root/lib" "$root/targets/x86_64-linux/lib")
  done
  if [[ -n "$python" ]]; then
    while read -r sp; do [[ -n "$sp" ]] && sites+=("$sp"); done < <(timeout 30 "$python" -c '
import site, sysconfig
seen = []
for d in site.getsitepackages() + [site.getusersitepackages(), sysconfig.get_paths()["purelib"],
                                   sysconfig.get_paths()["platlib"]]:
    if d not in seen:
        seen.append(d)
        print(d)' 2>/dev/null)
  fi
  for sp in "${sites[@]}"; do
    search+=("$sp"/nvidia/*/lib "$sp"/nvidia/*/*/lib "$sp/torch/lib")
  done
  while read -r d; do search+=("$d"); done < <(ldconfig -p 2>/dev/null |
    awk '$NF ~ /^\// {sub(/\/[^\/]*$/, "", $NF); print $NF}' | sort -u)
  local -A seen=()
  for d in "${search[@]}"; do
    [[ -d "$d" && -z "${seen[$d]:-}" ]] || continue
    seen[$d]=1
    echo "$d"
  done
}

# first_dir_with NAME DIR...: the first DIR holding NAME; status 1 if none.
first_dir_with() {
  local name=$1 d
  shift
  for d in "$@"; do
    [[ -e "$d/$name" ]] && { echo "$d"; return 0; }
  done
  return 1
}

# driver_lib_dirs PREFIX: where a driver's libcuda.so.1 may be, in order
# (PREFIX is / on a real machine): the NVIDIA container runtime's
# /usr/local/nvidia, then the distributions' library folders, then WSL's.
driver_lib_dirs() {
  local p=${1%/}
  printf '%s\n' "$p/usr/local/nvidia/lib64" "$p/usr/local/nvidia/lib" \
    "$p/usr/lib/x86_64-linux-gnu" "$p/usr/lib64" "$p/lib64" "$p/usr/lib" \
    "$p/lib/x86_64-linux-gnu" "$p/usr/lib/wsl/lib"
}
