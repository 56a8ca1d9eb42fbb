#!/usr/bin/env bash
# Runs the GPU check from a bundle that deploy/dev/gpu/build_bundle.sh built
# elsewhere: one command on the GPU machine, from the repository root,
#
#   bash deploy/dev/gpu/run_bundle.sh --bundle=out/gpu_bundle --out=$OUT
#
# Parts, in this order, each under its own timeout inside one time budget
# (--budget, default 300 s; a part that no longer fits is not started and is
# marked NO-TIME, which fails the run):
#   machine     the OS, CPU, C library, nvidia-smi, python3 and torch
#   unpack      the archive (checked against its sha256) into --work
#   libs        the CUDA libraries the bundle needs (cuda_libs.txt), searched
#               in $LD_LIBRARY_PATH, $CUDA_HOME, $CUDA_PATH, /usr/local/cuda*,
#               python3's site-packages (PyTorch's nvidia/*/lib wheels) and
#               ldconfig, and the driver's libcuda.so.1; every binary is then
#               loaded with all symbols bound (ldd -r through the bundled
#               loader), so a missing library or symbol stops here, named
#   tests       every bundled GPU test (gtest XML and log each); on a GPU
#               machine a case skipping for want of a GPU is a failure
#   train       LeNet and the seed's ResNet-18 (D2L 13.6, resnet18_cifar)
#               trained by our worker on one GPU (--devices=cuda: the
#               overlapped path, pushes during backward) and on two logical
#               devices sharing it (--devices=cuda:0,0), synthetic data;
#               LeNet on Fashion-MNIST too when the bundle holds it (JSON
#               reports)
#   pytorch     the same models and batch in this machine's PyTorch on the GPU
#               (deploy/dev/gpu/pytorch_gpu.py)
#   cluster     the server daemon and two workers over loopback
#   benchmarks  kernels_benchmark, trainer_benchmark, model_benchmark (CPU)
# Every binary runs as lib/ld-linux-x86-64.so.2 --library-path
# lib:<CUDA libs>:<driver libs> bin/X: the bundle's own C library and loader,
# whatever this machine's C library is.
#
# Output in --out (default $OUT, else a new /tmp/gpu_bundle_run.*): only three
# files, as the device tool brings back at most 8: summary.txt (one line per
# part, the figures, our samples/s against PyTorch's), summary.json (the same,
# for programs) and logs.tar.gz (every log, gtest XML and JSON report),
# refreshed after each part, so a run killed at its limit still returns them.
# Exit status: 0 all parts passed; 1 a part failed or timed out; 2 bad
# arguments; 3 something missing (the bundle, a CUDA library, the GPU, a CPU
# feature): the message says what and where it looked.
#
# Options: --work=DIR (unpack here; default /tmp/ps-gpu-bundle), --parts=LIST
# (of tests, train, pytorch, cluster, benchmarks, comma-separated; default
# all; machine, unpack and libs always run), --jobs=N (tests at a time,
# default 4),
# --allow-no-gpu (no driver or GPU: the GPU cases must skip, the GPU training
# and PyTorch parts are skipped, the CPU parts run instead; for
# deploy/dev/gpu/check_bundle_in_container.sh).
# Assumes bash and coreutils (timeout, mktemp, realpath); unpacks with tar and
# xz (gzip for a .tar.gz), else python3's tarfile, else the static busybox
# beside the archive.

set -u
START=$(date +%s)
# shellcheck source=deploy/dev/gpu/cuda_libs.sh
source "$(dirname "${BASH_SOURCE[0]}")/cuda_libs.sh" || exit 2
bundle=out/gpu_bundle out_dir=${OUT:-} work=/tmp/ps-gpu-bundle budget=300
parts=machine,unpack,libs,tests,train,pytorch,cluster,benchmarks jobs=4 allow_no_gpu=0
for arg in "$@"; do
  case "$arg" in
    --bundle=*) bundle="${arg#*=}" ;;
    --out=*) out_dir="${arg#*=}" ;;
    --work=*) work="${arg#*=}" ;;
    --budget=*) budget="${arg#*=}" ;;
    --parts=*) parts="machine,unpack,libs,${arg#*=}" ;;
    --jobs=*) jobs="${arg#*=}" ;;
    --allow-no-gpu) allow_no_gpu=1 ;;
    -h|--help) sed -n '2,51p' "$0" | sed -e 's/^# //' -e 's/^#$//'; exit 0 ;;
    *) echo "run_bundle: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$budget" =~ ^[0-9]+$ && "$jobs" =~ ^[1-9][0-9]*$ ]] || {
  echo "run_bundle: --budget and --jobs take whole numbers" >&2; exit 2; }
[[ -z "$out_dir" ]] && out_dir=$(mktemp -d /tmp/gpu_bundle_run.XXXXXX)
mkdir -p "$out_dir" "$work" || exit 2
out_dir=$(cd "$out_dir" && pwd)
work=$(cd "$work" && pwd)
# This run's logs and links; earlier runs' are removed, their unpacked
# bundles (bundle-*) kept.
rm -rf "$work"/logs.* "$work"/cuda-links.* "$work"/driver-links.* "$work"/tmp.*
LOGS="$work/logs.$START"
mkdir -p "$LOGS"
SUMMARY="$LOGS/summary.txt"
: > "$SUMMARY"
JSON_PARTS=()
FIGURES=()
failed=0

elapsed() { echo $(( $(date +%s) - START )); }
remaining() { echo $(( budget - $(elapsed) )); }
note() { echo "$*" | tee -a "$SUMMARY"; }
json_str() {  # a JSON string literal of $1
  local s=${1//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/ }
  s=${s//$'\t'/ }
  printf '"%s"' "$s"
}
# record PART STATUS SECONDS DETAIL: one summary line and one JSON entry.
record() {
  printf '%-8s %-30s %5s s  %s\n' "$2" "$1" "$3" "$4" | tee -a "$SUMMARY"
  JSON_PARTS+=("{\"part\": $(json_str "$1"), \"status\": $(json_str "$2"), \"seconds\": $3, \"detail\": $(json_str "$4")}")
  case "$2" in FAILED|TIMEOUT|MISSING|NO-TIME) failed=1 ;; esac
}
want() { [[ ",$parts," == *",$1,"* ]]; }

# pack: summary.txt, summary.json and logs.tar.gz into the output folder.
pack() {
  cp "$SUMMARY" "$out_dir/summary.txt"
  {
    echo "{"
    echo "  \"elapsed_seconds\": $(elapsed),"
    echo "  \"budget_seconds\": $budget,"
    echo "  \"failed\": $( ((failed)) && echo true || echo false),"
    echo "  \"figures\": {"
    local i
    for ((i = 0; i < ${#FIGURES[@]}; i++)); do
      printf '    %s%s\n' "${FIGURES[i]}" "$( ((i + 1 < ${#FIGURES[@]})) && echo ,)"
    done
    echo "  },"
    echo "  \"parts\": ["
    for ((i = 0; i < ${#JSON_PARTS[@]}; i++)); do
      printf '    %s%s\n' "${JSON_PARTS[i]}" "$( ((i + 1 < ${#JSON_PARTS[@]})) && echo ,)"
    done
    echo "  ]"
    echo "}"
  } > "$out_dir/summary.json.tmp" && mv "$out_dir/summary.json.tmp" "$out_dir/summary.json"
  tar -C "$LOGS" -czf "$out_dir/logs.tar.gz.tmp" . 2>/dev/null &&
    mv "$out_dir/logs.tar.gz.tmp" "$out_dir/logs.tar.gz"
}
# fatal MESSAGE...: something is missing; say so and stop (exit 3).
fatal() {
  note "ABSENT: $*"
  record "${PART:-setup}" MISSING "$(elapsed)" "$*"
  note "total $(elapsed) s; logs: $LOGS (packed in $out_dir/logs.tar.gz)"
  pack
  exit 3
}

# limit_for CAP: the timeout a part gets, min(CAP, time left); 0 when under
# 15 s are left.
limit_for() {
  local left
  left=$(remaining)
  if ((left < 15)); then echo 0; elif (($1 < left)); then echo "$1"; else echo "$left"; fi
}
# run_part NAME CAP CMD...: CMD under min(CAP, time left), output to
# $LOGS/NAME.log; sets PART_RC and PART_S, and records nothing (the caller
# does, with what it read from the output). PART_RC 124: timed out; 99: not
# started, out of time.
run_part() {
  local name=$1 cap=$2 limit t0
  shift 2
  limit=$(limit_for "$cap")
  PART_S=0
  if ((limit == 0)); then PART_RC=99; return; fi
  echo "=== $name (limit ${limit} s, at $(elapsed) s)" >&2
  t0=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$LOGS/$name.log" 2>&1
  PART_RC=$?
  ((PART_RC == 137)) && PART_RC=124
  PART_S=$(( $(date +%s) - t0 ))
}
# status_of RC: OK, TIMEOUT, NO-TIME (not started: the budget was spent) or
# FAILED. All but OK fail the run; SKIPPED is only what cannot run here by
# design (no GPU with --allow-no-gpu).
status_of() {
  case "$1" in 0) echo OK ;; 124) echo TIMEOUT ;; 99) echo NO-TIME ;; *) echo FAILED ;; esac
}
# why_not NAME: what a part that did not pass left, for its summary line.
why_not() {
  if ((PART_RC == 99)); then echo "not started: out of time budget"; else
    echo "exit $PART_RC: $(tail -n 2 "$LOGS/$1.log" 2>/dev/null | tr '\n' ' ')"
  fi
}

# --- machine ---------------------------------------------------------------
PART=machine
{
  echo "--- uname: $(uname -a)"
  echo "--- os: $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME" || echo unknown)"
  echo "--- C library: $( (ldd --version 2>&1 || true) | head -1) $(ls /lib/ld-musl-* 2>/dev/null)"
  echo "--- CPUs: $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "--- memory: $(grep MemTotal /proc/meminfo)"
  echo "--- tools: $(for t in tar gzip xz sha256sum timeout python3 nvidia-smi; do
      printf '%s=%s ' "$t" "$(command -v "$t" || echo none)"; done)"
  echo "--- nvidia-smi"
  if command -v nvidia-smi > /dev/null; then timeout 30 nvidia-smi 2>&1; else echo "none"; fi
} > "$LOGS/machine.log" 2>&1
cat "$LOGS/machine.log"
gpu_names=""
if command -v nvidia-smi > /dev/null; then
  gpu_names=$(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap \
    --format=csv,noheader 2>/dev/null)
fi
# The first python3 with torch ($PYTHON first), else the first python3.
python="" torch_version=""
for p in "${PYTHON:-}" python3 /opt/torch/.venv/bin/python3 /usr/bin/python3; do
  [[ -n "$p" ]] && command -v "$p" > /dev/null || continue
  [[ -z "$python" ]] && python=$(command -v "$p")
  v=$(timeout 60 "$p" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda,
"available", torch.cuda.is_available())' 2>/dev/null | tail -1)
  if [[ -n "$v" ]]; then python=$(command -v "$p") torch_version=$v; break; fi
done
echo "--- python3: ${python:-none}; torch: ${torch_version:-none}" | tee -a "$LOGS/machine.log"
# The CPU code is built for x86-64-v3.
missing_flags=""
for f in avx2 fma bmi2 movbe f16c; do
  grep -qw "$f" /proc/cpuinfo || missing_flags+=" $f"
done
record machine OK "$(elapsed)" "GPU: ${gpu_names:-none seen by nvidia-smi}; torch: ${torch_version:-none}"
[[ -n "$missing_flags" ]] && fatal "this CPU lacks${missing_flags}: the bundle is built for x86-64-v3"

# --- unpack ----------------------------------------------------------------
PART=unpack
t0=$(date +%s)
archive=""
for a in "$bundle"/ps-gpu-bundle.tar.gz "$bundle"/ps-gpu-bundle.tar.xz; do
  [[ -f "$a" ]] && { archive=$a; break; }
done
[[ -z "$archive" ]] && fatal "no bundle at $bundle (ps-gpu-bundle.tar.gz or .tar.xz); build it" \
  "with bash deploy/dev/gpu/build_bundle.sh and carry it (carry [\"out/gpu_bundle\"])"
# The bundle's busybox is static: it runs without this machine's C library
# (copied, in case the copy that came lost its mode).
busybox=""
if [[ -f "$bundle/busybox" ]] && cp "$bundle/busybox" "$work/busybox" && chmod +x "$work/busybox"; then
  busybox="$work/busybox"
fi
sum=""
if command -v sha256sum > /dev/null; then
  sum=$(sha256sum "$archive" | cut -c1-64)
elif [[ -n "$python" ]]; then
  sum=$("$python" -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$archive")
elif [[ -n "$busybox" ]]; then
  sum=$("$busybox" sha256sum "$archive" | cut -c1-64)
fi
if [[ -f "$archive.sha256" && -n "$sum" ]]; then
  [[ "$(cut -c1-64 "$archive.sha256")" == "$sum" ]] ||
    fatal "$archive does not match $archive.sha256: a broken copy"
fi
# Unpacked once per archive: a rerun of the same bundle starts at once.
key=${sum:0:16}
[[ -z "$key" ]] && key=unverified
dest="$work/bundle-$key"
BROOT="$dest/ps-gpu-bundle"
if [[ "$key" == unverified || ! -f "$BROOT/.complete" ]]; then
  rm -rf "$dest"
  mkdir -p "$dest"
  case "$archive" in *.xz) zflag=J tool=xz ;; *) zflag=z tool=gzip ;; esac
  if command -v "$tool" > /dev/null && command -v tar > /dev/null; then
    unpacker="tar and $tool"
    tar -C "$dest" -x${zflag}f "$archive" > "$LOGS/unpack.log" 2>&1
  elif [[ -n "$python" ]]; then
    unpacker="python3's tarfile (no $tool here)"
    "$python" -c 'import sys,tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      "$archive" "$dest" > "$LOGS/unpack.log" 2>&1
  elif [[ -n "$busybox" ]]; then
    unpacker="the bundle's busybox (no $tool or python3 here)"
    "$busybox" tar -C "$dest" -x${zflag}f "$archive" > "$LOGS/unpack.log" 2>&1
  else
    fatal "neither $tool nor python3 nor a busybox in $bundle here to unpack $archive"
  fi || fatal "unpacking $archive with $unpacker failed: $(tail -3 "$LOGS/unpack.log")"
  touch "$BROOT/.complete"
else
  unpacker="nothing: unpacked by an earlier run"
fi
cp "$BROOT/BUNDLE.txt" "$LOGS/BUNDLE.txt"
LOADER="$BROOT/lib/ld-linux-x86-64.so.2"
[[ -x "$LOADER" ]] || fatal "the bundle has no lib/ld-linux-x86-64.so.2"
record unpack OK $(( $(date +%s) - t0 )) "$archive ($(du -h "$archive" | cut -f1)) into $BROOT with $unpacker"

# --- libs ------------------------------------------------------------------
PART=libs
t0=$(date +%s)
dirs=()
while read -r d; do dirs+=("$d"); done < <(cuda_lib_dirs "$python" /usr/local)
links="$work/cuda-links.$START"
mkdir -p "$links"
missing=""
found_dirs=()
declare -A found_in=()
{
  echo "searched, in order:"
  printf '  %s\n' "${dirs[@]}"
} > "$LOGS/libs.log"
while read -r soname; do
  [[ -z "$soname" ]] && continue
  if ! hit=$(first_dir_with "$soname" "${dirs[@]}"); then missing+=" $soname"; continue; fi
  ln -sf "$(realpath "$hit/$soname")" "$links/$soname"
  echo "found $soname: $hit/$soname -> $(realpath "$hit/$soname")" >> "$LOGS/libs.log"
  [[ -z "${found_in[$hit]:-}" ]] && found_dirs+=("$hit")
  found_in[$hit]+="${found_in[$hit]:+ }$soname"
done < "$BROOT/cuda_libs.txt"
found=""
for d in "${found_dirs[@]}"; do found+="${found_in[$d]} from $d; "; done
[[ -n "$missing" ]] && fatal "CUDA libraries not found on this machine:$missing (looked in" \
  "\$LD_LIBRARY_PATH, \$CUDA_HOME, \$CUDA_PATH, /usr/local/cuda*, python3's nvidia/*/lib and" \
  "ldconfig's folders: ${#dirs[@]} there, listed in libs.log)"
# The driver: libcuda.so.1 and its libnvidia-* companions, linked from their
# folder (not the whole folder, which may hold this machine's own libc).
driver=""
mapfile -t driver_dirs < <(driver_lib_dirs /)
if d=$(first_dir_with libcuda.so.1 "${driver_dirs[@]}" "${dirs[@]}"); then
  driver="$d/libcuda.so.1"
fi
driver_links="$work/driver-links.$START"
mkdir -p "$driver_links"
if [[ -n "$driver" ]]; then
  for f in "$(dirname "$driver")"/libcuda.so* "$(dirname "$driver")"/libnvidia-*.so*; do
    [[ -e "$f" ]] && ln -sf "$(realpath "$f")" "$driver_links/$(basename "$f")"
  done
  echo "driver: $driver -> $(realpath "$driver")" >> "$LOGS/libs.log"
else
  echo "driver: no libcuda.so.1 found" >> "$LOGS/libs.log"
fi
LIBPATH="$BROOT/lib:$links:$driver_links"
gpu=0
if [[ -n "$gpu_names" || ( -n "$driver" && ! -x "$(command -v nvidia-smi)" ) ]]; then gpu=1; fi
if [[ -n "$gpu_names" && -z "$driver" ]]; then
  fatal "nvidia-smi sees a GPU ($gpu_names) but no libcuda.so.1 was found (looked in" \
    "$(driver_lib_dirs / | tr '\n' ' ')and the CUDA folders)"
fi
if ((gpu == 0 && allow_no_gpu == 0)); then
  fatal "no GPU: nvidia-smi lists none and libcuda.so.1 is ${driver:-not found}" \
    "(pass --allow-no-gpu to run the CPU parts alone)"
fi
# Every binary loaded with every symbol bound now (what ldd -r does). The
# variables go to the bundled loader alone: set for env, they would trace env.
# --library-path replaces $LD_LIBRARY_PATH for the bundled programs (it stays
# for PyTorch, which may need it to find the driver); nothing is preloaded.
unset LD_PRELOAD
bad=""
for b in "$BROOT"/bin/* "$BROOT"/bin/tests/* "$BROOT"/bin/benchmarks/*; do
  [[ -f "$b" ]] || continue
  listing=$(env LD_TRACE_LOADED_OBJECTS=1 LD_WARN=yes LD_BIND_NOW=yes \
    "$LOADER" --library-path "$LIBPATH" "$b" 2>&1)
  echo "--- $(basename "$b")" >> "$LOGS/libs.log"
  echo "$listing" >> "$LOGS/libs.log"
  if grep -q -e 'not found' -e 'undefined symbol' <<< "$listing"; then
    bad+=" $(basename "$b"): $(grep -m2 -e 'not found' -e 'undefined symbol' <<< "$listing" | tr -s ' \t' ' ');"
  fi
  # Nothing of this machine's own libraries but the CUDA ones and the driver.
  outside=$(awk '$2 == "=>" {print $3}' <<< "$listing" |
    grep -v -e "^$BROOT/lib/" -e "^$links/" -e "^$driver_links/" | tr '\n' ' ')
  [[ -n "$outside" ]] && bad+=" $(basename "$b") loads $outside from outside the bundle;"
done
[[ -n "$bad" ]] && fatal "binaries that do not load here:$bad"
record libs OK $(( $(date +%s) - t0 )) "$found driver: ${driver:-none}"
pack

# --- tests -----------------------------------------------------------------
count() {  # count PATTERN FILE: matching lines, 0 without the file
  local n
  n=$(grep -c -- "$1" "$2" 2>/dev/null)
  echo "${n:-0}"
}
if want tests; then
  PART=tests
  mkdir -p "$LOGS/tests"
  limit=$(limit_for 240)
  t0=$(date +%s)
  # Each test gets 150 s at most, and no more than the part has left.
  run_test() {
    local name=$1 tmp="$work/tmp.$START/$1" lim rc
    lim=$(( limit - ($(date +%s) - t0) ))
    ((lim > 150)) && lim=150
    if ((lim < 5)); then echo 99 > "$LOGS/tests/$name.rc"; return; fi
    mkdir -p "$tmp"
    TEST_TMPDIR="$tmp" TEST_SRCDIR="$BROOT/runfiles" TEST_WORKSPACE=ps \
      timeout -k 5 "$lim" "$LOADER" --library-path "$LIBPATH" "$BROOT/bin/tests/$name" \
      --gtest_output="xml:$LOGS/tests/$name.xml" > "$LOGS/tests/$name.log" 2>&1
    rc=$?
    ((rc == 137)) && rc=124
    echo "$rc" > "$LOGS/tests/$name.rc"
  }
  names=()
  for t in "$BROOT"/bin/tests/*; do names+=("$(basename "$t")"); done
  if ((limit > 0)); then
    running=0
    for name in "${names[@]}"; do
      run_test "$name" &
      running=$((running + 1))
      if ((running >= jobs)); then wait -n; running=$((running - 1)); fi
    done
    wait
  fi
  total_cases=0 total_failed=0 total_skipped=0 passed=0 gpu_skips=""
  ((limit == 0)) && names_run=() || names_run=("${names[@]}")
  for name in "${names_run[@]}"; do
    xml="$LOGS/tests/$name.xml"
    rc=$(cat "$LOGS/tests/$name.rc" 2>/dev/null || echo 99)
    cases=$(count '<testcase ' "$xml")
    fails=$(count '<failure' "$xml")
    skips=$(count 'result="skipped"' "$xml")
    total_cases=$((total_cases + cases)) total_failed=$((total_failed + fails))
    total_skipped=$((total_skipped + skips))
    no_gpu=$(count 'no usable CUDA GPU' "$LOGS/tests/$name.log")
    st=$(status_of "$rc")
    if [[ "$st" == OK && "$gpu" == 1 && "$no_gpu" -gt 0 ]]; then
      st=FAILED
      gpu_skips+=" $name"
    fi
    [[ "$st" == OK ]] && passed=$((passed + 1))
    why=$(sed -n 's/.*<skipped message="[^&]*&#x0A;\([^"]*\)".*/\1/p' "$xml" 2>/dev/null |
      sort | uniq -c | sed 's/^ *//' | head -3 | tr '\n' ';')
    secs=$(grep -o 'time="[0-9.]*"' "$xml" 2>/dev/null | head -1 | tr -dc '0-9.' | cut -d. -f1)
    record "test $name" "$st" "${secs:-0}" "$cases cases, $fails failed, $skips skipped${why:+ ($why)}"
  done
  FIGURES+=("\"tests\": {\"binaries\": ${#names[@]}, \"passed\": $passed, \"cases\": $total_cases, \"failed\": $total_failed, \"skipped\": $total_skipped}")
  detail="${passed}/${#names[@]} binaries passed; $total_cases cases, $total_failed failed, $total_skipped skipped"
  if [[ -n "$gpu_skips" ]]; then
    detail+="; GPU cases SKIPPED on a GPU machine in:$gpu_skips"
  elif ((gpu == 0)); then
    detail+=" (no GPU here: the GPU cases skip, as they should)"
  fi
  if ((limit == 0)); then record tests NO-TIME 0 "out of time budget"; else
    record tests "$( ((passed == ${#names[@]})) && echo OK || echo FAILED)" \
      $(( $(date +%s) - t0 )) "$detail"
  fi
  pack
fi

# --- training with our worker ----------------------------------------------
# report_field FILE KEY: a top-level number of a worker's JSON report.
report_field() {
  sed -n "s/^  \"$2\": \\([-0-9.e+]*\\),*\$/\\1/p" "$1" 2>/dev/null | head -1
}
# split_ms FILE: "compute a, copy b, store c ms/step" from a report's
# time_split (all epochs) over its steps.
split_ms() {
  awk -F'[:,]' '
    /^  "steps":/ {steps = $2}
    /^    "(compute|copy|push|wait|pull|reduce)_s":/ {gsub(/[ "]/, "", $1); t[$1] = $2}
    END {
      if (steps > 0) printf "compute %.2f, reduce %.2f, copy %.2f, store %.2f ms/step", \
        1e3 * t["compute_s"] / steps, 1e3 * t["reduce_s"] / steps, 1e3 * t["copy_s"] / steps, \
        1e3 * (t["push_s"] + t["wait_s"] + t["pull_s"]) / steps
    }' "$1" 2>/dev/null
}
declare -A ours=()
# train NAME CAP WORKER_FLAGS...: one worker run with a JSON report.
train() {
  local name=$1 cap=$2
  shift 2
  local report="$LOGS/$name.json"
  run_part "$name" "$cap" "$LOADER" --library-path "$LIBPATH" "$BROOT/bin/worker" \
    --progress=false --report="$report" "$@"
  local st sps acc loss steps to_host
  st=$(status_of "$PART_RC")
  sps=$(report_field "$report" samples_per_second)
  to_host=$(report_field "$report" model_bytes_to_host_per_step)
  acc=$(report_field "$report" final_test_accuracy)
  loss=$(report_field "$report" final_train_loss)
  steps=$(report_field "$report" steps)
  if [[ "$st" == OK ]]; then
    ours[$name]=${sps:-0}
    FIGURES+=("\"$name\": {\"samples_per_second\": ${sps:-null}, \"final_test_accuracy\": ${acc:-null}, \"final_train_loss\": ${loss:-null}, \"steps\": ${steps:-null}, \"model_bytes_to_host_per_step\": ${to_host:-null}}")
    record "$name" OK "$PART_S" "$(printf '%.0f samples/s (%s; %.0f host-link bytes/step), test accuracy %s, train loss %s, %s steps' \
      "${sps:-0}" "$(split_ms "$report")" "${to_host:-0}" "${acc:-?}" "${loss:-?}" "${steps:-?}")"
  else
    record "$name" "$st" "$PART_S" "$(why_not "$name")"
  fi
  pack
}
synthetic=(--dataset=synthetic --batch_size=256)
data_dir="$BROOT/data/fashion-mnist"
if want train; then
  PART=train
  if ((gpu == 1)); then
    for devices in cuda cuda:0,0; do
      tag=${devices//[:,]/_}
      train "lenet_$tag" 60 --model=lenet "${synthetic[@]}" --epochs=3 --lr=0.9 --devices="$devices"
      train "resnet18_cifar_$tag" 60 --model=resnet18_cifar "${synthetic[@]}" --epochs=1 \
        --max_steps=40 --lr=0.05 --devices="$devices"
    done
    if [[ -s "$data_dir/train-images-idx3-ubyte.gz" ]]; then
      train lenet_fashion_mnist_cuda 60 --model=lenet --dataset=fashion_mnist \
        --data_dir="$data_dir" --batch_size=256 --epochs=2 --lr=0.9 --devices=cuda
    fi
  else
    record train SKIPPED 0 "no GPU: the CPU runs below instead"
    train lenet_cpu 60 --model=lenet "${synthetic[@]}" --epochs=2 --lr=0.9 --devices=cpu
    train lenet_cpu_2 60 --model=lenet "${synthetic[@]}" --epochs=1 --max_steps=16 --lr=0.9 \
      --devices=cpu:2
    train resnet18_cifar_cpu 60 --model=resnet18_cifar --dataset=synthetic --batch_size=32 \
      --epochs=1 --max_steps=3 --lr=0.05 --devices=cpu --evaluate=false
    if [[ -s "$data_dir/train-images-idx3-ubyte.gz" ]]; then
      train lenet_fashion_mnist_cpu 60 --model=lenet --dataset=fashion_mnist \
        --data_dir="$data_dir" --batch_size=256 --epochs=1 --max_steps=40 --lr=0.9 --devices=cpu
    fi
  fi
fi

# --- PyTorch on the same GPU -----------------------------------------------
declare -A theirs=()
if want pytorch; then
  PART=pytorch
  if ((gpu == 0)); then
    record pytorch SKIPPED 0 "no GPU"
  elif [[ -z "$python" || "$torch_version" != *"available True"* ]]; then
    record pytorch MISSING 0 "no python3 with a CUDA torch (python3: ${python:-none}, torch: ${torch_version:-none})"
  else
    pt_data=""
    [[ -s "$data_dir/train-images-idx3-ubyte.gz" ]] && pt_data=$data_dir
    run_part pytorch 120 env PYTHONUNBUFFERED=1 "$python" "$BROOT/py/pytorch_gpu.py" \
      --models=lenet,resnet18_cifar --batch_size=256 --lr=lenet=0.9,resnet18_cifar=0.05 \
      --data_dir="$pt_data" --json="$LOGS/pytorch.json"
    st=$(status_of "$PART_RC")
    detail=""
    while read -r model sps; do
      theirs[$model]=$sps
      detail+="$model $(printf '%.0f' "$sps") samples/s; "
      FIGURES+=("\"pytorch_$model\": {\"samples_per_second\": $sps}")
    done < <(sed -n 's/^{"model": "\([a-z0-9_]*\)", "batch_size": [0-9]*, "samples_per_second": \([0-9.e+-]*\),.*/\1 \2/p' \
      "$LOGS/pytorch.log")
    [[ "$st" == OK && -n "$detail" ]] || detail=$(why_not pytorch)
    record pytorch "$st" "$PART_S" "$detail (torch ${torch_version})"
  fi
  pack
fi

# --- the daemons: a server and two workers over loopback ---------------------
if want cluster; then
  PART=cluster
  cluster() {
    local devices=$1 port_file="$LOGS/cluster_port" server_pid rc=0 w
    rm -f "$port_file"
    "$LOADER" --library-path "$LIBPATH" "$BROOT/bin/server" --port=0 --port_file="$port_file" \
      --num_workers=2 --lr=0.9 > "$LOGS/cluster_server.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 100); do [[ -s "$port_file" ]] && break; sleep 0.1; done
    if [[ ! -s "$port_file" ]]; then
      echo "the server did not start"; kill "$server_pid" 2>/dev/null; return 1
    fi
    "$LOADER" --library-path "$LIBPATH" "$BROOT/bin/health_check" \
      --address="127.0.0.1:$(cat "$port_file")" || rc=1
    local pids=()
    for w in 0 1; do
      "$LOADER" --library-path "$LIBPATH" "$BROOT/bin/worker" --server="127.0.0.1:$(cat "$port_file")" \
        --rank=$w --worker_id=worker-$w --model=lenet --dataset=synthetic --batch_size=256 \
        --epochs=2 --devices="$devices" --progress=false --evaluate=$((w == 0)) \
        --report="$LOGS/cluster_worker$w.json" > "$LOGS/cluster_worker$w.log" 2>&1 &
      pids+=($!)
    done
    for w in "${pids[@]}"; do wait "$w" || rc=1; done
    kill "$server_pid" 2>/dev/null
    wait "$server_pid" 2>/dev/null
    tail -n 3 "$LOGS"/cluster_worker*.log
    return $rc
  }
  export -f cluster
  export LOADER LIBPATH BROOT LOGS
  cluster_devices=cpu
  ((gpu == 1)) && cluster_devices=cuda
  run_part cluster 60 bash -c "cluster $cluster_devices"
  st=$(status_of "$PART_RC")
  sps=$(report_field "$LOGS/cluster_worker0.json" global_samples_per_second)
  acc=$(report_field "$LOGS/cluster_worker0.json" final_test_accuracy)
  [[ "$st" == OK ]] && FIGURES+=("\"cluster_$cluster_devices\": {\"global_samples_per_second\": ${sps:-null}, \"final_test_accuracy\": ${acc:-null}}")
  if [[ "$st" == OK ]]; then
    detail="server + 2 workers x --devices=$cluster_devices, LeNet 2 epochs: $(printf '%.0f' \
      "${sps:-0}") samples/s all workers, test accuracy ${acc:-?}"
  else
    detail="$(why_not cluster) $(tail -n 1 "$LOGS"/cluster_worker0.log 2>/dev/null)"
  fi
  record "cluster ($cluster_devices)" "$st" "$PART_S" "$detail"
  pack
fi

# --- CPU benchmarks ----------------------------------------------------------
if want benchmarks; then
  PART=benchmarks
  bench() {
    local name=$1 cap=$2
    shift 2
    run_part "$name" "$cap" "$LOADER" --library-path "$LIBPATH" "$BROOT/bin/benchmarks/$name" "$@"
    if ((PART_RC == 0)); then
      record "$name" OK "$PART_S" "$(grep -v '^ *$' "$LOGS/$name.log" | tail -n 1 | tr -s ' ')"
    else
      record "$name" "$(status_of "$PART_RC")" "$PART_S" "$(why_not "$name")"
    fi
    pack
  }
  bench trainer_benchmark 60 --models=lenet --steps=20
  bench model_benchmark 60 --model=resnet18 --batch=64 --threads="$(nproc)" --steps=5
  bench kernels_benchmark 90 --benchmark_min_time=0.05 --benchmark_filter='BM_Gemm|BM_LeNetConvStep'
fi

# --- comparison --------------------------------------------------------------
if ((${#ours[@]} > 0)); then
  note ""
  note "samples/s at batch 256 (ours: worker --report after its first epoch; PyTorch: best of 3 x 30 steps)"
  for model in lenet resnet18_cifar; do
    for tag in cuda cuda_0_0 cpu; do
      o=${ours[${model}_$tag]:-}
      [[ -z "$o" ]] && continue
      t=${theirs[$model]:-}
      if [[ -n "$t" ]]; then
        note "$(printf '  %-9s --devices=%-9s ours %9.0f   PyTorch (1 GPU) %9.0f   ours/PyTorch %.2f' \
          "$model" "${tag/_0_0/:0,0}" "$o" "$t" "$(awk -v a="$o" -v b="$t" 'BEGIN {print a / b}')")"
      else
        note "$(printf '  %-9s --devices=%-9s ours %9.0f' "$model" "${tag/_0_0/:0,0}" "$o")"
      fi
    done
  done
fi
note "total $(elapsed) s of $budget s; logs: $LOGS (packed in $out_dir/logs.tar.gz)"
pack
exit "$failed"
