"""d2l_train.py through ps.torch.run with 2 workers and a real server, on a
small generated data set in the idx format of /usr/share/datasets/fashion-mnist.

    d2l_train_test.py SERVER_BINARY PACKAGE_DIR D2L_TRAIN_PY
"""

import gzip
import os
import re
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch


def write_idx(path, array):
    """array (uint8) as a gzipped idx file: magic 0 0 8 ndim, big-endian dims."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def write_data(directory, train, test):
    """Images whose class is readable: class c lights row block c."""
    rng = np.random.default_rng(0)
    for prefix, n in (("train", train), ("t10k", test)):
        labels = rng.integers(0, 10, n).astype(np.uint8)
        images = rng.integers(0, 60, (n, 28, 28)).astype(np.uint8)
        for i, c in enumerate(labels):
            images[i, 2 * c + 4:2 * c + 6, :] = 255
        write_idx(os.path.join(directory, f"{prefix}-images-idx3-ubyte.gz"), images)
        write_idx(os.path.join(directory, f"{prefix}-labels-idx1-ubyte.gz"), labels)


class D2lTrainTest(unittest.TestCase):
    server_binary = ""
    package_parent = ""
    script = ""

    def launch(self, *flags, train=640):
        """d2l_train.py through ps.torch.run, 2 workers; (exit status, output, data dir)."""
        tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        write_data(tmp, train=train, test=128)
        launcher = subprocess.run(
            [sys.executable, "-m", "ps.torch.run", "--workers=2",
             f"--server={self.server_binary}", "--server_arg=--lr=0.9", "--",
             self.script, "--model=lenet", "--batch_size=64", "--val_size=128",
             f"--data_dir={tmp}"] + list(flags),
            env=dict(os.environ, PYTHONPATH=self.package_parent),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        return launcher.returncode, launcher.stdout.decode(), tmp

    def test_one_epoch_prints_accuracies_and_writes_the_plot(self):
        png = os.path.join(tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR")), "curves.png")
        code, output, _ = self.launch("--epochs=2", f"--plot={png}")
        self.assertEqual(code, 0, output)
        self.assertIn("lenet: 512 train, 128 validation, 128 test images; 2 workers x 1 replica "
                      "(cpu)", output)
        # Rank 0 alone reports: one line per epoch, then the final line.
        self.assertEqual(len(re.findall(r"^epoch \d+: train loss ", output, re.M)), 2, output)
        final = re.search(r"^final: .* test acc ([0-9.]+);", output, re.M)
        self.assertIsNotNone(final, output)
        self.assertTrue(0.0 <= float(final.group(1)) <= 1.0)
        with open(png, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_two_local_replicas_per_worker_train(self):
        code, output, _ = self.launch("--epochs=1", "--replicas=2", train=384)
        self.assertEqual(code, 0, output)
        self.assertIn("2 workers x 2 replicas (cpu, cpu), global batch 64", output)
        self.assertIsNotNone(re.search(r"^final: .* test acc ([0-9.]+);", output, re.M), output)

    @unittest.skipUnless(torch.cuda.is_available(),
                         "no CUDA device: torch.cuda.is_available() is False in this process")
    def test_cuda_replicas_train(self):
        code, output, _ = self.launch("--epochs=1", "--device=cuda", "--replicas=2", train=384)
        self.assertEqual(code, 0, output)
        self.assertRegex(output, r"2 workers x 2 replicas \(cuda:\d+, cuda:\d+\)")
        self.assertIsNotNone(re.search(r"^final: .* test acc ([0-9.]+);", output, re.M), output)

    @unittest.skipIf(torch.cuda.is_available(), "CUDA is available: nothing to refuse")
    def test_cuda_without_a_gpu_is_refused(self):
        result = subprocess.run(
            [sys.executable, self.script, "--device=cuda"],
            env=dict(os.environ, PYTHONPATH=self.package_parent), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, timeout=60)
        self.assertEqual(result.returncode, 2, result.stdout.decode())
        self.assertIn("--device=cuda: CUDA is not available", result.stdout.decode())

    def test_bad_flag_is_refused(self):
        launcher = subprocess.run(
            [sys.executable, self.script, "--model=vgg"],
            env=dict(os.environ, PYTHONPATH=self.package_parent), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        self.assertEqual(launcher.returncode, 2, launcher.stdout.decode())


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: d2l_train_test.py SERVER_BINARY PACKAGE_DIR D2L_TRAIN_PY")
    D2lTrainTest.server_binary = os.path.abspath(sys.argv[1])
    D2lTrainTest.package_parent = os.path.dirname(os.path.abspath(sys.argv[2]))
    D2lTrainTest.script = os.path.abspath(sys.argv[3])
    unittest.main(argv=sys.argv[:1])


if __name__ == "__main__":
    main()
