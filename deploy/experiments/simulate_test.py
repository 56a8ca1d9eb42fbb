#!/usr/bin/env python3
"""Tests of the model profiles (model_profile.py) and the simulator
(simulate.py): the validator refuses each malformed profile naming the
field, the shipped profiles validate, the simulator reproduces the
analytic step where the fluid model makes it exact, and 64 workers
simulate in seconds. The simulator's cases skip, saying so, where
SimGrid's Python bindings (python3-simgrid) are missing.

    /usr/bin/python3 deploy/experiments/simulate_test.py
"""

import copy
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import model_profile  # noqa: E402

PROFILES = os.path.join(HERE, "profiles")
TMP = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()
# 1 Gbit/s of frames carries this many payload bytes a second (tbf counts
# 1514-byte frames of 1448 payload bytes).
PAYLOAD_BPS = 1e9 / 8 * 1448 / 1514

try:
    import simgrid  # noqa: F401
    HAVE_SIMGRID = True
except ImportError:
    HAVE_SIMGRID = False


def good_profile():
    return {
        "format": "ps-model-profile", "version": 1, "model": "tiny", "batch_size": 8,
        "measured": {"where": "test", "date": "2026-12-06", "cpu": "none", "cores": 1,
                     "threads": 1, "software": {"torch": "none"}, "steps": 1,
                     "warmup_steps": 0, "statistic": "median"},
        "tensors": [{"name": "a.weight", "shape": [4, 3], "dtype": "float32"},
                    {"name": "a.bias", "shape": [4], "dtype": "float32"},
                    {"name": "b.weight", "shape": [2, 4], "dtype": "float16"}],
        "layers": [{"name": "a", "tensors": ["a.weight", "a.bias"], "forward_ms": 1.0,
                    "backward_ms": 2.0},
                   {"name": "b", "tensors": ["b.weight"], "forward_ms": 0.5,
                    "backward_ms": 0.0}],
    }


def synthetic(name, sizes, forward_ms=0.0, backward_ms=0.0):
    """A profile file of float32 tensors of `sizes` elements, one layer each."""
    doc = good_profile()
    doc["model"] = name
    doc["tensors"] = [{"name": f"t{i}", "shape": [n], "dtype": "float32"}
                      for i, n in enumerate(sizes)]
    doc["layers"] = [{"name": f"l{i}", "tensors": [f"t{i}"], "forward_ms": forward_ms,
                      "backward_ms": backward_ms} for i in range(len(sizes))]
    path = os.path.join(TMP, f"{name}.json")
    with open(path, "w") as f:
        json.dump(model_profile.validate(doc), f)
    return path


def simulate(*flags):
    out = os.path.join(TMP, f"sim-{time.monotonic_ns()}.json")
    r = subprocess.run([sys.executable, os.path.join(HERE, "simulate.py"), *flags,
                        f"--json={out}"], capture_output=True, text=True)
    if r.returncode:
        raise AssertionError(f"simulate.py {' '.join(flags)} failed: {r.stderr[-2000:]}")
    with open(out) as f:
        return json.load(f)


class ValidatorTest(unittest.TestCase):
    def refuses(self, mutate, field, words=""):
        doc = good_profile()
        mutate(doc)
        with self.assertRaises(model_profile.ProfileError) as e:
            model_profile.validate(doc)
        self.assertEqual(e.exception.field, field, str(e.exception))
        self.assertIn(words, str(e.exception))

    def test_good(self):
        model_profile.validate(good_profile())

    def test_missing_fields(self):
        self.refuses(lambda d: d.pop("tensors"), "tensors", "missing")
        self.refuses(lambda d: d["layers"][1].pop("forward_ms"), "layers[1].forward_ms",
                     "missing")
        self.refuses(lambda d: d["measured"].pop("cpu"), "measured.cpu", "missing")
        self.refuses(lambda d: d["tensors"][2].pop("dtype"), "tensors[2].dtype", "missing")

    def test_unknown_field_and_version(self):
        self.refuses(lambda d: d["layers"][0].update(forwad_ms=1), "layers[0].forwad_ms",
                     "unknown field")
        self.refuses(lambda d: d.update(version=2), "version", "not a version")
        self.refuses(lambda d: d.update(format="other"), "format")

    def test_times(self):
        self.refuses(lambda d: d["layers"][0].update(backward_ms=-0.5), "layers[0].backward_ms",
                     "negative")
        self.refuses(lambda d: d["layers"][1].update(forward_ms=float("nan")),
                     "layers[1].forward_ms", "not finite")
        self.refuses(lambda d: d["layers"][1].update(forward_ms="3"), "layers[1].forward_ms")
        self.refuses(lambda d: d.update(batch_size=0), "batch_size")

    def test_sizes(self):
        self.refuses(lambda d: d["tensors"][0].update(shape=[2**40, 2**40]), "tensors[0].shape",
                     "overflow int64")
        self.refuses(lambda d: d["tensors"][0].update(shape=[2**20, 2**20]), "tensors[0].shape",
                     "exceed the bound")
        self.refuses(lambda d: d["tensors"][1].update(shape=[4, -1]), "tensors[1].shape[1]")
        self.refuses(lambda d: d["tensors"][1].update(shape=[4, True]), "tensors[1].shape[1]")

    def test_dtype(self):
        self.refuses(lambda d: d["tensors"][1].update(dtype="float8"), "tensors[1].dtype",
                     "unknown dtype")

    def test_layers_cover_tensors(self):
        self.refuses(lambda d: d["layers"][0]["tensors"].remove("a.bias"), "tensors[1]",
                     "in no layer")
        self.refuses(lambda d: d["layers"][1]["tensors"].append("a.bias"),
                     "layers[1].tensors[1]", "layers[0]'s too")
        self.refuses(lambda d: d["layers"][1]["tensors"].append("c.weight"),
                     "layers[1].tensors[1]", "not in tensors")
        self.refuses(lambda d: d["tensors"].append(copy.deepcopy(d["tensors"][0])),
                     "tensors[3].name", "repeats")

    def test_shipped_profiles(self):
        expected = {"resnet50": 25_557_032, "vgg16": 138_357_544, "bert_base": 109_482_240,
                    "lenet": 61_706, "mlp-4096x4096": 20_037_642}
        for name, parameters in expected.items():
            doc = model_profile.load(os.path.join(PROFILES, f"{name}.json"))
            self.assertEqual(sum(math.prod(t["shape"]) for t in doc["tensors"]), parameters,
                             name)
            self.assertTrue(doc["measured"]["where"] and doc["measured"]["software"]["torch"])
            self.assertGreater(sum(l["forward_ms"] + l["backward_ms"] for l in doc["layers"]), 0)


@unittest.skipUnless(HAVE_SIMGRID, "no SimGrid for this Python: install python3-simgrid "
                     "(bash deploy/setup.sh experiments) to run the simulator's tests")
class SimulatorTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.one = synthetic("one_message", [250_000])         # 1 MB: one message
        cls.ten = synthetic("ten_messages", [1_000_000] * 10)  # 10 x 4 MB
        cls.model_bytes_one, cls.model_bytes_ten = 1e6, 40e6

    def assertClose(self, got, want, rel=0.01):
        self.assertLess(abs(got - want), rel * want, f"{got} vs {want}")

    def test_ps_one_worker_one_server_stop_and_wait(self):
        # One message: push, then (its reply and the pull's request a delay
        # each) its pull: 2 M / R + 4 d.
        for delay in (0, 5):
            row = simulate("--protocol=ps", "--workers=1", "--servers=1", "--rate=1gbit",
                           f"--delay={delay}", f"--profile={self.one}", "--compute_scale=0")
            want = 2 * self.model_bytes_one / PAYLOAD_BPS + 4 * delay / 1000
            self.assertClose(row["step_time_s"], want)

    def test_ps_one_worker_pipelined(self):
        # Ten messages on one connection each way: the pulls follow the
        # pushes message by message, so M / R and one message's pull.
        row = simulate("--protocol=ps", "--workers=1", "--servers=1", "--rate=1gbit",
                       f"--profile={self.ten}", "--compute_scale=0")
        self.assertClose(row["step_time_s"], 1.1 * self.model_bytes_ten / PAYLOAD_BPS)

    def test_ps_server_link_bound(self):
        # Eight workers on one server: its link carries W M each way, and
        # the last of the ten messages' pulls trails the pushes.
        row = simulate("--protocol=ps", "--workers=8", "--servers=1", "--rate=1gbit",
                       f"--profile={self.ten}", "--compute_scale=0")
        want = 8 * self.model_bytes_ten / PAYLOAD_BPS
        self.assertClose(row["link_bound_s"], want)
        self.assertClose(row["step_time_s"], 1.1 * want)

    def test_ring_bandwidth_bound(self):
        for workers in (2, 4):
            row = simulate("--protocol=ring", f"--workers={workers}", "--rate=1gbit",
                           f"--profile={self.ten}", "--compute_scale=0")
            want = 2 * (workers - 1) / workers * self.model_bytes_ten / PAYLOAD_BPS
            self.assertClose(row["step_time_s"], want)
            self.assertClose(row["link_bound_s"], want)

    def test_ring_pair_equals_full_ring(self):
        rows = [simulate("--protocol=ring", "--workers=8", "--rate=1gbit", "--delay=1",
                         f"--ring_hosts={mode}", f"--profile={self.ten}",
                         "--compute_ms=50") for mode in ("full", "pair")]
        self.assertClose(rows[0]["step_time_s"], rows[1]["step_time_s"], rel=1e-6)

    def test_emulator_fields(self):
        row = simulate("--protocol=ps", "--workers=2", "--servers=2", "--rate=100mbit",
                       f"--profile={os.path.join(PROFILES, 'lenet.json')}")
        for field in ("workers", "servers", "rate", "delay_ms", "model", "step_time_s",
                      "samples_per_second", "model_bytes", "link_bound_s", "payload_bound_s",
                      "max_link_utilisation", "busiest_link", "bound_s"):
            self.assertIn(field, row)
        self.assertEqual(row["model_bytes"], 246_824)
        self.assertGreaterEqual(row["step_time_s"], row["bound_s"] * 0.999)
        self.assertEqual(len(row["hosts"]), 4)

    def test_64_workers_quickly(self):
        started = time.monotonic()
        row = simulate("--protocol=ps", "--workers=64", "--servers=8", "--rate=10gbit",
                       "--compute_scale=0.01", "--steps=3",
                       f"--profile={os.path.join(PROFILES, 'resnet50.json')}")
        took = time.monotonic() - started
        print(f"64 workers, 8 shards, ResNet-50: {took:.1f} s to simulate", file=sys.stderr)
        self.assertLess(took, 120)
        self.assertGreaterEqual(row["step_time_s"], row["bound_s"] * 0.999)

    def test_refuses_bad_profile(self):
        bad = os.path.join(TMP, "bad.json")
        doc = good_profile()
        doc["layers"][0]["forward_ms"] = -1
        with open(bad, "w") as f:
            json.dump(doc, f)
        r = subprocess.run([sys.executable, os.path.join(HERE, "simulate.py"),
                            f"--profile={bad}"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("layers[0].forward_ms", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
