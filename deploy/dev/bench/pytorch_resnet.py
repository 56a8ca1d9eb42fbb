#!/usr/bin/python3
"""PyTorch's CPU training throughput on D2L's ResNet-18 (28x28 Fashion-MNIST
input), the yardstick for
`bazel run //worker:trainer_benchmark -- --models=resnet18 --batch_size=B`
(and, with --model=resnet18_cifar, for `--models=resnet18_cifar`).

The same network (worker/model/torch_models.py's ResNet18, the twin of our
"resnet18", or of "resnet18_cifar", D2L section 13.6's 3x3-stem variant
without max pooling), torch.optim.SGD with trainer_benchmark's settings (lr 0.1,
momentum 0.9), cross-entropy with mean reduction, on uniform random pixels
and labels already in memory (as --dataset=synthetic). Each thread count runs
warm-up steps, then --repeats runs of timed steps, and prints the best run's
samples/s and the median. Only the training step is timed (forward, loss,
backward, optimizer step).

    /usr/bin/python3 deploy/dev/bench/pytorch_resnet.py --batch_size=64 --threads=1,2
    /usr/bin/python3 deploy/dev/bench/pytorch_resnet.py --model=resnet18_cifar --threads=1

Use Debian's /usr/bin/python3 (python3-torch 1.13, which runs oneDNN 2.6 for
convolutions); a python3 earlier on PATH may lack torch.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pytorch_lenet  # noqa: E402  (beside this file: the timed training loop)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18", choices=["resnet18", "resnet18_cifar"])
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs; the best is "
                        "reported, as other load on the machine only slows a run down")
    args = parser.parse_args()

    g = torch.Generator().manual_seed(0)
    samples = args.batch_size * 4
    x = torch.rand((samples, 1, 28, 28), generator=g)
    y = torch.randint(0, 10, (samples,), generator=g)
    print(pytorch_lenet.torch_description())
    print(f"{args.model} (28x28), batch {args.batch_size}, SGD lr {args.lr} momentum 0.9; "
          f"{args.warmup} warm-up, then {args.repeats} x {args.steps} timed steps; "
          f"load average before: {os.getloadavg()[0]:.2f}")
    # Timed as pytorch_lenet.py times LeNet, with trainer_benchmark's momentum.
    pytorch_lenet.print_rates(x, y, args, decimals=1, model_name=args.model, momentum=0.9)


if __name__ == "__main__":
    main()
