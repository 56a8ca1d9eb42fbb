"""transformer.py through ps.torch.run with 2 workers and a real server.

    transformer_test.py SERVER_BINARY PACKAGE_DIR TRANSFORMER_PY
"""

import os
import re
import subprocess
import sys
import unittest


class TransformerTest(unittest.TestCase):
    server_binary = ""
    package_parent = ""
    script = ""

    def launch(self, server_flag, *script_args):
        launcher = subprocess.run(
            [sys.executable, "-m", "ps.torch.run", "--workers=2",
             f"--server={self.server_binary}", f"--server_arg={server_flag}", "--",
             self.script] + list(script_args),
            env=dict(os.environ, PYTHONPATH=self.package_parent),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        return launcher.returncode, launcher.stdout.decode()

    def test_learns_with_local_adam_on_a_sum_only_server(self):
        code, output = self.launch("--optimizer=none", "--steps=40", "--log_every=20",
                                   "--eval_size=500")
        self.assertEqual(code, 0, output)
        self.assertEqual(len(re.findall(r"^step \d+: loss ", output, re.M)), 2, output)
        final = re.search(r"^final: held-out accuracy ([0-9.]+) ", output, re.M)
        self.assertIsNotNone(final, output)
        # Chance is 1/8; 40 steps of Adam reach well above it.
        self.assertGreater(float(final.group(1)), 0.4, output)

    def test_a_server_that_runs_sgd_is_refused(self):
        code, output = self.launch("--lr=0.1", "--steps=5")
        self.assertEqual(code, 1, output)
        self.assertIn("--optimizer", output)


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: transformer_test.py SERVER_BINARY PACKAGE_DIR TRANSFORMER_PY")
    TransformerTest.server_binary = os.path.abspath(sys.argv[1])
    TransformerTest.package_parent = os.path.dirname(os.path.abspath(sys.argv[2]))
    TransformerTest.script = os.path.abspath(sys.argv[3])
    unittest.main(argv=sys.argv[:1])


if __name__ == "__main__":
    main()
