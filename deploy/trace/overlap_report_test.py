"""Tests of overlap_report.py on small hand-made traces whose figures are
known: the fraction of communication under compute, the first push against
the end of backward, and where the front layer's parameters arrive."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overlap_report  # noqa: E402

DEVICE0 = overlap_report.DEVICE0_LANE


def span(cat, name, start_us, end_us, step, tid=DEVICE0):
    return {"ph": "X", "cat": cat, "name": name, "ts": start_us, "dur": end_us - start_us,
            "pid": 0, "tid": tid, "args": {"step": step}}


def mlp_step(fc1_pull_end_us, fc2_pull_end_us):
    """One step of a three-layer model: backward 0-100 us, the next forward
    from 400 us; pushes from the last layer to the first; pulls whose ends
    are given for fc1 (lanes 0-1) and fc2 (lanes 2-3), fc3's (lane 4) at 60."""
    return [
        span("backward", "fc3", 0, 10, 0),
        span("backward", "fc2", 10, 60, 0),
        span("backward", "fc1", 60, 100, 0),
        span("push_message", "fc3.weight", 10, 20, 0, tid=100),
        span("push_message", "fc2.weight", 40, 140, 0, tid=101),
        span("push_message", "fc1.weight", 95, 130, 0, tid=102),
        span("pull_message", "fc3.weight", 20, 60, 0, tid=4),
        span("pull_message", "fc2.weight", 140, fc2_pull_end_us - 50, 0, tid=2),
        span("pull_message", "fc2.weight", 140, fc2_pull_end_us, 0, tid=3),
        span("pull_message", "fc1.weight", 130, fc1_pull_end_us - 20, 0, tid=0),
        span("pull_message", "fc1.bias", 130, fc1_pull_end_us, 0, tid=1),
        span("forward", "fc1", 400, 450, 1),
        span("forward", "fc2", 450, 500, 1),
    ]


class OverlapReportTest(unittest.TestCase):
    def test_front_layer_ahead_of_the_back_layers_bytes(self):
        rows, summary = overlap_report.report(mlp_step(fc1_pull_end_us=300,
                                                       fc2_pull_end_us=380), skip=0)
        self.assertEqual(len(rows), 1)
        row = rows[0]
        self.assertEqual(row["front_layer"], "fc1")
        # fc1's last pull (fc1.bias) ends 80 us before fc2's last.
        self.assertAlmostEqual(row["front_layer_in_vs_all_in_ms"], -0.080)
        # Against the last tensor's message (fc3, in at 60 us) it is later.
        self.assertAlmostEqual(row["first_layer_in_vs_last_ms"], (280 - 60) / 1e3)
        self.assertEqual(summary["steps_front_layer_ahead"], 1)
        self.assertEqual(summary["steps_first_layer_in_first"], 0)
        # The first push (fc3's at 10 us) starts 90 us before backward ends.
        self.assertAlmostEqual(row["first_push_vs_backward_end_ms"], -0.090)
        self.assertEqual(summary["steps_pushing_before_backward_ends"], 1)

    def test_front_layer_last_when_it_arrives_last(self):
        rows, summary = overlap_report.report(mlp_step(fc1_pull_end_us=390,
                                                       fc2_pull_end_us=380), skip=0)
        self.assertAlmostEqual(rows[0]["front_layer_in_vs_all_in_ms"], 0.0)
        self.assertEqual(summary["steps_front_layer_ahead"], 0)

    def test_hidden_fraction(self):
        rows, summary = overlap_report.report(mlp_step(fc1_pull_end_us=300,
                                                       fc2_pull_end_us=380), skip=0)
        # Communication is the union of [10, 380) = 370 us; compute is
        # backward [0, 100) and the next forward [400, 500): 90 us of it hidden.
        self.assertAlmostEqual(rows[0]["comm_s"], 370e-6)
        self.assertAlmostEqual(rows[0]["hidden"], 90 / 370)
        self.assertAlmostEqual(summary["hidden_fraction"], 90 / 370)

    def test_several_devices_backward_ends_with_the_slowest_replica(self):
        # Device 1 (lane DEVICE0 + 1) finishes fc1's backward at 200 us: the
        # step's backward ends then, so the first push (10 us) is 190 us
        # before it; compute is the union over both devices' passes.
        events = mlp_step(fc1_pull_end_us=300, fc2_pull_end_us=380) + [
            span("backward", "fc1", 100, 200, 0, tid=DEVICE0 + 1),
        ]
        rows, _ = overlap_report.report(events, skip=0)
        self.assertAlmostEqual(rows[0]["first_push_vs_backward_end_ms"], -0.190)
        # Communication [10, 380) under compute [0, 200) and [400, 500).
        self.assertAlmostEqual(rows[0]["hidden"], 190 / 370)

    def test_layer_of(self):
        self.assertEqual(overlap_report.layer_of("fc1.weight"), "fc1")
        self.assertEqual(overlap_report.layer_of("layer1.0.conv1.weight"), "layer1.0.conv1")
        self.assertEqual(overlap_report.layer_of("scale"), "scale")

    def test_command_line_prints_the_summary_and_refuses_a_non_trace(self):
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "overlap_report.py")
        with tempfile.TemporaryDirectory() as tmp:
            trace = os.path.join(tmp, "trace.json")
            with open(trace, "w", encoding="utf-8") as f:
                json.dump({"traceEvents": mlp_step(300, 380)}, f)
            out = subprocess.run([sys.executable, script, trace, "--skip=0"],
                                 capture_output=True, text=True, check=True).stdout
            self.assertIn("front layer (fc1) all in before the step's last parameters in 1", out)
            bad = os.path.join(tmp, "bad.json")
            with open(bad, "w", encoding="utf-8") as f:
                f.write("{not json")
            result = subprocess.run([sys.executable, script, bad], capture_output=True, text=True)
            self.assertEqual(result.returncode, 2)
            self.assertIn("bad.json", result.stderr)


if __name__ == "__main__":
    unittest.main()
