#!/usr/bin/env python3
"""PyTorch's training throughput on a GPU for the models the GPU check trains
with our worker, as its yardstick (deploy/dev/gpu/run_bundle.sh runs both).

The same networks as ours (worker/model/torch_models.py: D2L's LeNet with
sigmoid and average pooling, D2L's ResNet-18 on 1x28x28 inputs), the same
global batch, torch.optim.SGD at the same learning rate (no momentum, no
weight decay: the worker's defaults), cross-entropy with mean reduction.
Each step copies its batch from pinned host memory to the GPU, as our worker
copies each step's batch, then runs forward, loss, backward and the
optimizer step. --warmup untimed steps, then --repeats runs of --steps timed
steps, each ended by torch.cuda.synchronize(); the best run is reported
(other load only ever slows a run). Data: Fashion-MNIST from --data_dir when
its training files are there (pixels / 255), else uniform random pixels and
labels; the throughput does not depend on which.

    python3 deploy/dev/gpu/pytorch_gpu.py --models=lenet,resnet18_cifar --batch_size=256
    python3 deploy/dev/gpu/pytorch_gpu.py --json=out.json   # one JSON object per model

PyTorch runs its convolutions in cuDNN (TF32 allowed for convolutions by
default, not for matrix products); the settings in force are printed.
Exit status 2 when torch is missing or sees no CUDA device, with a message.
"""

import argparse
import gzip
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# torch_models.py lies beside this file in the bundle, and in
# worker/model/ in the repository.
for candidate in (HERE, os.path.join(HERE, "..", "..", "..", "worker", "model")):
    if os.path.exists(os.path.join(candidate, "torch_models.py")):
        sys.path.insert(0, candidate)
        break


def read_idx(path):
    """An IDX file (gzip-compressed) as bytes and its dimensions."""
    with gzip.open(path, "rb") as f:
        blob = f.read()
    ndim = blob[3]
    dims = [int.from_bytes(blob[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return blob[4 + 4 * ndim:], dims


def load_data(torch, data_dir, samples):
    """(images [N, 1, 28, 28] float32, labels [N] int64, description), on the
    host, pinned where CUDA is there."""
    images_path = os.path.join(data_dir, "train-images-idx3-ubyte.gz")
    labels_path = os.path.join(data_dir, "train-labels-idx1-ubyte.gz")
    if data_dir and os.path.exists(images_path) and os.path.exists(labels_path):
        images, dims = read_idx(images_path)
        labels, _ = read_idx(labels_path)
        n = min(samples, dims[0])
        x = torch.frombuffer(bytearray(images[:n * 784]), dtype=torch.uint8)
        x = (x.float() / 255).reshape(n, 1, 28, 28)
        y = torch.frombuffer(bytearray(labels[:n]), dtype=torch.uint8).long()
        description = f"Fashion-MNIST from {data_dir} ({n} samples)"
    else:
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, 256, (samples, 1, 28, 28), generator=g).float() / 255
        y = torch.randint(0, 10, (samples,), generator=g)
        description = f"random pixels and labels ({samples} samples)"
    x, y = x.contiguous(), y
    if torch.cuda.is_available():
        x, y = x.pin_memory(), y.pin_memory()
    return x, y, description


def measure(torch, torch_models, name, x, y, batch, lr, warmup, steps, repeats, device):
    torch.manual_seed(0)
    model = torch_models.init_like_cpp(torch_models.build(name)).to(device)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    batches = x.shape[0] // batch

    def step(i):
        b = i % batches
        xb = x[b * batch:(b + 1) * batch].to(device, non_blocking=True)
        yb = y[b * batch:(b + 1) * batch].to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        optimizer.step()
        return loss

    cuda = device.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    for i in range(warmup):
        step(i)
    sync()
    rates = []
    i = warmup
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            loss = step(i)
            i += 1
        sync()
        rates.append(batch * steps / (time.perf_counter() - start))
    best = max(rates)
    rates.sort()
    return {
        "model": name,
        "batch_size": batch,
        "lr": lr,
        "samples_per_second": best,
        "median_samples_per_second": rates[len(rates) // 2],
        "ms_per_step": 1e3 * batch / best,
        "last_loss": float(loss.item()),
        "peak_gpu_memory_bytes": int(torch.cuda.max_memory_allocated(device)) if cuda else 0,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="lenet,resnet18_cifar")
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--lr", default="lenet=0.9,resnet18_cifar=0.05",
                        help="a number, or model=number pairs, comma-separated")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--data_dir", default="")
    parser.add_argument("--json", default="", help="write the results here")
    args = parser.parse_args()

    try:
        import torch
    except ImportError as e:
        print(f"pytorch_gpu: no torch in {sys.executable}: {e}", file=sys.stderr)
        return 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"pytorch_gpu: torch {torch.__version__} sees no CUDA device", file=sys.stderr)
        return 2
    import torch_models  # noqa: E402  (torch_models.py, beside or in worker/model)

    lrs = {}
    for part in args.lr.split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            lrs[k] = float(v)
        else:
            lrs["*"] = float(part)
    device = torch.device(args.device)
    x, y, description = load_data(torch, args.data_dir, args.batch_size * 20)
    header = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "data": description,
    }
    print(json.dumps(header))
    results = []
    for name in args.models.split(","):
        lr = lrs.get(name, lrs.get("*", 0.1))
        r = measure(torch, torch_models, name, x, y, args.batch_size, lr, args.warmup,
                    args.steps, args.repeats, device)
        r.update(header)
        results.append(r)
        print(json.dumps({k: r[k] for k in ("model", "batch_size", "samples_per_second",
                                              "ms_per_step", "peak_gpu_memory_bytes",
                                              "last_loss")}), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
