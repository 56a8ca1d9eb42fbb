#!/usr/bin/python3
"""PyTorch DistributedDataParallel on CPU, the yardstick for our local cluster
(`bash deploy/local_cluster.sh --workers=2 --threads=1 ...`): the same models,
the same global batch split evenly over the same number of processes.

2 processes (--ranks) on one machine, 1 compute thread each
(torch.set_num_threads), the gloo backend on loopback only (rendezvous through
a file, GLOO_SOCKET_IFNAME=lo, so every connection is 127.0.0.1), gradient
buckets of --bucket_mb (25 MB, DDP's default), torch.optim.SGD with --lr and
--momentum, cross-entropy with mean reduction. Models: "mlp"
(784-4096-4096-10 by default, --mlp_hidden; 19.9 M parameters) and "lenet"
(D2L's: sigmoid, average pooling), both worker/model/torch_models.py's twins
of ours, Xavier-uniform weights and zero biases as ours. Data already in
memory: Fashion-MNIST when it is installed (pixels / 255), else uniform
random pixels and labels; rank r trains on its half of each global batch.

Each run does --warmup untimed steps, then --repeats runs of --steps timed
steps, and prints the best run's samples/s of all ranks together (global
batch x steps / the slowest rank's time) and its ms/step, plus the median
(other load only ever slows a run). "from step 1" is the rate over the first
--steps steps counted from the very first one, warm-up included: what our
worker's figure is with --epochs=1 --max_steps=N (it times every step of its
only epoch, the first one too).

    /usr/bin/python3 deploy/dev/bench/pytorch_ddp.py --model=mlp --batch_size=256
    /usr/bin/python3 deploy/dev/bench/pytorch_ddp.py --model=lenet --batch_size=256 --lr=0.9

Bounded: the parent kills the ranks if they are not done after --timeout
seconds, and gloo gives up after the same time. Use Debian's /usr/bin/python3
(python3-torch); a python3 earlier on PATH may lack torch.
"""

import argparse
import datetime
import faulthandler
import os
import platform
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "worker", "model"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models  # noqa: E402  (worker/model/torch_models.py)
from pytorch_lenet import load_data, set_torch_threads  # noqa: E402  (beside this file)


def run_rank(rank, args, init_file, results):
    """One DDP process: trains, then rank 0 sends its figures on `results`."""
    # A rank still running shortly before the parent's deadline says where.
    faulthandler.dump_traceback_later(max(1.0, args.timeout - 5), exit=False)
    set_torch_threads(args.threads)
    torch.set_num_interop_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=args.ranks,
                            timeout=datetime.timedelta(seconds=args.timeout))
    local = args.batch_size // args.ranks
    distinct = 40  # distinct global batches, cycled
    x, y, description = load_data(args.data_dir, args.batch_size * distinct)
    # Rank r's share of global batch b: samples [b*B + r*B/R, b*B + (r+1)*B/R).
    shards = [(x[b * args.batch_size + rank * local:b * args.batch_size + (rank + 1) * local],
               y[b * args.batch_size + rank * local:b * args.batch_size + (rank + 1) * local])
              for b in range(distinct)]

    torch.manual_seed(0)
    hidden = tuple(int(h) for h in args.mlp_hidden.split(","))
    model = torch_models.init_like_cpp(torch_models.build(args.model, mlp_hidden=hidden))
    parameters = sum(p.numel() for p in model.parameters())
    model.train()
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = nn.CrossEntropyLoss()

    def step(i):
        xb, yb = shards[i % distinct]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(xb), yb)
        loss.backward()  # returns once DDP's all-reduce of every bucket is done
        optimizer.step()
        return loss

    total = args.warmup + args.repeats * args.steps
    ends = np.zeros(total)
    dist.barrier()
    start = time.perf_counter()
    for i in range(total):
        loss = step(i)
        ends[i] = time.perf_counter() - start
    # Each timed span on the slowest rank (the ranks wait for each other in
    # every all-reduce, so they differ only by how their last step ended).
    spans = [ends[args.steps - 1]]  # from step 1
    for r in range(args.repeats):
        first = args.warmup + r * args.steps
        spans.append(ends[first + args.steps - 1] - (ends[first - 1] if first > 0 else 0.0))
    spans = torch.tensor(spans, dtype=torch.float64)
    dist.all_reduce(spans, op=dist.ReduceOp.MAX)
    last_loss = torch.tensor([loss.item()])
    dist.all_reduce(last_loss)
    if rank == 0:  # a pipe's send is synchronous: the figures are out before any teardown
        results.send({"spans": spans.tolist(), "loss": last_loss.item() / args.ranks,
                      "parameters": parameters, "data": description})
        results.close()
    dist.barrier()
    # Leave without tearing DDP and gloo down: their destructors now and then
    # hung rank 0 after it had finished (torch 1.13), until the parent killed it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mlp", choices=["mlp", "lenet"])
    parser.add_argument("--mlp_hidden", default="4096,4096", help="mlp hidden widths")
    parser.add_argument("--batch_size", type=int, default=256,
                        help="global batch, split evenly over the ranks")
    parser.add_argument("--ranks", type=int, default=2, help="DDP processes")
    parser.add_argument("--threads", type=int, default=1, help="compute threads per rank")
    parser.add_argument("--bucket_mb", type=float, default=25, help="DDP bucket_cap_mb")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per repeat")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs; the best is "
                        "reported, as other load on the machine only slows a run down")
    parser.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--timeout", type=float, default=300,
                        help="seconds before the ranks are killed")
    args = parser.parse_args()
    if args.batch_size % args.ranks:
        parser.error(f"--batch_size {args.batch_size} does not split evenly over "
                     f"{args.ranks} ranks")
    if args.steps < 1 or args.repeats < 1 or args.warmup < 0:
        parser.error("--steps and --repeats must be >= 1, --warmup >= 0")

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # gloo's connections on loopback only
    load = os.getloadavg()[0]
    ctx = mp.get_context("spawn")
    receiver, results = ctx.Pipe(duplex=False)
    with tempfile.TemporaryDirectory(prefix="ddp-") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=run_rank, args=(r, args, init_file, results))
                 for r in range(args.ranks)]
        for p in procs:
            p.start()
        results.close()  # the ranks hold the writing end
        deadline = time.monotonic() + args.timeout
        result = None
        try:
            while result is None and time.monotonic() < deadline:
                if receiver.poll(0.5):
                    try:
                        result = receiver.recv()
                    except EOFError:
                        break
                elif any(p.exitcode not in (None, 0) for p in procs):
                    break
            # Once rank 0 has reported, give the ranks a short grace to exit.
            grace = deadline if result is None else min(deadline, time.monotonic() + 30)
            for p in procs:
                p.join(max(0.0, grace - time.monotonic()))
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
    if result is None:
        print(f"pytorch_ddp: failed (rank exit codes {[p.exitcode for p in procs]}, "
              f"{'no result' if result is None else 'result'}; timeout {args.timeout:.0f} s)",
              file=sys.stderr)
        sys.exit(1)
    if any(p.exitcode != 0 for p in procs):
        print(f"pytorch_ddp: warning: rank exit codes {[p.exitcode for p in procs]} after "
              "the figures were in", file=sys.stderr)

    spans = result["spans"]
    work = args.batch_size * args.steps
    cold = work / spans[0]
    rates = [work / s for s in spans[1:]]
    best = max(rates)
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs; DDP gloo on 127.0.0.1, {args.ranks} ranks x {args.threads} "
          f"thread(s), bucket {args.bucket_mb:g} MB")
    print(f"data: {result['data']}; {args.model}"
          f"{' ' + args.mlp_hidden if args.model == 'mlp' else ''} "
          f"({result['parameters']} parameters), global batch {args.batch_size} "
          f"({args.batch_size // args.ranks} per rank), SGD lr {args.lr:g} momentum "
          f"{args.momentum:g}; {args.warmup} warm-up, then {args.repeats} x {args.steps} timed "
          f"steps; load average before: {load:.2f}")
    print(f"{'ms/step':>9} {'samples/s':>10} {'median':>10} {'from step 1':>12} {'last loss':>10}")
    print(f"{1e3 * args.batch_size / best:>9.2f} {best:>10.0f} {float(np.median(rates)):>10.0f} "
          f"{cold:>12.0f} {result['loss']:>10.4f}")


if __name__ == "__main__":
    main()
