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

    def test_one_epoch_prints_accuracies_and_writes_the_plot(self):
        tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        write_data(tmp, train=640, test=128)
        png = os.path.join(tmp, "curves.png")
        launcher = subprocess.run(
            [sys.executable, "-m", "ps.torch.run", "--workers=2",
             f"--server={self.server_binary}", "--server_arg=--lr=0.9", "--",
             self.script, "--model=lenet", "--epochs=2", "--batch_size=64", "--val_size=128",
             f"--data_dir={tmp}", f"--plot={png}"],
            env=dict(os.environ, PYTHONPATH=self.package_parent),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        output = launcher.stdout.decode()
        self.assertEqual(launcher.returncode, 0, output)
        self.assertIn("lenet: 512 train, 128 validation, 128 test images; 2 workers", output)
        # Rank 0 alone reports: one line per epoch, then the final line.
        self.assertEqual(len(re.findall(r"^epoch \d+: train loss ", output, re.M)), 2, output)
        final = re.search(r"^final: .* test acc ([0-9.]+);", output, re.M)
        self.assertIsNotNone(final, output)
        self.assertTrue(0.0 <= float(final.group(1)) <= 1.0)
        with open(png, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

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
