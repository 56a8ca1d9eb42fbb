"""Dive into Deep Learning's training function (train_ch6) on Fashion-MNIST,
data-parallel through ps.torch.

    PYTHONPATH=bazel-bin/worker/python /usr/bin/python3 -m ps.torch.run --workers=2 \
      --server=bazel-bin/server/server --server_arg=--lr=0.9 -- \
      worker/python/examples/d2l_train.py --model=lenet --epochs=10 --plot=/tmp/lenet.png

Every worker draws the same shuffled order of the training split each epoch
(the seed and the epoch fix it) and takes its part of each global batch:
rows rank, rank + W, ... . Its loss is the mean over its part and it states
its sample count (set_samples), so the server's update is the global batch's
mean gradient, as one process on the whole batch would compute it. The
server runs SGD (--lr, --momentum, --weight_decay are the server's flags).

The last --val_size images of the training file are held out as a
validation split. Rank 0 prints, per epoch, the training loss and accuracy
over its own parts of the batches (half the samples with 2 workers: no
all-reduce is needed for a report), then the validation accuracy and, at the
end, the test accuracy, both over the whole split with the job's current
parameters, and the test accuracy of the parameters of the epoch with the
best validation accuracy (the split's use: choosing the epoch, since
sigmoid LeNet at lr 0.9 swings a few points from epoch to epoch); with
--plot it writes the curves as a PNG (matplotlib, Agg).
The other ranks only train. Exit status 0, or 1 with the ps.Error printed.

--device=cuda trains on GPUs; --replicas=K keeps K local replicas per
worker (D2L 13.5/13.6's multi-GPU train_batch), each on an equal part of
the worker's rows, their gradients summed locally before the one push
(ps.torch's replicas=); rank 0 evaluates with its first replica.
"""

import argparse
import copy
import gzip
import os
import sys
import time

import numpy as np
import torch
from torch.nn import functional as F

import ps
import ps.torch

# worker/model/torch_models.py: the torch equivalents of the C++ models.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "model"))
import torch_models  # noqa: E402

_DATA_DIR = "/usr/share/datasets/fashion-mnist"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="lenet", choices=["lenet", "resnet18_cifar"])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch_size", type=int, default=256, help="global batch, all workers")
    p.add_argument("--data_dir", default=_DATA_DIR, help="the four idx .gz files")
    p.add_argument("--val_size", type=int, default=5000,
                   help="images held out from the end of the training file (0: none, "
                        "as D2L's train_ch6)")
    p.add_argument("--train_limit", type=int, default=0,
                   help="train on the first N images of the training split only (0: all); "
                        "for quick tests")
    p.add_argument("--eval_limit", type=int, default=0,
                   help="validate and test on the first N images of each split (0: all)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--device", default="cpu",
                   help="cpu; cuda (the GPUs in turn from $LOCAL_RANK x --replicas); cuda:N")
    p.add_argument("--replicas", type=int, default=1,
                   help="local model replicas per worker, each on an equal part of the "
                        "worker's batch (D2L 13.5's train_batch); on the GPUs in turn with "
                        "--device=cuda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default="", help="write the per-epoch curves to this PNG")
    args = p.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.val_size < 0 or args.replicas < 1:
        p.error("--epochs, --batch_size and --replicas must be positive, --val_size not negative")
    if args.device != "cpu" and not args.device.startswith("cuda"):
        p.error(f"--device={args.device}: cpu, cuda or cuda:N")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device={args.device}: CUDA is not available to this process "
                "(torch.cuda.is_available() is False)")
    return args


def replica_devices(device, replicas, local_rank):
    """One device per local replica: the CPU, cuda:N, or with "cuda" this
    worker's run of GPUs (from local_rank x replicas, modulo the GPUs), as
    D2L's try_all_gpus spreads replicas over devices."""
    if device != "cuda":
        return [torch.device(device)] * replicas
    count = torch.cuda.device_count()
    return [torch.device("cuda", (local_rank * replicas + r) % count) for r in range(replicas)]


def read_idx(path):
    """An idx file (gzipped or not) as a numpy array of its dimensions."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path}: not an idx file of unsigned bytes")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {body.size} bytes for dimensions {dims}")
    return body.reshape(dims)


def find(data_dir, stem):
    for name in (stem + ".gz", stem):
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"no {stem}[.gz] in {data_dir}")


def load_split(data_dir, prefix):
    """Images as float32 N x 1 x 28 x 28 in [0, 1] (D2L's ToTensor), labels int64."""
    images = read_idx(find(data_dir, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(find(data_dir, f"{prefix}-labels-idx1-ubyte"))
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


@torch.no_grad()
def evaluate(model, x, y, batch=1000):
    model.eval()
    device = next(model.parameters()).device
    correct = 0
    for i in range(0, len(x), batch):
        out = model(x[i:i + batch].to(device))
        correct += (out.argmax(1).cpu() == y[i:i + batch]).sum().item()
    model.train()
    return correct / len(x) if len(x) else float("nan")


def plot(path, history, model_name, workers):
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    epochs = [h["epoch"] for h in history]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(epochs, [h["train_loss"] for h in history], label="train loss")
    ax.plot(epochs, [h["train_acc"] for h in history], "--", label="train acc")
    ax.plot(epochs, [h["val_acc"] for h in history], "-.", label="val acc")
    ax.set_xlabel("epoch")
    ax.set_xlim(0.5, max(epochs) + 0.5)
    ax.grid(True)
    ax.legend()
    ax.set_title(f"{model_name}, {workers} workers through ps.torch")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def train(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    x_all, y_all = load_split(args.data_dir, "train")
    if args.val_size >= len(x_all):
        raise ValueError(f"--val_size={args.val_size} leaves no training images")
    cut = len(x_all) - args.val_size
    x_train, y_train = x_all[:cut], y_all[:cut]
    x_val, y_val = x_all[cut:], y_all[cut:]
    x_test, y_test = load_split(args.data_dir, "t10k")
    if args.train_limit:
        x_train, y_train = x_train[:args.train_limit], y_train[:args.train_limit]
    if args.eval_limit:
        x_val, y_val = x_val[:args.eval_limit], y_val[:args.eval_limit]
        x_test, y_test = x_test[:args.eval_limit], y_test[:args.eval_limit]

    ps.torch.init()
    rank, workers = ps.torch.rank(), ps.torch.size()
    # D2L's init_cnn (Xavier); rank 0's values become the job's version 0.
    model = torch_models.init_like_cpp(torch_models.build(args.model))
    devices = replica_devices(args.device, args.replicas, int(os.environ.get("LOCAL_RANK", "0")))
    replicas = [copy.deepcopy(model).to(device) for device in devices]
    model = replicas[0]
    opt = ps.torch.DistributedOptimizer(None, model.named_parameters(),
                                        replicas=replicas if len(replicas) > 1 else None)
    if rank == 0:
        on = ", ".join(str(device) for device in devices)
        print(f"{args.model}: {len(x_train)} train, {len(x_val)} validation, {len(x_test)} test "
              f"images; {workers} workers x {len(replicas)} "
              f"replica{'s' if len(replicas) > 1 else ''} ({on}), global batch "
              f"{args.batch_size}", flush=True)

    history = []
    start = time.monotonic()
    samples = 0
    best = None  # (epoch, validation accuracy, parameters) of the best epoch so far
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(len(x_train),
                               generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        loss_sum, correct, seen = 0.0, 0, 0
        for first in range(0, len(order), args.batch_size):
            batch = order[first:first + args.batch_size]
            if len(batch) < workers:
                break  # a worker would have no sample of this last, short batch
            mine = batch[rank::workers]
            if len(mine) < len(replicas):
                break  # a replica would have no sample
            # D2L's split_batch: equal parts (within one sample) per replica.
            parts = [(x_train[part].to(device), y_train[part].to(device))
                     for part, device in zip(mine.tensor_split(len(replicas)), devices)]
            counts = [len(y) for _, y in parts]
            opt.zero_grad()
            opt.set_samples(counts if len(replicas) > 1 else counts[0])
            losses = []
            for replica, (x, y) in zip(replicas, parts):
                out = replica(x)
                loss = F.cross_entropy(out, y)
                loss.backward()
                losses.append(loss.detach() * len(y))
                correct += (out.argmax(1) == y).sum().item()
            opt.step()
            loss_sum += sum(loss.item() for loss in losses)
            seen += len(mine)
            samples += len(batch)
        if rank == 0:
            record = {"epoch": epoch, "train_loss": loss_sum / seen, "train_acc": correct / seen,
                      "val_acc": evaluate(model, x_val, y_val)}
            history.append(record)
            if len(x_val) and (best is None or record["val_acc"] > best[1]):
                best = (epoch, record["val_acc"],
                        {name: value.cpu().clone() for name, value in model.state_dict().items()})
            print(f"epoch {epoch}: train loss {record['train_loss']:.4f}, "
                  f"train acc {record['train_acc']:.4f}, val acc {record['val_acc']:.4f} "
                  f"({time.monotonic() - start:.1f} s)", flush=True)
    elapsed = time.monotonic() - start
    if rank == 0:
        test_acc = evaluate(model, x_test, y_test)
        last = history[-1]
        print(f"final: train loss {last['train_loss']:.4f}, train acc {last['train_acc']:.4f}, "
              f"val acc {last['val_acc']:.4f}, test acc {test_acc:.4f}; "
              f"{samples / elapsed:.0f} samples/s in {elapsed:.1f} s", flush=True)
        # What the validation split is for: the epoch it picks, tested once.
        if best is not None:
            model.load_state_dict(best[2])
            print(f"best validation epoch {best[0]}: val acc {best[1]:.4f}, "
                  f"test acc {evaluate(model, x_test, y_test):.4f}", flush=True)
        if args.plot:
            plot(args.plot, history, args.model, workers)
            print(f"wrote {args.plot}", flush=True)
    ps.torch.shutdown()


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        train(args)
    except ps.Error as e:
        print(f"d2l_train: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
