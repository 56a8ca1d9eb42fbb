"""ps.torch against a real server daemon and worker processes.

Run by ps_torch_test.sh under `bazel test` with Debian's /usr/bin/python3
(PyTorch 1.13):
    ps_torch_test.py SERVER_BINARY PACKAGE_DIR
where PACKAGE_DIR is bazel-bin/worker/python/ps (the assembled package).
The same file is the worker process (`worker SCENARIO SERVERS RANK OUT PACKAGE_PARENT`).

The equivalence tests train a model of convolutions and linear layers (no
batch norm) for 3 steps with 2 workers, each on half of every global batch,
and compare with single-process PyTorch on the global batch.
"""

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from typing import Optional

import torch

STEPS = 3
GLOBAL_BATCH = 8
LR = 0.1
MOMENTUM = 0.9
WEIGHT_DECAY = 0.01
ADAM_LR = 0.01
RTOL = 1e-5
ATOL = 1e-6
CUDA_RTOL = 1e-4
CUDA_ATOL = 1e-5
_NO_CUDA = ("no CUDA device: torch.cuda.is_available() is False in this process, so the "
            "CUDA path (pinned copies on a side stream, CUDA replicas) is not run")


class Net(torch.nn.Module):
    """Convolutions then linear layers; `wide` changes one shape (the
    mismatching worker's model)."""

    def __init__(self, wide: bool = False):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(4, 6, 3, stride=2, padding=1)
        self.fc1 = torch.nn.Linear(6 * 4 * 4, 24 if not wide else 25)
        self.fc2 = torch.nn.Linear(24 if not wide else 25, 3)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        x = torch.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def model(seed: int, wide: bool = False) -> Net:
    torch.manual_seed(seed)
    return Net(wide)


def batches():
    """STEPS global batches (inputs, labels), the same in every process."""
    generator = torch.Generator().manual_seed(1234)
    return [(torch.randn(GLOBAL_BATCH, 1, 8, 8, generator=generator),
             torch.randint(0, 3, (GLOBAL_BATCH,), generator=generator)) for _ in range(STEPS)]


def reference(kind: str) -> dict:
    """Single-process PyTorch on the global batch."""
    net = model(seed=0)
    if kind == "sgd":
        optimizer = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM,
                                    weight_decay=WEIGHT_DECAY)
    else:
        optimizer = torch.optim.Adam(net.parameters(), lr=ADAM_LR)
    for x, y in batches():
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        optimizer.step()
    return {name: tensor.detach().clone() for name, tensor in net.named_parameters()}


def cuda_device(replica: int) -> torch.device:
    """Replica r's GPU: the devices in turn (all on cuda:0 with one GPU)."""
    return torch.device("cuda", replica % torch.cuda.device_count())


def train_worker(kind: str, servers: Optional[str], rank: Optional[int], out_path: str,
                 num_replicas: int = 1, cuda: bool = False) -> None:
    """2 workers, each on its half of every global batch; rank 1 starts from
    other values, which registration replaces with rank 0's. servers and
    rank None: from the environment (ps.torch.run's). num_replicas > 1:
    that many local CPU replicas (each from other values) share the
    worker's half, each on an equal part of it, and the file holds every
    replica's parameters. cuda: the replicas on GPUs (TF32 off, so the
    comparison with the CPU is of float32 arithmetic)."""
    import ps.torch

    ps.torch.init(servers, rank=rank, num_workers=None if rank is None else 2,
                  connect_timeout=20, rpc_timeout=20, wait_timeout=30)
    rank = ps.torch.rank()
    devices = [cuda_device(r) if cuda else torch.device("cpu") for r in range(num_replicas)]
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    replicas = [model(seed=rank + 10 * r).to(device) for r, device in enumerate(devices)]
    net = replicas[0]
    local = None if kind == "sgd" else torch.optim.Adam(net.parameters(), lr=ADAM_LR)
    optimizer = ps.torch.DistributedOptimizer(local, net.named_parameters(), bucket_bytes=1024,
                                              replicas=replicas if num_replicas > 1 else None)
    assert ps.torch.rank() == rank and ps.torch.size() == 2
    assert ps.torch.registration().optimizer == kind.replace("adam", "none")
    for replica in replicas:
        start = torch.equal(replica.conv1.weight.cpu(), model(seed=0).conv1.weight)
        assert start, "registration set every worker's (and replica's) parameters to rank 0's"
    if num_replicas > 1:
        refused = error_of(lambda: optimizer.set_samples(4))
        assert "give one sample count per replica" in refused["message"], refused
        refused = error_of(lambda: optimizer.set_samples([4]))
        assert f"1 sample counts for {num_replicas} replicas" in refused["message"], refused
    half = GLOBAL_BATCH // 2
    for x, y in batches():
        x, y = x[rank * half:(rank + 1) * half], y[rank * half:(rank + 1) * half]
        parts = list(zip(x.chunk(num_replicas), y.chunk(num_replicas)))
        counts = [len(part_x) for part_x, _ in parts]
        optimizer.zero_grad()
        if kind == "sgd":
            # The default (1 per replica) is as good for equal parts.
            optimizer.set_samples(counts if num_replicas > 1 else len(x))
        for replica, device, (part_x, part_y) in zip(replicas, devices, parts):
            loss = torch.nn.functional.cross_entropy(replica(part_x.to(device)), part_y.to(device))
            loss.backward()
        try:
            optimizer.zero_grad()
            raise AssertionError("zero_grad was allowed while pushes were in flight")
        except ps.Error as e:
            assert "step() first" in e.message, e
        stated = (counts if num_replicas > 1 else len(x)) if kind == "sgd" else None
        optimizer.step(num_samples=stated)
    torch.save({f"{r}/{name}": tensor.detach().cpu() for r, replica in enumerate(replicas)
                for name, tensor in replica.named_parameters()}, out_path)
    ps.torch.shutdown()


def error_of(call) -> dict:
    import ps
    try:
        call()
    except ps.Error as e:
        return {"code": e.code_name, "message": e.message}
    return {"code": "OK", "message": ""}


def mismatch_worker(servers: str, rank: int, out_path: str) -> None:
    """Rank 0 registers Net and waits for a line on stdin; rank 1 registers
    a Net whose fc1 is one wider."""
    import ps.torch

    ps.torch.init(servers, rank=rank, connect_timeout=20, rpc_timeout=20, wait_timeout=30)
    net = model(seed=0, wide=rank == 1)
    result = error_of(lambda: ps.torch.broadcast_parameters(net))
    with open(out_path, "w") as out:
        json.dump(result, out)
    print("registered", flush=True)
    if rank == 0:
        sys.stdin.readline()
    ps.torch.shutdown()


def single_worker(servers: str, rank: int, out_path: str) -> None:
    """One worker of a one-worker SGD server: the refusals after init."""
    import ps.torch

    ps.torch.init(servers, connect_timeout=20, rpc_timeout=20, wait_timeout=30)
    net = model(seed=0)
    results = {}
    ps.torch.broadcast_parameters(net)
    results["local_optimizer"] = error_of(lambda: ps.torch.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.1), net.named_parameters()))
    wide = model(seed=0, wide=True)
    results["replica_shape"] = error_of(lambda: ps.torch.DistributedOptimizer(
        None, net.named_parameters(), replicas=[net, wide]))
    results["replica_shared"] = error_of(lambda: ps.torch.DistributedOptimizer(
        None, net.named_parameters(), replicas=[net, net]))
    results["replica_first"] = error_of(lambda: ps.torch.DistributedOptimizer(
        None, net.named_parameters(), replicas=[model(seed=1), net]))
    results["replica_module"] = error_of(lambda: ps.torch.DistributedOptimizer(
        None, net.named_parameters(), replicas=net))
    results["meta_device"] = error_of(lambda: ps.torch.DistributedOptimizer(
        None, torch.nn.Linear(2, 2, device="meta").named_parameters()))
    optimizer = ps.torch.DistributedOptimizer(None, net.named_parameters())
    results["second_optimizer"] = error_of(
        lambda: ps.torch.DistributedOptimizer(None, net.named_parameters()))
    results["unregistered"] = error_of(
        lambda: ps.torch.broadcast_parameters({"decoder.weight": torch.zeros(2)}))
    results["wrong_shape"] = error_of(
        lambda: ps.torch.broadcast_parameters({"fc2.bias": torch.zeros(4)}))
    results["float64"] = error_of(lambda: ps.torch.broadcast_parameters(
        {"fc2.bias": torch.zeros(3, dtype=torch.float64)}))
    x, y = batches()[0]
    loss = torch.nn.functional.cross_entropy(net(x), y) * float("nan")
    results["nan"] = error_of(loss.backward)
    with open(out_path, "w") as out:
        json.dump(results, out)
    ps.torch.shutdown()


def lost_server_worker(mode: str, servers: str, rank: int, out_path: str) -> None:
    """A worker of an SGD job, on its equal part of every global batch: it
    trains iteration 0 (mode "restart": 0 and 1), prints "stepped" and waits
    for a line on stdin while the test kills the server (and, in mode
    "restart", starts it again from its checkpoint), then trains on to
    STEPS, each iteration on the batch of opt.iteration. mode "norecover":
    recover=False; "timeout": recover on, a 3 s reconnect_timeout and no
    server coming back. Writes how it ended."""
    import ps
    import ps.torch

    ps.torch.init(servers, rank=rank, connect_timeout=20, rpc_timeout=20, wait_timeout=30,
                  reconnect_timeout=3 if mode == "timeout" else 60)
    net = model(seed=rank)
    events = []
    optimizer = ps.torch.DistributedOptimizer(
        None, net.named_parameters(), bucket_bytes=1024, recover=mode != "norecover",
        observer=lambda event, fields: events.append([event, fields]) if event == "recovered"
        else None)
    data = batches()
    part = GLOBAL_BATCH // ps.torch.size()

    def train_one():
        x, y = data[optimizer.iteration]
        x, y = x[rank * part:(rank + 1) * part], y[rank * part:(rank + 1) * part]
        optimizer.zero_grad()
        optimizer.set_samples(len(x))
        torch.nn.functional.cross_entropy(net(x), y).backward()
        optimizer.step()

    for _ in range(2 if mode == "restart" else 1):
        train_one()
    print("stepped", flush=True)
    sys.stdin.readline()
    started = time.monotonic()
    result = {"code": "OK", "message": ""}
    try:
        while optimizer.iteration < STEPS:
            train_one()
    except ps.Error as e:
        result = {"code": e.code_name, "message": e.message, "server_lost": e.server_lost}
    result.update(seconds=time.monotonic() - started, recoveries=optimizer.recoveries,
                  iteration=optimizer.iteration, events=events)
    torch.save({f"0/{name}": tensor.detach() for name, tensor in net.named_parameters()},
               out_path + ".pt")
    with open(out_path, "w") as out:
        json.dump(result, out)
    ps.torch.shutdown()


class _NoOpCuda:
    """torch.cuda's streams and events as no-ops: on CPU tensors, where every
    copy is done when issued, they drive _CudaPipeline's host logic."""

    class Stream:
        def __init__(self, device=None):
            self.device = device

        def wait_event(self, event):
            pass

        def wait_stream(self, stream):
            pass

        def synchronize(self):
            pass

    class Event:
        def __init__(self, enable_timing=False, blocking=False, interprocess=False):
            pass

        def record(self, stream=None):
            pass

        def synchronize(self):
            pass

    @staticmethod
    def current_stream(device=None):
        return _NoOpCuda.Stream(device)

    @staticmethod
    def stream(stream):
        return contextlib.nullcontext()


def host_side_of_cuda_worker(kind: str, servers: str, out_path: str) -> None:
    """The only worker of a job on whole batches, with 2 CPU replicas whose
    step runs the CUDA pipeline's path (the push thread, the sums in the
    device buffer, the copies in) over no-op streams; then a NaN gradient,
    which step() raises from the push thread's check."""
    import ps.torch
    from ps.torch import _core

    ps.torch.init(servers, connect_timeout=20, rpc_timeout=20, wait_timeout=30)
    replicas = [model(seed=r) for r in range(2)]
    local = None if kind == "sgd" else torch.optim.Adam(replicas[0].parameters(), lr=ADAM_LR)
    threads = set()
    optimizer = ps.torch.DistributedOptimizer(
        local, replicas[0].named_parameters(), bucket_bytes=1024, replicas=replicas,
        observer=lambda event, _: threads.add(threading.current_thread().name)
        if event == "push" else None)
    optimizer._cuda = _core._CudaPipeline([torch.device("cpu")] * 2, optimizer._grad.numel(),
                                          optimizer._push, cuda=_NoOpCuda)
    for x, y in batches():
        parts = list(zip(x.chunk(2), y.chunk(2)))
        optimizer.zero_grad()
        optimizer.set_samples([len(part_x) for part_x, _ in parts])
        for replica, (part_x, part_y) in zip(replicas, parts):
            torch.nn.functional.cross_entropy(replica(part_x), part_y).backward()
        optimizer.step()
    optimizer.zero_grad()
    (torch.nn.functional.cross_entropy(replicas[0](x), y) * float("nan")).backward()
    torch.nn.functional.cross_entropy(replicas[1](x), y).backward()
    results = {"nan": error_of(optimizer.step), "push_threads": sorted(threads)}
    torch.save({f"{r}/{name}": tensor.detach() for r, replica in enumerate(replicas)
                for name, tensor in replica.named_parameters()}, out_path + ".pt")
    with open(out_path, "w") as out:
        json.dump(results, out)
    ps.torch.shutdown()


def cuda_refusals_worker(servers: str, out_path: str) -> None:
    """One worker of a one-worker SGD server with a GPU: replicas on the CPU
    and a GPU, a model split over two devices, then a NaN gradient on the
    GPU (refused by step(), the host's check coming after the copy)."""
    import ps.torch

    ps.torch.init(servers, connect_timeout=20, rpc_timeout=20, wait_timeout=30)
    results = {}
    cpu_model, gpu_model = model(seed=0), model(seed=0).to("cuda")
    results["mixed"] = error_of(lambda: ps.torch.DistributedOptimizer(
        None, cpu_model.named_parameters(), replicas=[cpu_model, gpu_model]))
    split = model(seed=0)
    split.fc2.to("cuda")
    results["split"] = error_of(lambda: ps.torch.DistributedOptimizer(
        None, split.named_parameters()))
    optimizer = ps.torch.DistributedOptimizer(None, gpu_model.named_parameters())
    x, y = batches()[0]

    def nan_step():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(gpu_model(x.cuda()), y.cuda()) * float("nan")
        loss.backward()
        optimizer.step()
    results["nan"] = error_of(nan_step)
    with open(out_path, "w") as out:
        json.dump(results, out)
    ps.torch.shutdown()


def overlap_worker(servers: str, rank: int, out_path: str) -> None:
    """One step of a 21 M-parameter MLP (five 2048 x 2048 layers) with the
    default 4 MiB buckets, recording the optimizer's events in order."""
    import ps.torch

    ps.torch.init(servers, connect_timeout=20, rpc_timeout=60, wait_timeout=60)
    torch.manual_seed(0)
    layers = []
    for _ in range(5):
        layers += [torch.nn.Linear(2048, 2048), torch.nn.ReLU()]
    net = torch.nn.Sequential(*layers)
    events = []
    optimizer = ps.torch.DistributedOptimizer(
        None, net.named_parameters(), observer=lambda event, fields: events.append(
            [event, fields.get("name", ""), time.monotonic()]))
    x = torch.randn(64, 2048, generator=torch.Generator().manual_seed(5))
    optimizer.zero_grad()
    net(x).square().mean().backward()
    backward_end = time.monotonic()
    optimizer.step()
    with open(out_path, "w") as out:
        json.dump({"parameters": sum(p.numel() for p in net.parameters()),
                   "backward_end": backward_end, "events": events}, out)
    ps.torch.shutdown()


class PsTorchTest(unittest.TestCase):
    server_binary = None
    package_parent = None

    def start_server(self, *flags):
        tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        from ps import local_server
        chunk_bytes = [] if any(f.startswith("--chunk_bytes") for f in flags) else [
            "--chunk_bytes=256"]
        with open(os.path.join(tmp, "server.log"), "wb") as server_log:
            server, address = local_server.start(self.server_binary, chunk_bytes + list(flags),
                                                 log=server_log, timeout_s=30, tmp=tmp)
        self.addCleanup(lambda: (server.terminate(), server.wait(timeout=30)))
        return address, tmp

    def worker(self, scenario, servers, rank, out_path, stdin=None):
        return subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "worker", scenario, servers, str(rank),
             out_path, self.package_parent],
            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def finish(self, workers):
        outputs = [w.communicate(timeout=120)[0].decode() for w in workers]
        for rank, w in enumerate(workers):
            self.assertEqual(w.returncode, 0, f"worker {rank}:\n{outputs[rank]}")

    def train_and_compare(self, kind, *server_flags, num_replicas=1, cuda=False,
                          rtol=RTOL, atol=ATOL):
        servers, tmp = self.start_server("--num_workers=2", *server_flags)
        paths = [os.path.join(tmp, f"params-{rank}.pt") for rank in range(2)]
        scenario = kind if num_replicas == 1 and not cuda else (
            f"{kind}-replicas-{num_replicas}" + ("-cuda" if cuda else ""))
        self.finish([self.worker(scenario, servers, rank, paths[rank]) for rank in range(2)])
        finals = [torch.load(path) for path in paths]
        expected = reference(kind)
        initial = dict(model(seed=0).named_parameters())
        for name, want in expected.items():
            for rank in range(2):
                for r in range(num_replicas):
                    self.assertTrue(torch.equal(finals[0][f"0/{name}"], finals[rank][f"{r}/{name}"]),
                                    f"{name}: rank {rank}'s replica {r} disagrees with rank 0's "
                                    "first")
            got = finals[0][f"0/{name}"]
            error = (got - want).abs()
            worst = float((error - rtol * want.abs()).max())
            self.assertTrue(torch.allclose(got, want, rtol=rtol, atol=atol),
                            f"{name}: off by up to {float(error.max())} (worst excess {worst})")
            self.assertFalse(torch.allclose(want, initial[name].detach()),
                             f"{name} did not train: the comparison would be empty")

    def test_sgd_with_momentum_and_weight_decay_on_the_server_equals_one_process(self):
        self.train_and_compare("sgd", f"--lr={LR}", f"--momentum={MOMENTUM}",
                               f"--weight_decay={WEIGHT_DECAY}")

    def test_adam_over_a_sum_only_server_equals_one_process(self):
        self.train_and_compare("adam", "--optimizer=none")

    def test_two_workers_of_two_local_replicas_on_quarters_equal_one_process(self):
        self.train_and_compare("sgd", f"--lr={LR}", f"--momentum={MOMENTUM}",
                               f"--weight_decay={WEIGHT_DECAY}", num_replicas=2)

    def test_local_replicas_over_a_sum_only_server_equal_one_process(self):
        self.train_and_compare("adam", "--optimizer=none", num_replicas=2)

    def test_a_worker_with_another_model_is_refused_naming_the_difference(self):
        servers, tmp = self.start_server("--num_workers=2")
        paths = [os.path.join(tmp, f"result-{rank}.json") for rank in range(2)]
        first = self.worker("mismatch", servers, 0, paths[0], stdin=subprocess.PIPE)
        self.assertEqual(first.stdout.readline().decode().strip(), "registered")
        second = self.worker("mismatch", servers, 1, paths[1])
        self.finish([second])
        first.stdin.write(b"done\n")
        first.stdin.flush()
        self.finish([first])
        with open(paths[0]) as f:
            self.assertEqual(json.load(f)["code"], "OK")
        with open(paths[1]) as f:
            refused = json.load(f)
        self.assertNotEqual(refused["code"], "OK", refused)
        self.assertIn("fc1.weight", refused["message"])

    def test_refusals_name_the_problem(self):
        servers, tmp = self.start_server("--num_workers=1")
        path = os.path.join(tmp, "results.json")
        self.finish([self.worker("single", servers, 0, path)])
        with open(path) as f:
            results = json.load(f)
        expectations = {
            "local_optimizer": ("INVALID_ARGUMENT", "--optimizer=none"),
            "second_optimizer": ("FAILED_PRECONDITION", "already has one"),
            "unregistered": ("INVALID_ARGUMENT", "'decoder.weight' is not a registered parameter"),
            "wrong_shape": ("INVALID_ARGUMENT", "'fc2.bias' has shape [4]"),
            "float64": ("INVALID_ARGUMENT", "'fc2.bias' is torch.float64"),
            "replica_shape": ("INVALID_ARGUMENT",
                              "replicas[1]'s 'fc1.weight' has shape [25, 96], but replicas[0]'s "
                              "has [24, 96]"),
            "replica_shared": ("INVALID_ARGUMENT",
                               "replicas[1]'s 'conv1.weight' is the same tensor as "
                               "replicas[0]'s 'conv1.weight'"),
            "replica_first": ("INVALID_ARGUMENT",
                              "replicas[0]'s 'conv1.weight' is not the tensor named_parameters "
                              "gave"),
            "replica_module": ("INVALID_ARGUMENT", "replicas must be a non-empty list of Modules"),
            "meta_device": ("INVALID_ARGUMENT",
                            "parameter 'weight' is on meta; ps.torch takes CPU and CUDA tensors"),
            # The last layer's gradients arrive first: its weight's or its bias's.
            "nan": ("INVALID_ARGUMENT", "has a non-finite gradient (nan"),
        }
        for case, (code, text) in expectations.items():
            self.assertEqual(results[case]["code"], code, f"{case}: {results[case]}")
            self.assertIn(text, results[case]["message"], case)
        self.assertIn("parameter 'fc2.", results["nan"]["message"])

    def test_the_finite_check_finds_the_first_bad_element_and_passes_overflowing_sums(self):
        from ps.torch._core import _first_non_finite
        big = torch.full((4,), 3e38)  # finite elements whose sum is infinite
        self.assertIsNone(_first_non_finite(big))
        self.assertIsNone(_first_non_finite(torch.zeros(5)))
        for bad in (float("nan"), float("inf"), float("-inf")):
            values = big.clone()
            values[2] = bad
            values[3] = bad
            self.assertEqual(_first_non_finite(values), 2, bad)

    # GPU arithmetic sums in other orders than the CPU's: a looser bound.
    @unittest.skipUnless(torch.cuda.is_available(), _NO_CUDA)
    def test_cuda_workers_equal_one_process_on_the_cpu(self):
        self.train_and_compare("sgd", f"--lr={LR}", f"--momentum={MOMENTUM}",
                               f"--weight_decay={WEIGHT_DECAY}", cuda=True,
                               rtol=CUDA_RTOL, atol=CUDA_ATOL)

    @unittest.skipUnless(torch.cuda.is_available(), _NO_CUDA)
    def test_two_cuda_replicas_per_worker_equal_one_process_on_the_cpu(self):
        self.train_and_compare("sgd", f"--lr={LR}", f"--momentum={MOMENTUM}",
                               f"--weight_decay={WEIGHT_DECAY}", num_replicas=2, cuda=True,
                               rtol=CUDA_RTOL, atol=CUDA_ATOL)

    @unittest.skipUnless(torch.cuda.is_available(), _NO_CUDA)
    def test_cuda_replicas_over_a_sum_only_server_equal_one_process_on_the_cpu(self):
        self.train_and_compare("adam", "--optimizer=none", num_replicas=2, cuda=True,
                               rtol=CUDA_RTOL, atol=CUDA_ATOL)

    @unittest.skipUnless(torch.cuda.is_available(), _NO_CUDA)
    def test_cuda_refusals_name_the_problem(self):
        servers, tmp = self.start_server("--num_workers=1")
        path = os.path.join(tmp, "results.json")
        self.finish([self.worker("cuda-refusals", servers, 0, path)])
        with open(path) as f:
            results = json.load(f)
        self.assertEqual(results["mixed"]["code"], "INVALID_ARGUMENT", results)
        self.assertIn("the replicas are all on the CPU or all on CUDA devices",
                      results["mixed"]["message"])
        self.assertEqual(results["split"]["code"], "INVALID_ARGUMENT", results)
        self.assertIn("a model (each replica) lives on one device", results["split"]["message"])
        # A GPU gradient is checked on the host once copied: step() raises it.
        self.assertEqual(results["nan"]["code"], "INVALID_ARGUMENT", results)
        self.assertIn("has a non-finite gradient (nan", results["nan"]["message"])

    def check_the_host_side_of_the_cuda_path(self, kind, *server_flags):
        servers, tmp = self.start_server("--num_workers=1", *server_flags)
        path = os.path.join(tmp, "result.json")
        self.finish([self.worker(f"host-cuda-{kind}", servers, 0, path)])
        with open(path) as f:
            result = json.load(f)
        self.assertEqual(result["push_threads"], ["ps.torch push"], result)
        self.assertEqual(result["nan"]["code"], "INVALID_ARGUMENT", result)
        self.assertIn("has a non-finite gradient (nan", result["nan"]["message"])
        params = torch.load(path + ".pt")
        for name, want in reference(kind).items():
            for r in range(2):
                got = params[f"{r}/{name}"]
                self.assertTrue(torch.allclose(got, want, rtol=RTOL, atol=ATOL),
                                f"replica {r}'s {name}: off by {float((got - want).abs().max())}")

    def test_the_cuda_paths_host_side_on_no_op_streams_equals_one_process(self):
        self.check_the_host_side_of_the_cuda_path(
            "sgd", f"--lr={LR}", f"--momentum={MOMENTUM}", f"--weight_decay={WEIGHT_DECAY}")

    def test_the_cuda_paths_host_side_over_a_sum_only_server_equals_one_process(self):
        self.check_the_host_side_of_the_cuda_path("adam", "--optimizer=none")

    @unittest.skipIf(torch.cuda.is_available(), "CUDA is available: nothing to refuse")
    def test_a_cuda_device_without_cuda_is_refused_by_name(self):
        import ps
        from ps.torch._core import _check_device
        with self.assertRaises(ps.Error) as caught:
            _check_device("ps.torch.DistributedOptimizer", "parameter 'fc.weight'",
                          torch.device("cuda", 0))
        self.assertEqual(caught.exception.code_name, "FAILED_PRECONDITION")
        self.assertIn("parameter 'fc.weight' is on cuda:0, but CUDA is not available",
                      caught.exception.message)

    def test_the_push_thread_waits_for_each_copy_and_keeps_the_first_error(self):
        # The CUDA path's push thread, driven without a GPU: each bucket's
        # wait (the copy's event) comes before its push, in order; after a
        # failure the later buckets are dropped and step() gets that error.
        from ps.torch._core import _PushThread
        log = []

        def start_push(bucket):
            if bucket == "bad":
                raise ValueError("bucket bad failed")
            log.append(("push", bucket))

        pusher = _PushThread(start_push)
        for bucket in ("a", "b"):
            pusher.submit(bucket, lambda bucket=bucket: log.append(("wait", bucket)))
        self.assertIsNone(pusher.drain())
        self.assertEqual(log, [("wait", "a"), ("push", "a"), ("wait", "b"), ("push", "b")])
        log.clear()
        for bucket in ("bad", "c"):
            pusher.submit(bucket, lambda: None)
        error = pusher.drain()
        self.assertIsInstance(error, ValueError)
        self.assertEqual(log, [], "the bucket after the failure was pushed")
        pusher.submit("d", lambda: None)
        self.assertIsNone(pusher.drain(), "drain hands an error over once")
        self.assertEqual(log, [("push", "d")])
        pusher.stop()

    def test_the_first_bucket_is_pushed_while_backward_goes_on(self):
        servers, tmp = self.start_server("--num_workers=1", "--chunk_bytes=1048576", "--lr=0.01")
        path = os.path.join(tmp, "overlap.json")
        self.finish([self.worker("overlap", servers, 0, path)])
        with open(path) as f:
            result = json.load(f)
        self.assertGreaterEqual(result["parameters"], 20_000_000)
        events = result["events"]
        kinds = [event[0] for event in events]
        first_push = kinds.index("push")
        last_gradient = len(kinds) - 1 - kinds[::-1].index("gradient")
        # Backward's order: the last layer's gradients come first, the first
        # layer's ("0.weight", "0.bias") last.
        first_layer = min(i for i, event in enumerate(events) if event[1].startswith("0."))
        self.assertLess(first_push, first_layer,
                        f"no push before the first layer's gradient: {kinds}")
        pushes_in_backward = sum(1 for event in events[:last_gradient] if event[0] == "push")
        self.assertGreaterEqual(pushes_in_backward, 4, kinds)
        self.assertLess(events[first_push][2], result["backward_end"])
        self.assertEqual(kinds[-1], "step")

    def kill_server_mid_training(self, mode, *server_flags, restart_after_checkpoint=None,
                                 workers=1):
        """Runs `workers` lost_server_workers against a server killed
        (SIGKILL) when they pause and, with `restart_after_checkpoint` (a
        manifest's path), killed once that checkpoint is written and started
        again on its port 1 s after the workers went on. Returns each
        worker's result and final parameters."""
        from ps import local_server
        tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        flags = [f"--num_workers={workers}", "--chunk_bytes=256", f"--lr={LR}",
                 f"--momentum={MOMENTUM}", f"--weight_decay={WEIGHT_DECAY}"] + list(server_flags)
        servers_started = []

        def start(extra, directory):
            os.makedirs(directory, exist_ok=True)
            with open(os.path.join(directory, "server.log"), "wb") as server_log:
                server, address = local_server.start(self.server_binary, flags + extra,
                                                     log=server_log, timeout_s=30, tmp=directory)
            servers_started.append(server)
            return address

        self.addCleanup(lambda: [(s.kill(), s.wait(timeout=30)) for s in servers_started])
        servers = start([], os.path.join(tmp, "first"))
        paths = [os.path.join(tmp, f"result-{rank}.json") for rank in range(workers)]
        processes = [self.worker(f"lost-{mode}", servers, rank, paths[rank],
                                 stdin=subprocess.PIPE) for rank in range(workers)]
        for worker in processes:
            self.assertEqual(worker.stdout.readline().decode().strip(), "stepped")
        if restart_after_checkpoint:
            deadline = time.monotonic() + 30
            while not os.path.exists(restart_after_checkpoint):  # written in the background
                self.assertLess(time.monotonic(), deadline, "no checkpoint written")
                time.sleep(0.05)
        servers_started[0].kill()
        servers_started[0].wait(timeout=30)
        for worker in processes:
            worker.stdin.write(b"go\n")
            worker.stdin.flush()
        if restart_after_checkpoint:
            time.sleep(1)
            start([f"--port={servers.rsplit(':', 1)[1]}"], os.path.join(tmp, "second"))
        self.finish(processes)
        results = []
        for path in paths:
            with open(path) as f:
                results.append((json.load(f), torch.load(path + ".pt")))
        return results if workers > 1 else results[0]

    def test_a_killed_server_fails_the_step_with_a_server_lost_error(self):
        result, _ = self.kill_server_mid_training("norecover")
        self.assertTrue(result.get("server_lost"), result)
        self.assertIn(result["code"], ("UNAVAILABLE", "CANCELLED", "ABORTED"), result)
        self.assertLess(result["seconds"], 15, result)
        self.assertEqual((result["iteration"], result["recoveries"]), (1, 0), result)

    def test_a_server_that_does_not_come_back_fails_after_the_reconnect_timeout(self):
        result, _ = self.kill_server_mid_training("timeout")
        self.assertIn("reconnecting failed", result["message"], result)
        self.assertIn("the server was lost in iteration 1", result["message"], result)
        self.assertGreaterEqual(result["seconds"], 2.5, result)
        self.assertLess(result["seconds"], 20, result)

    def test_training_goes_on_when_the_server_restarts_from_its_checkpoint(self):
        tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        # 2 workers, killed at version 2 once version 1's checkpoint is
        # written (2's may be too): the workers resume at 1 (rolling back one
        # iteration, the momentum restored) or 2, and end as one process would.
        results = self.kill_server_mid_training(
            "restart", f"--checkpoint_dir={tmp}", "--checkpoint_every_steps=1",
            restart_after_checkpoint=os.path.join(tmp, "checkpoint-000000000001.json"),
            workers=2)
        expected = reference("sgd")
        for rank, (result, params) in enumerate(results):
            self.assertEqual(result["code"], "OK", result)
            self.assertEqual((result["iteration"], result["recoveries"]), (STEPS, 1), result)
            self.assertEqual(result["events"][0][1]["iteration"], 2, result)
            self.assertIn(result["events"][0][1]["version"], (1, 2), result)
            for name, want in expected.items():
                got = params[f"0/{name}"]
                self.assertTrue(torch.allclose(got, want, rtol=RTOL, atol=ATOL),
                                f"rank {rank}'s {name}: off by up to "
                                f"{float((got - want).abs().max())}")

    def run_launcher(self, *script_args, server_flags=()):
        tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        env = dict(os.environ, PYTHONPATH=self.package_parent)
        launcher = subprocess.run(
            [sys.executable, "-m", "ps.torch.run", "--workers=2", f"--server={self.server_binary}"]
            + [f"--server_arg={flag}" for flag in server_flags]
            + ["--", os.path.abspath(__file__), "launched", tmp, self.package_parent]
            + list(script_args),
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        return launcher.returncode, launcher.stdout.decode(), tmp

    def test_run_starts_a_server_and_the_workers_from_the_environment(self):
        code, output, tmp = self.run_launcher(server_flags=(
            "--chunk_bytes=256", f"--lr={LR}", f"--momentum={MOMENTUM}",
            f"--weight_decay={WEIGHT_DECAY}"))
        self.assertEqual(code, 0, output)
        expected = reference("sgd")
        for rank in range(2):
            got = torch.load(os.path.join(tmp, f"params-{rank}.pt"))
            for name, want in expected.items():
                self.assertTrue(torch.allclose(got[f"0/{name}"], want, rtol=RTOL, atol=ATOL),
                                f"rank {rank}'s {name}")

    def test_run_stops_the_job_when_a_worker_fails(self):
        started = time.monotonic()
        code, output, _ = self.run_launcher("fail")
        self.assertEqual(code, 3, output)
        self.assertLess(time.monotonic() - started, 30, "rank 0 was not stopped")
        self.assertIn("worker 1 exited with status 3", output)

    def test_run_stops_the_workers_when_its_server_dies(self):
        started = time.monotonic()
        code, output, _ = self.run_launcher("kill_server")
        self.assertEqual(code, 1, output)
        self.assertLess(time.monotonic() - started, 30, "the workers were not stopped")
        self.assertIn("the server exited with status -9 while the workers ran", output)

    def test_calls_before_init_are_refused(self):
        import ps
        import ps.torch

        net = model(seed=0)
        for call in (lambda: ps.torch.DistributedOptimizer(None, net.named_parameters()),
                     lambda: ps.torch.broadcast_parameters(net), ps.torch.rank):
            with self.assertRaises(ps.Error) as caught:
                call()
            self.assertEqual(caught.exception.code_name, "FAILED_PRECONDITION")
            self.assertIn("call ps.torch.init() first", caught.exception.message)
        with self.assertRaises(ps.Error) as caught:
            ps.torch.init("127.0.0.1:1", colour="blue")
        self.assertIn("unknown setting(s) ['colour']", caught.exception.message)
        saved = os.environ.pop("PS_SERVERS", None)
        try:
            with self.assertRaises(ps.Error) as caught:
                ps.torch.init()
            self.assertIn("PS_SERVERS", caught.exception.message)
        finally:
            if saved is not None:
                os.environ["PS_SERVERS"] = saved
        self.assertFalse(ps.torch.initialized())


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "launched":  # under ps.torch.run
        out_dir, package_parent = sys.argv[2:4]
        sys.path.insert(0, package_parent)
        rank = int(os.environ["RANK"])
        if sys.argv[4:] == ["fail"]:  # rank 0 would run a minute unless stopped
            if rank == 0:
                time.sleep(60)
            sys.exit(3)
        if sys.argv[4:] == ["kill_server"]:  # rank 1 kills the launcher's server
            if rank == 1:
                launcher = os.getppid()
                with open(f"/proc/{launcher}/task/{launcher}/children") as f:
                    for pid in f.read().split():
                        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                            if b"--port_file" in cmdline.read():  # the server's flag
                                os.kill(int(pid), 9)
            time.sleep(60)  # both would run a minute unless stopped
            return
        train_worker("sgd", None, None, os.path.join(out_dir, f"params-{rank}.pt"))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        scenario, servers, rank, out_path, package_parent = sys.argv[2:7]
        sys.path.insert(0, package_parent)
        if scenario in ("sgd", "adam"):
            train_worker(scenario, servers, int(rank), out_path)
        elif "-replicas-" in scenario:  # KIND-replicas-N[-cuda]
            kind, _, num_replicas, *device = scenario.split("-")
            train_worker(kind, servers, int(rank), out_path, num_replicas=int(num_replicas),
                         cuda=device == ["cuda"])
        elif scenario.startswith("host-cuda-"):
            host_side_of_cuda_worker(scenario[len("host-cuda-"):], servers, out_path)
        elif scenario == "cuda-refusals":
            cuda_refusals_worker(servers, out_path)
        elif scenario.startswith("lost-"):
            lost_server_worker(scenario[len("lost-"):], servers, int(rank), out_path)
        elif scenario == "overlap":
            overlap_worker(servers, int(rank), out_path)
        elif scenario == "mismatch":
            mismatch_worker(servers, int(rank), out_path)
        else:
            single_worker(servers, int(rank), out_path)
        return
    if len(sys.argv) < 3:
        sys.exit("usage: ps_torch_test.py SERVER_BINARY PACKAGE_DIR")
    PsTorchTest.server_binary = os.path.abspath(sys.argv[1])
    PsTorchTest.package_parent = os.path.dirname(os.path.abspath(sys.argv[2]))
    sys.path.insert(0, PsTorchTest.package_parent)
    torch.set_num_threads(1)
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:], verbosity=2)


if __name__ == "__main__":
    main()
