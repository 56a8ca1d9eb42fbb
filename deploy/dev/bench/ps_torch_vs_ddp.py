#!/usr/bin/python3
"""ps.torch against PyTorch DDP (gloo) with the same PyTorch model on both
sides: only the gradient exchange differs.

    bazel build //server //worker/python:ps
    /usr/bin/python3 deploy/dev/bench/ps_torch_vs_ddp.py --rounds=3

2 worker processes x 1 thread (torch.set_num_threads(1), one interop
thread), each on its half of every global batch, cross-entropy (mean),
SGD lr 0.1 without momentum: on the parameter server's side (1 server,
--lr=0.1) for ps.torch, torch.optim.SGD for DDP (25 MB buckets, DDP's
default; gloo on 127.0.0.1). The ps.torch workers are started by
`python3 -m ps.torch.run`, the DDP ranks as plain processes with a file
rendezvous; both run this file's worker loop. Cases: the MLP 784-4096-4096-10
(MLP-20M) at global batch 32 and 256, resnet18_cifar (D2L 13.6) at 64, on
random data of Fashion-MNIST's shape (the data do not change the time).

Each case runs --warmup untimed steps, then --steps timed ones; its figure
is global batch x steps / the slowest rank's time. A round runs every
variant of a case in turn (ps.torch over loopback TCP, ps.torch with the
client's shared memory, DDP) so load on a shared machine falls on all of
them alike; the table gives each variant's median samples/s and the
median and range over rounds of its ratio to DDP in the same round.
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

_ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
CASES = {  # name: (model, global batch)
    "mlp32": ("mlp", 32),
    "mlp256": ("mlp", 256),
    "resnet64": ("resnet18_cifar", 64),
}
VARIANTS = ("ps_tcp", "ps_shm", "ddp")
LR = 0.1


def build_model(name):
    sys.path.insert(0, os.path.join(_ROOT, "worker", "model"))
    import torch_models
    import torch
    torch.manual_seed(0)
    hidden = (4096, 4096) if name == "mlp" else (256,)
    return torch_models.init_like_cpp(torch_models.build(name, mlp_hidden=hidden))


def worker(args):
    """One rank of either side; writes {"span": seconds of the timed steps}."""
    import torch
    from torch.nn import functional as F
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    model = build_model(args.model)
    local = args.batch_size // size
    generator = torch.Generator().manual_seed(rank)
    batches = [(torch.rand(local, 1, 28, 28, generator=generator),
                torch.randint(0, 10, (local,), generator=generator)) for _ in range(4)]
    if args.variant == "ddp":
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"file://{args.rendezvous}", rank=rank,
                                world_size=size, timeout=datetime.timedelta(seconds=300))
        net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25)
        opt = torch.optim.SGD(net.parameters(), lr=LR)
        barrier = dist.barrier
    else:
        import ps.torch
        ps.torch.init(shared_memory=args.variant == "ps_shm")
        net = model
        opt = ps.torch.DistributedOptimizer(None, model.named_parameters())
        barrier = None  # the first step waits for every worker
    start = None
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            if barrier:
                barrier()
            start = time.perf_counter()
        x, y = batches[i % len(batches)]
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
    span = time.perf_counter() - start
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"span": span}, f)
    if args.variant == "ddp":
        dist.barrier()
        sys.stdout.flush()
        os._exit(0)  # DDP/gloo teardown now and then hangs in torch 1.13
    ps.torch.shutdown()


def run_variant(args, variant, model, batch, tmp):
    out = tempfile.mkdtemp(dir=tmp)
    script = [os.path.abspath(__file__), "--worker", f"--variant={variant}", f"--model={model}",
              f"--batch_size={batch}", f"--warmup={args.warmup}", f"--steps={args.steps}",
              f"--out={out}"]
    env = dict(os.environ, PYTHONPATH=os.path.join(_ROOT, "bazel-bin", "worker", "python"),
               GLOO_SOCKET_IFNAME="lo")
    if variant == "ddp":
        script.append(f"--rendezvous={os.path.join(out, 'rendezvous')}")
        procs = [subprocess.Popen([sys.executable] + script,
                                  env=dict(env, RANK=str(r), WORLD_SIZE="2")) for r in range(2)]
        codes = [p.wait(timeout=args.timeout) for p in procs]
    else:
        launcher = subprocess.run(
            [sys.executable, "-m", "ps.torch.run", "--workers=2",
             f"--server={os.path.join(_ROOT, 'bazel-bin', 'server', 'server')}",
             f"--server_arg=--lr={LR}", "--"] + script,
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=args.timeout)
        codes = [launcher.returncode]
        if launcher.returncode:
            sys.stderr.write(launcher.stdout.decode())
    if any(codes):
        raise RuntimeError(f"{variant} {model} batch {batch}: exit codes {codes}")
    spans = []
    for r in range(2):
        with open(os.path.join(out, f"rank{r}.json")) as f:
            spans.append(json.load(f)["span"])
    return batch * args.steps / max(spans)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES), help=",".join(CASES))
    parser.add_argument("--variants", default=",".join(VARIANTS), help=",".join(VARIANTS))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=0,
                        help="timed steps per run (0: 30 for the MLP, 6 for ResNet)")
    parser.add_argument("--timeout", type=float, default=300)
    # The worker side (this file under ps.torch.run or as a DDP rank).
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--batch_size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--rendezvous", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    cases = args.cases.split(",")
    variants = args.variants.split(",")
    if any(c not in CASES for c in cases) or any(v not in VARIANTS for v in variants):
        parser.error(f"--cases from {list(CASES)}, --variants from {list(VARIANTS)}")
    rates = {(c, v): [] for c in cases for v in variants}
    print(f"load average before: {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs", flush=True)
    with tempfile.TemporaryDirectory(prefix="ps-vs-ddp-") as tmp:
        for round_ in range(1, args.rounds + 1):
            for c in cases:
                model, batch = CASES[c]
                steps = args.steps or (6 if model == "resnet18_cifar" else 30)
                run_args = argparse.Namespace(**{**vars(args), "steps": steps})
                for v in variants:
                    rate = run_variant(run_args, v, model, batch, tmp)
                    rates[(c, v)].append(rate)
                    print(f"round {round_} {c} {v}: {rate:.1f} samples/s", flush=True)
    print(f"\n{'case':<10} {'variant':<8} {'samples/s (median)':>19} "
          f"{'x DDP median (range)':>24}")
    for c in cases:
        for v in variants:
            line = f"{c:<10} {v:<8} {statistics.median(rates[(c, v)]):>19.1f}"
            if v != "ddp" and "ddp" in variants:
                ratios = [a / b for a, b in zip(rates[(c, v)], rates[(c, "ddp")])]
                line += (f" {statistics.median(ratios):>10.2f} "
                         f"({min(ratios):.2f}-{max(ratios):.2f})")
            print(line)


if __name__ == "__main__":
    main()
