#!/usr/bin/python3
"""One rank of the ring all-reduce baseline (run.sh --system=ddp): PyTorch
DistributedDataParallel with the gloo backend, whose all-reduce of each
gradient bucket is a ring (reduce-scatter, then all-gather: each rank sends
2 (W - 1) / W of the bucket and receives as much). run.sh starts one per
worker host, in that host's namespace, so the ring's bytes cross the same
emulated links as our workers' pushes and pulls.

    ip netns exec PREFIX-wR /usr/bin/python3 ddp_worker.py --rank=R --world_size=W \\
        --master=ADDRESS:PORT --interface=eth0 --model=mlp --batch_size=256 \\
        --max_steps=40 --threads=1 --report=OUT/report-wR.json --trace=OUT/trace-wR.json \\
        [--mlp_hidden=4096,4096] [--bucket_cap_mb=25]

The job is the C++ worker's: the model from worker/model/torch_models.py
(the same layers and parameter count, Xavier-uniform weights, zero biases),
the global --batch_size split evenly over the ranks, plain SGD at --lr,
--threads compute threads (OpenMP and OpenBLAS both), --max_steps steps.
Data: Fashion-MNIST or MNIST from --data_dir when its files are there,
otherwise uniform random pixels and labels of the dataset's shape (what
--dataset=synthetic gives: the compute is the same, the data is in memory
before the first step either way).

Writes what results.py reads from a C++ worker:
  --report  {"model_parameters", "steps", "samples_per_second",
            "global_samples_per_second", "time_split": {data_s, compute_s,
            reduce_s, copy_s, push_s, wait_s, pull_s}, "compute": "real",
            "system": "ddp", "bucket_cap_mb"}. The split has data_s (taking
            the batch) and compute_s (forward, backward and the optimizer
            step, seconds over the run); DDP runs each bucket's all-reduce
            inside backward, overlapped with it, so the communication is in
            compute_s and the other phases are 0.
  --trace   Chrome trace events as common/chrome_trace.h writes them: one
            complete event per step on lane 0 with args.step, ts in
            microseconds from otherData.clock_origin_ns on CLOCK_MONOTONIC
            (the counter sampler's clock), plus forward/backward/optimizer
            events inside it.
The samples/s figures exclude the first step (gloo's connections, the
allocator's first touch). Exits 0 once both files are written and every
rank is done; 1 with a message on a bad flag or failure. Debian's
/usr/bin/python3 (python3-torch); a python3 earlier on PATH may lack torch.
"""

import argparse
import ctypes
import datetime
import gzip
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "worker", "model"))

# Input shape and classes of each dataset name the C++ worker takes.
SHAPES = {"fashion_mnist": (1, 28, 28), "mnist": (1, 28, 28), "synthetic": (1, 28, 28),
          "cifar10": (3, 32, 32)}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world_size", type=int, required=True)
    p.add_argument("--master", required=True, help="ADDRESS:PORT of rank 0's rendezvous")
    p.add_argument("--interface", default="eth0", help="gloo's network interface")
    p.add_argument("--model", default="lenet")
    p.add_argument("--mlp_hidden", default="256", help="mlp hidden widths, comma-separated")
    p.add_argument("--dataset", default="synthetic", choices=sorted(SHAPES))
    p.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--batch_size", type=int, default=256, help="global, split over the ranks")
    p.add_argument("--max_steps", type=int, default=40)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--bucket_cap_mb", type=float, default=25, help="DDP's default: 25")
    p.add_argument("--timeout", type=float, default=1800, help="gloo's, seconds")
    p.add_argument("--report", required=True)
    p.add_argument("--trace", required=True)
    a = p.parse_args(argv)
    if a.world_size < 1 or not 0 <= a.rank < a.world_size:
        p.error("--rank must be in [0, --world_size)")
    if a.batch_size % a.world_size:
        p.error(f"--batch_size {a.batch_size} does not split evenly over {a.world_size} ranks")
    if a.max_steps < 1:
        p.error("--max_steps must be >= 1 (the baseline trains a bounded number of steps)")
    if a.threads < 1:
        p.error("--threads must be >= 1")
    return a


def set_threads(torch, threads):
    """torch.set_num_threads sets OpenMP's team but not Debian's OpenBLAS
    (pthreads), which nn.Linear calls and which otherwise takes every core
    (deploy/dev/bench/pytorch_lenet.py measured it): set both."""
    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libopenblas" in line}
    for path in paths:
        ctypes.CDLL(path).openblas_set_num_threads(threads)


def read_idx(path):
    import numpy as np
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load_batches(torch, a, local, count):
    """`count` of this rank's local batches, [local, C, H, W] and [local]:
    rank r's share of global batch b is samples [b B + r B / W, ...)."""
    shape = SHAPES[a.dataset]
    need = a.batch_size * count
    images = os.path.join(a.data_dir, "train-images-idx3-ubyte.gz")
    labels = os.path.join(a.data_dir, "train-labels-idx1-ubyte.gz")
    if a.dataset in ("fashion_mnist", "mnist") and os.path.exists(images) and os.path.exists(labels):
        x = torch.from_numpy(read_idx(images)[:need].astype("float32") / 255).unsqueeze(1)
        y = torch.from_numpy(read_idx(labels)[:need].astype("int64"))
    else:
        g = torch.Generator().manual_seed(0)
        x = torch.rand((need,) + shape, generator=g)
        y = torch.randint(0, 10, (need,), generator=g)
    batches = []
    for b in range(count):
        first = (b * a.batch_size + a.rank * local) % x.shape[0]
        batches.append((x[first:first + local].contiguous(), y[first:first + local].contiguous()))
    return batches


def main(argv):
    a = parse_args(argv)
    # gloo picks its address from this interface: the host's link, so every
    # byte of the ring crosses the shaped links (never this namespace's lo).
    os.environ["GLOO_SOCKET_IFNAME"] = a.interface
    import torch
    import torch.distributed as dist
    from torch import nn
    import torch_models  # worker/model/torch_models.py

    set_threads(torch, a.threads)
    local = a.batch_size // a.world_size
    batches = load_batches(torch, a, local, 8)
    torch.manual_seed(0)  # every rank starts from the same weights (DDP also broadcasts rank 0's)
    hidden = tuple(int(h) for h in a.mlp_hidden.split(","))
    model = torch_models.init_like_cpp(torch_models.build(
        a.model, input_shape=SHAPES[a.dataset], mlp_hidden=hidden))
    parameters = sum(p.numel() for p in model.parameters())
    model.train()

    dist.init_process_group("gloo", init_method=f"tcp://{a.master}", rank=a.rank,
                            world_size=a.world_size,
                            timeout=datetime.timedelta(seconds=a.timeout))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_cap_mb)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=a.lr)
    loss_fn = nn.CrossEntropyLoss()

    origin = time.monotonic_ns()
    events = []

    def event(name, step, begin, end):
        events.append({"name": name, "cat": "ddp", "ph": "X", "pid": a.rank, "tid": 0,
                       "ts": (begin - origin) / 1e3, "dur": (end - begin) / 1e3,
                       "args": {"step": step}})

    data_s = compute_s = 0.0
    later_s = 0.0  # every step after the first
    dist.barrier()
    for step in range(a.max_steps):
        t0 = time.monotonic_ns()
        x, y = batches[step % len(batches)]
        t1 = time.monotonic_ns()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        t2 = time.monotonic_ns()
        loss.backward()  # returns once every bucket's all-reduce is done
        t3 = time.monotonic_ns()
        optimizer.step()
        t4 = time.monotonic_ns()
        event("step", step, t0, t4)
        event("forward", step, t1, t2)
        event("backward + all-reduce", step, t2, t3)
        event("optimizer", step, t3, t4)
        data_s += (t1 - t0) / 1e9
        compute_s += (t4 - t1) / 1e9
        if step > 0:
            later_s += (t4 - t0) / 1e9
    steps_timed = a.max_steps - 1 if a.max_steps > 1 else 1
    seconds = later_s if a.max_steps > 1 else (t4 - t0) / 1e9
    report = {
        "system": "ddp",
        "model": a.model,
        "rank": a.rank,
        "num_workers": a.world_size,
        "global_batch_size": a.batch_size,
        "model_parameters": parameters,
        "steps": a.max_steps,
        "final_train_loss": loss.item(),
        "samples_per_second": local * steps_timed / max(seconds, 1e-9),
        "global_samples_per_second": a.batch_size * steps_timed / max(seconds, 1e-9),
        "compute": "real",
        "replay_step_s": 0,
        "bucket_cap_mb": a.bucket_cap_mb,
        "time_split": {"data_s": data_s, "compute_s": compute_s, "reduce_s": 0.0,
                       "copy_s": 0.0, "push_s": 0.0, "wait_s": 0.0, "pull_s": 0.0},
    }
    trace = {"traceEvents": [{"name": "process_name", "ph": "M", "pid": a.rank, "tid": 0,
                              "args": {"name": f"ddp rank {a.rank}"}}] + events,
             "otherData": {"clock_origin_ns": origin, "dropped_events": 0}}
    for path, doc in ((a.report, report), (a.trace, trace)):
        with open(path + ".tmp", "w") as f:
            json.dump(doc, f)
        os.replace(path + ".tmp", path)
    print(f"ddp rank {a.rank}/{a.world_size}: {a.max_steps} steps of {a.model} "
          f"({parameters} parameters), {report['global_samples_per_second']:.1f} samples/s "
          f"(all ranks, after the first step), last loss {loss.item():.4f}", flush=True)
    # Every rank done before any leaves; then out without tearing gloo down:
    # its destructors now and then hung a finished rank (torch 1.13,
    # deploy/dev/bench/pytorch_ddp.py).
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except Exception as e:  # noqa: BLE001  (one line for run.sh's log, not a traceback)
        print(f"ddp_worker: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
