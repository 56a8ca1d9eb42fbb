"""ps._native against a real server daemon: two worker processes push and pull.

Run by ps_native_test.sh under `bazel test` with Debian's /usr/bin/python3:
    ps_native_test.py SERVER_BINARY PACKAGE_DIR
where PACKAGE_DIR is bazel-bin/worker/python/ps (the assembled package).
The same file is the worker process (`worker` as its first argument).
No numpy: the buffers are array.array('f').
"""

import array
import os
import subprocess
import sys
import tempfile
import time
import unittest

# The model: three tensors, 70 elements, in server chunks of 16 elements, so
# several segments, one shared by small tensors.
TENSORS = [("fc.weight", [6, 8]), ("fc.bias", [6]), ("out.weight", [2, 8])]
ELEMENTS = 70
ITERATIONS = 3


def samples(rank):
    return rank + 2


def gradient(rank, iteration):
    """Worker `rank`'s gradient sum of `iteration` (exact in float32)."""
    return array.array("f", [((rank + 1) * (i % 7) - 3 + iteration) / 8.0 for i in range(ELEMENTS)])


def initial():
    return array.array("f", [(i % 11) / 4.0 - 1.0 for i in range(ELEMENTS)])


def expected_final():
    """SGD with lr 1: each iteration subtracts the mean gradient over all samples."""
    params = array.array("f", initial())
    total = samples(0) + samples(1)
    for t in range(ITERATIONS):
        g0, g1 = gradient(0, t), gradient(1, t)
        # float32 as the server computes it: sum, divide, subtract.
        sums = array.array("f", [a + b for a, b in zip(g0, g1)])
        means = array.array("f", [s / total for s in sums])
        params = array.array("f", [p - m for p, m in zip(params, means)])
    return params


def run_worker(servers, rank, out_path):
    """One worker: register, then ITERATIONS steps pushed and pulled bucket by
    bucket in backward's order (last segments first), then its parameters
    written to `out_path`."""
    import ps  # the package under test, from PYTHONPATH

    client = ps.Client(servers, worker_id=f"worker-{rank}", rank=rank, connect_timeout=20,
                       rpc_timeout=20, wait_timeout=30)
    registration = client.register(TENSORS, initial() if rank == 0 else None,
                                    steps_per_epoch=ITERATIONS)
    assert registration.rank == rank, registration
    assert registration.num_workers == 2, registration
    assert registration.consistency == "sync", registration
    assert registration.optimizer == "sgd", registration
    assert registration.num_elements == ELEMENTS, registration
    ends = client.segment_ends()
    assert len(ends) == registration.num_segments >= 4, ends
    assert ends[-1] == ELEMENTS, ends
    params = array.array("f", [0.0] * ELEMENTS)
    assert client.pull_all(registration.version, params) == registration.version
    assert params == initial(), "version 0 is rank 0's initial values"
    assert client.members(registration.version) == [0, 1]

    segments = len(ends)
    for t in range(registration.version, registration.version + ITERATIONS):
        grad = gradient(rank, t)
        handles = []
        # Buckets of two segments, last first, each pulled once pushed.
        for last in range(segments, 0, -2):
            first = max(0, last - 2)
            handles.append(client.push(t, samples(rank), first, last, grad))
            handles.append(client.pull(t + 1, first, last, params))
            try:
                params.append(0.0)  # would move the buffer under the library
                raise AssertionError("a buffer in use could be resized")
            except BufferError:
                pass
        for handle in handles:
            assert handle.wait(timeout=30), f"{handle} did not finish"
            handle.close()
    with open(out_path, "wb") as out:
        params.tofile(out)
    client.close()
    print(f"worker {rank}: {ITERATIONS} iterations pushed and pulled", flush=True)


class NativeBindingTest(unittest.TestCase):
    server_binary = None
    package_parent = None  # the directory holding the package under test

    def test_errors_are_ps_errors_with_code_and_message(self):
        import ps
        from ps import _native

        with self.assertRaises(ps.Error) as caught:
            ps.Client("")
        self.assertEqual(caught.exception.code, _native.INVALID_ARGUMENT)
        self.assertEqual(caught.exception.code_name, "INVALID_ARGUMENT")
        self.assertIn("servers is empty", caught.exception.message)

        lines = []
        client = ps.Client("127.0.0.1:1", connect_timeout=0.2, log=lines.append)
        with self.assertRaises(ps.Error) as caught:
            client.segment_ends()
        self.assertEqual(caught.exception.code, _native.FAILED_PRECONDITION)
        self.assertIn("before register", caught.exception.message)
        with self.assertRaises(ps.Error) as caught:
            client.register([("w", [2, 2], "bfloat16")])
        self.assertEqual(caught.exception.code, _native.INVALID_ARGUMENT)
        self.assertIn("'w') has dtype BF16", caught.exception.message)
        with self.assertRaises(ps.Error) as caught:
            client.push(0, 1, 0, 1, array.array("f", [0.0] * 4))
        self.assertEqual(caught.exception.code, _native.FAILED_PRECONDITION)
        with self.assertRaises(TypeError):
            client.push(0, 1, 0, 1, array.array("d", [0.0] * 4))
        started = time.monotonic()
        with self.assertRaises(ps.Error) as caught:
            client.register([("w", [2, 2])])
        self.assertEqual(caught.exception.code, _native.UNAVAILABLE)
        self.assertTrue(caught.exception.server_lost)
        self.assertLess(time.monotonic() - started, 5)
        self.assertTrue(any("127.0.0.1:1" in line for line in lines), lines)
        client.close()
        with self.assertRaises(ps.Error) as caught:
            client.registration
        self.assertIn("closed", caught.exception.message)

    def test_two_worker_processes_get_the_mean_of_their_gradients(self):
        tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        from ps import local_server
        with open(os.path.join(tmp, "server.log"), "wb") as server_log:
            server, servers = local_server.start(
                self.server_binary, ["--num_workers=2", "--lr=1", "--chunk_bytes=64"],
                log=server_log, timeout_s=30, tmp=tmp)
        try:
            workers = []
            for rank in range(2):
                workers.append(subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "worker", servers, str(rank),
                     os.path.join(tmp, f"params-{rank}"), self.package_parent],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
            outputs = []
            for worker in workers:
                output, _ = worker.communicate(timeout=60)
                outputs.append(output.decode())
            for rank, worker in enumerate(workers):
                self.assertEqual(worker.returncode, 0, f"worker {rank}:\n{outputs[rank]}")
        finally:
            server.terminate()
            server.wait(timeout=30)
        finals = []
        for rank in range(2):
            params = array.array("f")
            with open(os.path.join(tmp, f"params-{rank}"), "rb") as f:
                params.fromfile(f, ELEMENTS)
            finals.append(params)
        self.assertEqual(finals[0], finals[1], "both workers hold the same parameters")
        expected = expected_final()
        for i in range(ELEMENTS):
            self.assertAlmostEqual(finals[0][i], expected[i], delta=1e-5 * max(1, abs(expected[i])),
                                   msg=f"element {i}")


def main():
    # The package under test comes first on the path: before this script's
    # own directory (which Python adds, symlinks resolved: the source tree,
    # whose ps/ has no library).
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        sys.path.insert(0, sys.argv[5])
        run_worker(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    if len(sys.argv) < 3:
        sys.exit("usage: ps_native_test.py SERVER_BINARY PACKAGE_DIR")
    NativeBindingTest.server_binary = os.path.abspath(sys.argv[1])
    NativeBindingTest.package_parent = os.path.dirname(os.path.abspath(sys.argv[2]))
    sys.path.insert(0, NativeBindingTest.package_parent)
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:], verbosity=2)


if __name__ == "__main__":
    main()
