"""The declm replay model (benchmarks/trainers/declm_trace.py): a trace every
reader accepts (each free names a live block), the same file on every run
(tensor sets are walked in insertion order, not hash order), what stays
live after the steps (parameters and AdamW's two states), and its largest
block (the fp32 softmax of the first step's length)."""
import gzip
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TRAINERS = os.path.join(HERE, "..", "..", "benchmarks", "trainers")
sys.path.insert(0, TRAINERS)
import declm_trace  # noqa: E402
import jobs  # noqa: E402


def generate(path, *args):
    # A fresh interpreter per run, so that a hash-order dependence would show.
    subprocess.run([sys.executable, os.path.join(TRAINERS, "declm_trace.py"), "--out", path, *args], check=True,
                   capture_output=True)
    with gzip.open(path, "rt") as f:
        return f.read()


class DeclmTraceTest(unittest.TestCase):
    def test_trace_is_consistent_repeatable_and_keeps_only_model_state(self):
        with tempfile.TemporaryDirectory() as tmp:
            first = generate(os.path.join(tmp, "a.csv.gz"), "--steps", "2", "--layers", "2")
            again = generate(os.path.join(tmp, "b.csv.gz"), "--steps", "2", "--layers", "2")
        self.assertEqual(first, again)
        lines = first.splitlines()
        self.assertEqual(lines[0], "action,addr,size,stream,time_us")
        live, largest, last_time = {}, 0, 0
        for line in lines[1:]:
            action, addr, size, stream, time_us = line.split(",")
            self.assertEqual(stream, "0")
            self.assertGreaterEqual(int(time_us), last_time)
            last_time = int(time_us)
            if action == "alloc":
                self.assertNotIn(addr, live)
                live[addr] = int(size)
                largest = max(largest, int(size))
            else:
                self.assertEqual(action, "free_requested")
                self.assertEqual(live.pop(addr), int(size))
        cfg = dict(H=2048, I=5632, heads=32, kv=4, V=32000, layers=2, B=2)
        params = declm_trace.parameters(cfg)
        self.assertEqual(len(live), 3 * len(params))
        self.assertEqual(sum(live.values()), 3 * sum(size for _, size in params))
        tokens = jobs.sequence_lengths(2, 128, 4096)
        self.assertEqual(largest, 2 * 32 * max(tokens) ** 2 * 4)


if __name__ == "__main__":
    unittest.main()
