"""benchmarks/trainers/step_calls.py: a traced run replayed on sim, its
driver calls cut at each step's first allocation of its input."""
import gzip
import io
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "benchmarks", "trainers"))
import step_calls  # noqa: E402

MiB = 1 << 20


def write_trace(path, tokens):
    """Parameters, then per step: its input ids, and activations that grow with the tokens."""
    rows = ["action,addr,size,stream,time_us"]
    addr, t = 1 << 40, 0

    def alloc(size):
        nonlocal addr, t
        addr += 1 << 32
        t += 1
        rows.append(f"alloc,{addr},{size},0,{t}")
        return addr, size

    def free(block):
        nonlocal t
        t += 1
        rows.append(f"free_requested,{block[0]},{block[1]},0,{t}")

    params = [alloc(8 * MiB) for _ in range(4)]
    for i, n in enumerate(tokens):
        ids = alloc(n * 8)
        acts = [alloc(n * 64 * 1024) for _ in range(5)]
        # A block of the next step's input size late in the step.
        acts.append(alloc(tokens[i + 1] * 8 if i + 1 < len(tokens) else 512))
        for a in reversed(acts):
            free(a)
        free(ids)
    for p in params:
        free(p)
    rows.append(f"end,0,{len(rows) - 1},0,{t + 1}")
    with gzip.open(path, "wt") as f:
        f.write("\n".join(rows) + "\n")


class StepCallsTest(unittest.TestCase):
    def test_input_bytes_of_each_kind_of_step(self):
        self.assertEqual(step_calls.input_bytes({"tokens": 1024}, 1), 8192)
        self.assertEqual(step_calls.input_bytes({"image_px": 224}, 16), 16 * 3 * 224 * 224 * 4)
        with self.assertRaises(ValueError):
            step_calls.input_bytes({"batch": 3}, 1)

    def test_a_run_without_step_shapes_is_refused_with_a_message(self):
        # resnet's job records no shapes: before, a KeyError's traceback.
        with tempfile.TemporaryDirectory() as d:
            trace = os.path.join(d, "t.trace.csv.gz")
            write_trace(trace, [256, 512])
            run = os.path.join(d, "run.json")
            with open(run, "w") as f:
                f.write('{"model": "resnet", "steps": 2}')
            err = io.StringIO()
            saved, sys.stderr = sys.stderr, err
            try:
                code = step_calls.main([trace, run])
            finally:
                sys.stderr = saved
            self.assertEqual(code, 2)
            self.assertIn("records no step shapes (the resnet job writes none)", err.getvalue())

    def test_live_calls_are_the_differences_of_the_counts_after_each_step(self):
        run = {"fragctl": {"memory_calls_before_step": [100], "memory_calls_after_step": [150, 150, 175]}}
        self.assertEqual(step_calls.live_calls_per_step(run), [50, 0, 25])

    def test_each_step_is_found_and_its_calls_add_up_to_the_replay(self):
        tokens = [512, 256, 512, 2048, 256]
        # A step's 14 rows take 14 us of trace time (one each).
        run = {"shapes": [{"tokens": n} for n in tokens], "batch": 1, "step_times_s": [14e-6] * len(tokens),
               "fragctl": {"memory_calls_before_step": [0], "memory_calls_after_step": [10, 10, 10, 20, 20]}}
        with tempfile.TemporaryDirectory() as tmp:
            trace = os.path.join(tmp, "job.trace.csv.gz")
            write_trace(trace, tokens)
            log = io.StringIO()
            stats, rows, before = step_calls.replay(trace, run, capacity="8GiB", log=log)
        self.assertEqual([r[0] for r in rows], [1, 2, 3, 4, 5])
        # Four parameters, then seven allocations a step; each step's last
        # block has the next step's input size and is not taken for its start.
        self.assertEqual([r[2] for r in rows], [4, 11, 18, 25, 32])
        self.assertEqual([r[4] for r in rows], [10, 0, 0, 10, 0])
        # The parameters and the first step map memory; the step of 2,048
        # tokens, four times any before it, maps more; the calls before the
        # first step and those of the steps are every call the replay made.
        calls = [r[3] for r in rows]
        self.assertGreater(before, 0)
        self.assertGreater(calls[0], 0)
        self.assertGreater(calls[3], 0)
        self.assertEqual(before + sum(calls), stats["backend_counters"]["memory_calls"])
        self.assertIn("-- step 4 {'tokens': 2048} starts at allocation 25", log.getvalue())
        self.assertIn(f"-- step 4 made {calls[3]} calls", log.getvalue())


if __name__ == "__main__":
    unittest.main()
