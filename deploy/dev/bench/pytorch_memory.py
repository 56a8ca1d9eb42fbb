#!/usr/bin/python3
"""PyTorch's peak resident memory training the models our worker trains, the
yardstick for the worker's peak_rss_bytes (its JSON report) and
`/usr/bin/time -v` ("Maximum resident set size").

The same networks (worker/model/torch_models.py's twins of our "lenet" and
"resnet18"), torch.optim.SGD (momentum 0.9, so the optimizer holds a buffer
as our store does), batch and steps as given, on one CPU thread by default:

  lenet     Fashion-MNIST's 60,000 training and 10,000 test images held as
            they are stored (uint8, as our worker holds them, converted to
            float per batch), or as float32 tensors with --float_dataset
            (what torchvision's ToTensor pipeline keeps), then the test set
            evaluated in batches of 1,000 (as our trainer does)
  resnet18  uniform random images and labels (8,192 + 2,048, as our
            --dataset=synthetic), no evaluation

Prints the peak RSS of this process (getrusage), which includes the torch
libraries themselves; the line before it, right after `import torch`, gives
that part alone.

    /usr/bin/time -v /usr/bin/python3 deploy/dev/bench/pytorch_memory.py --model=lenet --steps=235
    /usr/bin/python3 deploy/dev/bench/pytorch_memory.py --model=resnet18 --batch_size=64 --steps=10

Use Debian's /usr/bin/python3 (python3-torch 1.13).
"""

import argparse
import gzip
import os
import resource
import sys


def peak_mb():
    # Linux counts ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6


def read_idx(path):
    import numpy as np
    with gzip.open(path, "rb") as f:
        blob = f.read()
    ndim = blob[3]
    dims = [int.from_bytes(blob[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(blob, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims).copy()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="lenet", choices=["lenet", "resnet18"])
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=235, help="235: one epoch of LeNet at 256")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--float_dataset", action="store_true",
                        help="hold the images as float32 (4 bytes a pixel)")
    parser.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    args = parser.parse_args()

    import torch  # noqa: E402
    from torch import nn  # noqa: E402
    print(f"torch {torch.__version__}: peak RSS after import {peak_mb():.1f} MB", flush=True)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                    "worker", "model"))
    import torch_models  # noqa: E402  (worker/model/torch_models.py)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.model == "lenet":
        splits = []
        for prefix in ("train", "t10k"):
            images = torch.from_numpy(read_idx(os.path.join(
                args.data_dir, f"{prefix}-images-idx3-ubyte.gz"))).unsqueeze(1)
            labels = torch.from_numpy(read_idx(os.path.join(
                args.data_dir, f"{prefix}-labels-idx1-ubyte.gz"))).long()
            if args.float_dataset:
                images = images.float() / 255
            splits.append((images, labels))
        (x, y), (x_test, y_test) = splits
    else:
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, 256, (8192, 1, 28, 28), generator=g, dtype=torch.uint8)
        y = torch.randint(0, 10, (8192,), generator=g)
        x_test = y_test = None

    def as_input(images):
        return images if images.dtype == torch.float32 else images.float() / 255

    model = torch_models.init_like_cpp(torch_models.build(args.model))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    batches = x.shape[0] // args.batch_size
    model.train()
    for i in range(args.steps):
        b = i % batches
        xb = as_input(x[b * args.batch_size:(b + 1) * args.batch_size])
        yb = y[b * args.batch_size:(b + 1) * args.batch_size]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        optimizer.step()
    print(f"trained {args.steps} steps of {args.model} at batch {args.batch_size}, "
          f"last loss {loss.item():.4f}", flush=True)
    if x_test is not None:
        model.eval()
        correct = 0
        with torch.no_grad():
            for begin in range(0, x_test.shape[0], 1000):
                out = model(as_input(x_test[begin:begin + 1000]))
                correct += (out.argmax(1) == y_test[begin:begin + 1000]).sum().item()
        print(f"test accuracy {correct / x_test.shape[0]:.4f}")
    print(f"peak resident memory {peak_mb():.1f} MB")


if __name__ == "__main__":
    main()
