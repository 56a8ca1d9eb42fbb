#!/usr/bin/python3
"""PyTorch's CPU training throughput on D2L's LeNet, the yardstick for
`bazel run //worker:trainer_benchmark -- --models=lenet`.

The same network (sigmoid, average pooling; worker/model/torch_models.py's
LeNet, the twin of our "lenet"), batch 256, torch.optim.SGD at lr 0.9 (D2L's
setting), cross-entropy with mean reduction, on data already in memory:
Fashion-MNIST when it is installed (pixels / 255, as our default
normalisation), else uniform random pixels and labels. Each thread count runs
warm-up steps, then --repeats runs of timed steps over consecutive batches,
and prints the best run's samples/s and the median (other load on the
machine only ever slows a run). Only the training step is timed (forward,
loss, backward, optimizer step); no data loading, no evaluation.

    /usr/bin/python3 deploy/dev/bench/pytorch_lenet.py
    /usr/bin/python3 deploy/dev/bench/pytorch_lenet.py --threads=1,2 --steps=100

Use Debian's /usr/bin/python3 (python3-torch); a python3 earlier on PATH may
lack torch.
"""

import argparse
import ctypes
import gzip
import os
import platform
import sys
import time

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "worker", "model"))
import torch_models  # noqa: E402  (worker/model/torch_models.py)


def read_idx(path):
    """An IDX file (gzip-compressed) as a numpy array."""
    with gzip.open(path, "rb") as f:
        blob = f.read()
    ndim = blob[3]
    dims = [int.from_bytes(blob[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(blob, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_data(data_dir, samples):
    """(images [N, 1, 28, 28] float32, labels [N] int64, description)."""
    images_path = os.path.join(data_dir, "train-images-idx3-ubyte.gz")
    labels_path = os.path.join(data_dir, "train-labels-idx1-ubyte.gz")
    if os.path.exists(images_path) and os.path.exists(labels_path):
        images = read_idx(images_path)[:samples]
        labels = read_idx(labels_path)[:samples]
        x = torch.from_numpy(images.astype(np.float32) / np.float32(255)).unsqueeze(1)
        y = torch.from_numpy(labels.astype(np.int64))
        return x.contiguous(), y, f"Fashion-MNIST from {data_dir} ({x.shape[0]} samples)"
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (samples, 1, 28, 28), generator=g).float() / 255
    y = torch.randint(0, 10, (samples,), generator=g)
    return x, y, f"random pixels and labels ({samples} samples)"


def set_torch_threads(threads):
    """PyTorch on `threads` threads in every library it computes with.

    torch.set_num_threads sets OpenMP's team (its own kernels, oneDNN's
    convolutions) but not the BLAS that torch.mm and nn.Linear call here:
    Debian's OpenBLAS (pthreads) keeps its default of every core, so a
    "1 thread" PyTorch ran its GEMMs on two cores (measured: 1.99 CPU
    seconds per wall second in torch.mm at set_num_threads(1), and 2x the
    GFLOP/s of OpenBLAS on one thread). Its own openblas_set_num_threads,
    on the library the process loaded, takes the count too."""
    torch.set_num_threads(threads)
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libopenblas" in line}
    for path in paths:
        ctypes.CDLL(path).openblas_set_num_threads(threads)


def measure(x, y, threads, batch, lr, warmup, steps, repeats, model_name="lenet", momentum=0.0):
    """Samples/s of `steps` timed training steps of torch_models' `model_name`
    (SGD at `lr` and `momentum`) after `warmup` untimed ones, `repeats` times
    over: (best rate, its ms/step, median rate, last loss)."""
    set_torch_threads(threads)
    torch.manual_seed(0)
    model = torch_models.init_like_cpp(torch_models.build(model_name))
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
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


def torch_description():
    """PyTorch's version, the CPU and whether oneDNN (MKL-DNN) is there."""
    return (f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
            f"{os.cpu_count()} CPUs; "
            f"MKL-DNN {'on' if torch.backends.mkldnn.is_available() else 'off'}")


def print_rates(x, y, args, decimals, model_name="lenet", momentum=0.0):
    """One row per thread count in args.threads (comma-separated): measure()
    with args' batch size, lr, warm-up, steps and repeats; samples/s with
    `decimals` decimals. pytorch_resnet.py prints its table with it."""
    print(f"{'threads':>7} {'ms/step':>9} {'samples/s':>10} {'median':>10} {'last loss':>10}")
    for threads in (int(t) for t in args.threads.split(",")):
        best, ms, median, loss = measure(x, y, threads, args.batch_size, args.lr, args.warmup,
                                         args.steps, args.repeats, model_name, momentum)
        print(f"{threads:>7} {ms:>9.2f} {best:>10.{decimals}f} {median:>10.{decimals}f} "
              f"{loss:>10.4f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.9)
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=40, help="timed steps (matches "
                        "trainer_benchmark's default)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs; the best is "
                        "reported, as other load on the machine only slows a run down")
    parser.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    args = parser.parse_args()

    samples = args.batch_size * 40  # 40 distinct batches, cycled
    x, y, description = load_data(args.data_dir, samples)
    print(torch_description())
    print(f"data: {description}; LeNet (sigmoid, avg-pool), batch {args.batch_size}, "
          f"SGD lr {args.lr}; {args.warmup} warm-up, then {args.repeats} x {args.steps} timed "
          f"steps; load average before: {os.getloadavg()[0]:.2f}")
    print_rates(x, y, args, decimals=0)


if __name__ == "__main__":
    main()
