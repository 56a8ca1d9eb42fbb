#!/usr/bin/python3
"""PyTorch's CPU training throughput on D2L's ResNet-18 (28x28 Fashion-MNIST
input), the yardstick for
`bazel run //worker:trainer_benchmark -- --models=resnet18 --batch_size=B`.

The same network (worker/model/torch_models.py's ResNet18, the twin of our
"resnet18"), torch.optim.SGD with trainer_benchmark's settings (lr 0.1,
momentum 0.9), cross-entropy with mean reduction, on uniform random pixels
and labels already in memory (as --dataset=synthetic). Each thread count runs
warm-up steps, then --repeats runs of timed steps, and prints the best run's
samples/s and the median. Only the training step is timed (forward, loss,
backward, optimizer step).

    /usr/bin/python3 deploy/bench/pytorch_resnet.py --batch_size=64 --threads=1,2

Use Debian's /usr/bin/python3 (python3-torch 1.13, which runs oneDNN 2.6 for
convolutions); a python3 earlier on PATH may lack torch.
"""

import argparse
import os
import platform
import sys
import time

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "worker", "model"))
import torch_models  # noqa: E402  (worker/model/torch_models.py)


def measure(x, y, threads, batch, lr, warmup, steps, repeats):
    """(best samples/s, its ms/step, median samples/s, last loss)."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = torch_models.init_like_cpp(torch_models.build("resnet18"))
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    batches = x.shape[0] // batch

    def step(i):
        b = i % batches
        xb, yb = x[b * batch:(b + 1) * batch], y[b * batch:(b + 1) * batch]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        optimizer.step()
        return loss

    for i in range(warmup):
        step(i)
    rates = []
    i = warmup
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            loss = step(i)
            i += 1
        rates.append(batch * steps / (time.perf_counter() - start))
    best = max(rates)
    return best, 1e3 * batch / best, float(np.median(rates)), loss.item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs; MKL-DNN {'on' if torch.backends.mkldnn.is_available() else 'off'}")
    print(f"ResNet-18 (28x28), batch {args.batch_size}, SGD lr {args.lr} momentum 0.9; "
          f"{args.warmup} warm-up, then {args.repeats} x {args.steps} timed steps; "
          f"load average before: {os.getloadavg()[0]:.2f}")
    print(f"{'threads':>7} {'ms/step':>9} {'samples/s':>10} {'median':>10} {'last loss':>10}")
    for threads in (int(t) for t in args.threads.split(",")):
        best, ms, median, loss = measure(x, y, threads, args.batch_size, args.lr, args.warmup,
                                         args.steps, args.repeats)
        print(f"{threads:>7} {ms:>9.2f} {best:>10.1f} {median:>10.1f} {loss:>10.4f}")


if __name__ == "__main__":
    main()
