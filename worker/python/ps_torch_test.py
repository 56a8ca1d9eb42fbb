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

import json
import os
import subprocess
import sys
import tempfile
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


def train_worker(kind: str, servers: Optional[str], rank: Optional[int], out_path: str) -> None:
    """2 workers, each on its half of every global batch; rank 1 starts from
    other values, which registration replaces with rank 0's. servers and
    rank None: from the environment (ps.torch.run's)."""
    import ps.torch

    ps.torch.init(servers, rank=rank, num_workers=None if rank is None else 2,
                  connect_timeout=20, rpc_timeout=20, wait_timeout=30)
    rank = ps.torch.rank()
    net = model(seed=rank)
    local = None if kind == "sgd" else torch.optim.Adam(net.parameters(), lr=ADAM_LR)
    optimizer = ps.torch.DistributedOptimizer(local, net.named_parameters(), bucket_bytes=1024)
    assert ps.torch.rank() == rank and ps.torch.size() == 2
    assert ps.torch.registration().optimizer == kind.replace("adam", "none")
    start = torch.equal(net.conv1.weight, model(seed=0).conv1.weight)
    assert start, "registration set every worker's parameters to rank 0's"
    half = GLOBAL_BATCH // 2
    for x, y in batches():
        x, y = x[rank * half:(rank + 1) * half], y[rank * half:(rank + 1) * half]
        optimizer.zero_grad()
        if kind == "sgd":
            optimizer.set_samples(len(x))  # the default (1) is as good for equal parts
        torch.nn.functional.cross_entropy(net(x), y).backward()
        try:
            optimizer.zero_grad()
            raise AssertionError("zero_grad was allowed while pushes were in flight")
        except ps.Error as e:
            assert "step() first" in e.message, e
        optimizer.step(num_samples=len(x) if kind == "sgd" else None)
    torch.save({name: tensor.detach() for name, tensor in net.named_parameters()}, out_path)
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

    def train_and_compare(self, kind, *server_flags):
        servers, tmp = self.start_server("--num_workers=2", *server_flags)
        paths = [os.path.join(tmp, f"params-{rank}.pt") for rank in range(2)]
        self.finish([self.worker(kind, servers, rank, paths[rank]) for rank in range(2)])
        finals = [torch.load(path) for path in paths]
        expected = reference(kind)
        initial = dict(model(seed=0).named_parameters())
        for name, want in expected.items():
            self.assertTrue(torch.equal(finals[0][name], finals[1][name]),
                            f"{name}: the workers disagree")
            got = finals[0][name]
            error = (got - want).abs()
            worst = float((error - RTOL * want.abs()).max())
            self.assertTrue(torch.allclose(got, want, rtol=RTOL, atol=ATOL),
                            f"{name}: off by up to {float(error.max())} (worst excess {worst})")
            self.assertFalse(torch.allclose(want, initial[name].detach()),
                             f"{name} did not train: the comparison would be empty")

    def test_sgd_with_momentum_and_weight_decay_on_the_server_equals_one_process(self):
        self.train_and_compare("sgd", f"--lr={LR}", f"--momentum={MOMENTUM}",
                               f"--weight_decay={WEIGHT_DECAY}")

    def test_adam_over_a_sum_only_server_equals_one_process(self):
        self.train_and_compare("adam", "--optimizer=none")

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
                self.assertTrue(torch.allclose(got[name], want, rtol=RTOL, atol=ATOL),
                                f"rank {rank}'s {name}")

    def test_run_stops_the_job_when_a_worker_fails(self):
        started = time.monotonic()
        code, output, _ = self.run_launcher("fail")
        self.assertEqual(code, 3, output)
        self.assertLess(time.monotonic() - started, 30, "rank 0 was not stopped")
        self.assertIn("worker 1 exited with status 3", output)

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
        train_worker("sgd", None, None, os.path.join(out_dir, f"params-{rank}.pt"))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        scenario, servers, rank, out_path, package_parent = sys.argv[2:7]
        sys.path.insert(0, package_parent)
        if scenario in ("sgd", "adam"):
            train_worker(scenario, servers, int(rank), out_path)
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
