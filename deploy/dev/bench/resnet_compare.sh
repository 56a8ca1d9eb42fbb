#!/usr/bin/env bash
# One ResNet-18 trained on one CPU thread by our trainer
# (worker/trainer_benchmark, -c opt) side by side with PyTorch 1.13
# (deploy/dev/bench/pytorch_resnet.py, /usr/bin/python3, one thread in every
# library), alternating ours and theirs round by round so that both see the
# machine's load of the moment; not a test. Prints every round's samples/s
# and ratio, then each side's range and the ratio's median and range.
#
#   bash deploy/dev/bench/resnet_compare.sh [--model=resnet18_cifar] [--batch_size=64]
#                                           [--steps=10] [--rounds=3]
#
# Both take 28x28 one-channel inputs of uniform random pixels and labels,
# SGD at lr 0.1 with momentum 0.9, and time the whole training step (forward,
# loss, backward, update) after warm-up steps (ours 5, PyTorch 3); ours is
# the mean over --steps steps, PyTorch's its one run of --steps steps.
set -euo pipefail
cd "$(dirname "$0")/../../.."

model=resnet18_cifar batch=64 steps=10 rounds=3
for arg in "$@"; do
  case "$arg" in
    --model=*) model="${arg#*=}" ;;
    --batch_size=*) batch="${arg#*=}" ;;
    --steps=*) steps="${arg#*=}" ;;
    --rounds=*) rounds="${arg#*=}" ;;
    *) echo "resnet_compare: unknown flag $arg" >&2; exit 2 ;;
  esac
done
bazel build -c opt //worker:trainer_benchmark >/dev/null 2>&1
ours=() theirs=()
for ((r = 1; r <= rounds; ++r)); do
  # trainer_benchmark's row: model, "1 device x 1 thread", precision, step
  # ms (the 8th field), samples/s (rounded to a whole number: recomputed).
  o=$(bazel-bin/worker/trainer_benchmark --models="$model" --batch_size="$batch" \
        --steps="$steps" --configs=1x1 |
        awk -v m="$model" -v b="$batch" '$1 == m { printf "%.1f", b * 1000 / $8 }')
  # pytorch_resnet.py's row: threads, ms/step, samples/s, median, last loss.
  t=$(/usr/bin/python3 deploy/dev/bench/pytorch_resnet.py --model="$model" \
        --batch_size="$batch" --steps="$steps" --repeats=1 --threads=1 | awk '$1 == 1 { print $3 }')
  ours+=("$o") theirs+=("$t")
  echo "round $r: ours $o samples/s, PyTorch $t samples/s, ratio $(awk -v a="$o" -v b="$t" \
    'BEGIN { printf "%.2f", a / b }')"
done
/usr/bin/python3 - "$model" "$batch" "${ours[*]}" "${theirs[*]}" <<'EOF'
import statistics
import sys

model, batch, ours, theirs = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split()
ours, theirs = [float(x) for x in ours], [float(x) for x in theirs]
ratios = [o / t for o, t in zip(ours, theirs)]
print(f"{model}, batch {batch}, 1 thread, {len(ours)} rounds: ours {min(ours):.1f}-{max(ours):.1f} "
      f"samples/s, PyTorch {min(theirs):.1f}-{max(theirs):.1f}; ratio median "
      f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
EOF
