"""PyTorch's CPU GEMM on the shapes kernels_benchmark's BM_Gemm measures ours
on: the yardstick for kernels/gemm.h. torch.mm on CPU calls the system BLAS
(Debian's OpenBLAS, under this machine's OPENBLAS_CORETYPE), the library our
GEMM used before it moved to oneDNN's sgemm; --threads sets OpenBLAS's
thread count too (pytorch_lenet.set_torch_threads). Prints GFLOP/s per shape, best
of --repeats timed runs of about --seconds each. Not a test.

    /usr/bin/python3 deploy/dev/bench/torch_gemm.py [--threads=1] [--repeats=3]
    bazel run -c opt //kernels:kernels_benchmark -- --benchmark_filter=BM_Gemm
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_lenet import set_torch_threads  # noqa: E402  (deploy/dev/bench/pytorch_lenet.py)

# (m, n, k, trans_a, trans_b) as in kernels_benchmark.cc's GemmArgs:
# C [m x n] = op(A) op(B).
SHAPES = [
    (256, 256, 256, 0, 0),
    (1024, 1024, 1024, 0, 0),
    (6, 256 * 28 * 28, 25, 0, 0),
    (16, 256 * 10 * 10, 150, 0, 0),
    (256, 120, 400, 0, 1),
    (256, 84, 120, 0, 1),
    (128, 4096, 784, 0, 1),
    (128, 4096, 4096, 0, 1),
    (128, 4096, 4096, 0, 0),
    (4096, 4096, 128, 1, 0),
    (64, 784, 576, 0, 0),
]


def operand(rows, cols, transposed, seed):
    g = torch.Generator().manual_seed(seed)
    stored = torch.rand((cols, rows) if transposed else (rows, cols), generator=g)
    return stored.t() if transposed else stored


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.5)
    args = parser.parse_args()
    set_torch_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s)")
    print(f"{'m':>6} {'n':>8} {'k':>6} {'tA':>3} {'tB':>3} {'GFLOP/s':>9}")
    for m, n, k, ta, tb in SHAPES:
        a, b = operand(m, k, ta, 1), operand(k, n, tb, 2)
        c = torch.empty(m, n)
        best = 0.0
        for _ in range(args.repeats):
            torch.mm(a, b, out=c)
            reps, start = 0, time.perf_counter()
            while True:
                torch.mm(a, b, out=c)
                reps += 1
                elapsed = time.perf_counter() - start
                if elapsed >= args.seconds:
                    break
            best = max(best, 2.0 * m * n * k * reps / elapsed / 1e9)
        print(f"{m:>6} {n:>8} {k:>6} {ta:>3} {tb:>3} {best:>9.1f}")


if __name__ == "__main__":
    main()
