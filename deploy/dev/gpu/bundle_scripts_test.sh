#!/usr/bin/env bash
# The GPU bundle scripts' pieces that need no GPU, no podman and no bundle:
#   1. cuda_lib_dirs searches $LD_LIBRARY_PATH, then a toolkit, then
#      PyTorch's wheels (nvidia/cu13/lib, nvidia/nccl/lib), and
#      first_dir_with takes the first folder holding a library;
#   2. driver_lib_dirs puts /usr/local/nvidia first;
#   3. fatbin_archs.py reads the architectures of a fat binary;
#   4. targets.sh names each binary once;
#   5. run_bundle.sh stops at once with exit 2 on a bad argument and exit 3,
#      naming what is missing, without a bundle or without a CUDA library,
#      and its summary.json is JSON.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[[ -f "$here/cuda_libs.sh" ]] || here="$TEST_SRCDIR/$TEST_WORKSPACE/deploy/dev/gpu"
tmp=${TEST_TMPDIR:-$(mktemp -d)}
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
expect_eq() { [[ "$2" == "$3" ]] || fail "$1: expected [$3], got [$2]"; }

# shellcheck source=deploy/dev/gpu/cuda_libs.sh
source "$here/cuda_libs.sh"

# 1. A machine with a toolkit holding cuBLAS and cudart, and PyTorch's wheels
# holding cuBLAS, cudart and NCCL.
root="$tmp/machine"
rm -rf "$root"
mkdir -p "$root/usr/local/cuda-13.0/lib64" "$root/site/nvidia/cu13/lib" \
  "$root/site/nvidia/nccl/lib" "$root/ld"
touch "$root/usr/local/cuda-13.0/lib64/"{libcublas.so.13,libcudart.so.13}
touch "$root/site/nvidia/cu13/lib/"{libcublas.so.13,libcudart.so.13}
touch "$root/site/nvidia/nccl/lib/libnccl.so.2"
ln -s cuda-13.0 "$root/usr/local/cuda"
printf '#!/bin/sh\necho %s\n' "$root/site" > "$root/python"
chmod +x "$root/python"
mapfile -t dirs < <(LD_LIBRARY_PATH="$root/ld" CUDA_HOME="" CUDA_PATH="" \
  cuda_lib_dirs "$root/python" "$root/usr/local")
expect_eq "first folder" "${dirs[0]}" "$root/ld"
expect_eq "toolkit before the wheels" "${dirs[1]}" "$root/usr/local/cuda/lib64"
expect_eq "cuBLAS from the toolkit" "$(first_dir_with libcublas.so.13 "${dirs[@]}")" \
  "$root/usr/local/cuda/lib64"
expect_eq "NCCL from PyTorch's wheel" "$(first_dir_with libnccl.so.2 "${dirs[@]}")" \
  "$root/site/nvidia/nccl/lib"
first_dir_with libps_absent.so.1 "${dirs[@]}" > /dev/null && fail "found an absent library"
grep -qx "$root/site/nvidia/cu13/lib" < <(printf '%s\n' "${dirs[@]}") ||
  fail "nvidia/cu13/lib not searched: ${dirs[*]}"
# No python: the toolkit alone, and each folder once.
mapfile -t dirs < <(LD_LIBRARY_PATH="" CUDA_HOME="$root/usr/local/cuda" CUDA_PATH="" \
  cuda_lib_dirs "" "$root/usr/local")
expect_eq "CUDA_HOME first" "${dirs[0]}" "$root/usr/local/cuda/lib64"
expect_eq "each folder once" "$(printf '%s\n' "${dirs[@]}" | sort | uniq -d)" ""

# 2. The driver's folders.
expect_eq "driver first at" "$(driver_lib_dirs / | head -1)" "/usr/local/nvidia/lib64"

# 3. A fat binary of two entries (sm_90 machine code, compute_90 PTX) and
# one of one (sm_80), after 8 bytes of padding.
python3 - "$tmp/fatbin.bin" <<'EOF'
import struct, sys
def entry(kind, arch):
    payload = b"x" * 16
    header = struct.pack("<HHII", kind, 0x101, 64, len(payload)) + b"\0" * 16
    header += struct.pack("<I", arch) + b"\0" * (64 - 32)
    return header + payload
def fatbin(*entries):
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body
open(sys.argv[1], "wb").write(fatbin(entry(2, 90), entry(1, 90)) + b"\0" * 8 +
                              fatbin(entry(2, 80)))
EOF
expect_eq "fatbin architectures" "$(python3 "$here/fatbin_archs.py" "$tmp/fatbin.bin")" \
  "ptx:compute_90 sm_80 sm_90"

# 4. Unique binary names.
# shellcheck source=deploy/dev/gpu/targets.sh
source "$here/targets.sh"
dups=$(printf '%s\n' "${GPU_TESTS[@]}" "${BENCHMARKS[@]}" "${DAEMONS[@]}" | sed 's/.*://' |
  sort | uniq -d)
expect_eq "duplicate binary names" "$dups" ""

# 5. run_bundle.sh's failures: fast and named.
run() {  # run NAME ARGS...: run_bundle.sh with a 60 s guard; sets rc
  timeout 60 bash "$here/run_bundle.sh" --work="$tmp/work-$1" --out="$tmp/out-$1" \
    "${@:2}" > "$tmp/$1.log" 2>&1
  rc=$?
}
run badarg --frobnicate
expect_eq "exit status for a bad argument" "$rc" 2
run nobundle --bundle="$tmp/no-such-bundle" --allow-no-gpu
expect_eq "exit status without a bundle" "$rc" 3
grep -q "ABSENT: no bundle at $tmp/no-such-bundle" "$tmp/out-nobundle/summary.txt" ||
  fail "no-bundle message: $(cat "$tmp/nobundle.log")"
# A bundle that needs a CUDA library no machine has.
fake="$tmp/fake/ps-gpu-bundle"
mkdir -p "$fake/lib" "$tmp/fake-bundle"
echo "a fake bundle" > "$fake/BUNDLE.txt"
echo libps_fake_cuda.so.1 > "$fake/cuda_libs.txt"
printf '#!/bin/sh\nexit 0\n' > "$fake/lib/ld-linux-x86-64.so.2"
chmod +x "$fake/lib/ld-linux-x86-64.so.2"
tar -C "$tmp/fake" -czf "$tmp/fake-bundle/ps-gpu-bundle.tar.gz" ps-gpu-bundle
(cd "$tmp/fake-bundle" && sha256sum ps-gpu-bundle.tar.gz > ps-gpu-bundle.tar.gz.sha256)
run nocuda --bundle="$tmp/fake-bundle" --allow-no-gpu
expect_eq "exit status without a CUDA library" "$rc" 3
grep -q "ABSENT: CUDA libraries not found on this machine: libps_fake_cuda.so.1" \
  "$tmp/out-nocuda/summary.txt" || fail "missing-library message: $(cat "$tmp/nocuda.log")"
python3 -m json.tool "$tmp/out-nocuda/summary.json" > /dev/null ||
  fail "summary.json is not JSON: $(cat "$tmp/out-nocuda/summary.json")"
# Listed first, then searched: under pipefail, `tar | grep -q` fails when
# grep's early exit makes tar's next write a SIGPIPE.
packed=$(tar -tzf "$tmp/out-nocuda/logs.tar.gz")
grep -q libs.log <<<"$packed" || fail "logs.tar.gz lacks libs.log: $packed"
# A broken copy is refused.
echo "0000000000000000000000000000000000000000000000000000000000000000  ps-gpu-bundle.tar.gz" \
  > "$tmp/fake-bundle/ps-gpu-bundle.tar.gz.sha256"
run broken --bundle="$tmp/fake-bundle" --allow-no-gpu
expect_eq "exit status for a broken copy" "$rc" 3
grep -q "does not match" "$tmp/out-broken/summary.txt" || fail "broken-copy message"

if ((failures)); then echo "$failures failure(s)"; exit 1; fi
echo "PASS"
