"""The trainer benchmark's verdict (benchmarks/trainers/run_trainers.py) on
made-up results: the native baseline is the median of the native runs, the
spread their range, and a run's step time is judged against both."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks", "trainers"))
import run_trainers  # noqa: E402


def result(label, mode, mean_ms, losses=("0x1.0p+0",), **extra):
    r = {"model": "m", "label": label, "mode": mode, "mean_step_s": mean_ms / 1e3, "median_step_s": mean_ms / 1e3,
         "losses": [1.0] * len(losses), "losses_hex": list(losses), "peak_device_used_bytes": 0}
    r.update(extra)
    return r


class TrainerVerdictTest(unittest.TestCase):
    def test_baseline_is_the_median_of_the_native_runs_and_spread_their_range(self):
        runs = [result("native", "native", 100), result("arena", "fragctl", 500),
                result("native (middle)", "native", 110), result("native (again)", "native", 90)]
        baseline, spread = run_trainers.native_baseline(runs)
        self.assertAlmostEqual(baseline, 0.100)
        self.assertAlmostEqual(spread, 0.2)

    def test_two_natives_average_and_one_has_no_spread(self):
        self.assertAlmostEqual(run_trainers.native_baseline(
            [result("native", "native", 100), result("native (again)", "native", 104)])[0], 0.102)
        self.assertEqual(run_trainers.native_baseline([result("native", "native", 100)])[1], None)
        self.assertEqual(run_trainers.native_baseline([result("arena", "fragctl", 100)]), (None, None))

    def test_step_time_is_judged_against_the_baseline_and_the_spread(self):
        runs = [result("native", "native", 100), result("native (again)", "native", 104),
                result("close", "fragctl", 103.5), result("noisy", "fragctl", 105), result("slow", "fragctl", 120)]
        lines, ok = run_trainers.verdict(runs)
        text = "\n".join(lines)
        self.assertTrue(ok, text)  # the math is the same everywhere
        self.assertIn("above native's by more than 2% somewhere", lines[0])
        self.assertNotIn("m / close", text)
        self.assertIn("m / noisy: step time 2.9% above native (within native's own spread, 3.9%)", text)
        self.assertIn("m / slow: step time 17.6% above native (beyond", text)

    def test_runs_without_a_native_one_asked_for_are_not_compared_and_do_not_fail(self):
        lines, ok = run_trainers.verdict([result("arena", "fragctl", 100)])
        self.assertTrue(ok, "\n".join(lines))
        self.assertIn("not compared: no native run asked for", lines[0])
        self.assertIn("- m: no native run asked for: losses and step times not compared", lines)
        # A native run asked for that did not finish leaves the verdict incomplete.
        lines, ok = run_trainers.verdict([result("native", "native", 100, error="skipped: out of time budget"),
                                          result("arena", "fragctl", 100)])
        self.assertFalse(ok)
        self.assertIn("FAIL or incomplete", lines[0])
        self.assertIn("- m: no native run finished, nothing to compare", lines)
        # One model compared and one not: the compared one decides.
        other = dict(result("arena", "fragctl", 100), model="n")
        lines, ok = run_trainers.verdict([result("native", "native", 100), result("arena", "fragctl", 100), other])
        self.assertTrue(ok)
        self.assertIn("PASS", lines[0])

    def test_a_loss_that_differs_fails_the_math(self):
        runs = [result("native", "native", 100, losses=("0x1.0p+0", "0x1.8p+0")),
                result("arena", "fragctl", 100, losses=("0x1.0p+0", "0x1.9p+0"))]
        lines, ok = run_trainers.verdict(runs)
        self.assertFalse(ok)
        self.assertIn("m / arena: loss differs from native from step 1", "\n".join(lines))

    def test_an_evaluation_loss_that_differs_fails_the_math(self):
        runs = [result("native", "native", 100, eval_losses_hex=[["0x1.0p+0", "0x1.0p+1"]]),
                result("arena", "fragctl", 100, eval_losses_hex=[["0x1.0p+0", "0x1.8p+1"]])]
        lines, ok = run_trainers.verdict(runs)
        self.assertFalse(ok)
        self.assertIn("an evaluation's losses differ from native's", "\n".join(lines))
        runs[1]["eval_losses_hex"] = [["0x1.0p+0", "0x1.0p+1"]]
        self.assertTrue(run_trainers.verdict(runs)[1])  # the control: equal evaluations pass

    def test_a_trace_whose_blocks_meet_fails_and_is_named(self):
        with tempfile.TemporaryDirectory() as tmp:
            traces = {}
            for model, count in (("clean", 0), ("twice", 2)):
                traces[model] = os.path.join(tmp, model + ".csv")
                with open(traces[model], "w") as f:
                    f.write(str(count))
            # A stand-in of `fragctl info PATH --json`: the count the file holds.
            cli = os.path.join(tmp, "fragctl")
            with open(cli, "w") as f:
                f.write("#!/bin/sh\nn=$(cat \"$2\")\n"
                        "echo \"[{\\\"overlapping_allocs\\\": $n, \\\"first_overlap_event\\\": 7}]\"\n")
            os.chmod(cli, 0o755)
            lines, clean = run_trainers.overlaps(traces, cli)
            self.assertFalse(clean)
            text = "\n".join(lines)
            self.assertIn("- clean: none", text)
            self.assertIn("- twice: **2 allocations meet a live block** (the first is event 7)", text)
            self.assertTrue(run_trainers.overlaps({"clean": traces["clean"]}, cli)[1])

    def test_table_compares_with_the_baseline_and_shows_calls_in_timed_steps(self):
        runs = [result("native", "native", 100, torch_allocator={"peak_reserved_bytes": 2, "peak_allocated_bytes": 1}),
                result("native (again)", "native", 110),
                result("arena", "fragctl", 115.5, fragctl={
                    "peak_reserved_bytes": 1 << 30, "peak_requested_bytes": 1 << 30, "allocator": "arena",
                    "reserved_over_requested": 1.0, "memory_calls": 40, "memory_calls_timed": 3})]
        rows = run_trainers.table(runs)
        arena = next(row for row in rows if "| arena |" in row)
        self.assertIn("| +10.0% |", arena)
        self.assertIn("| 40 (3) |", arena)

    def test_runs_are_planned_in_order_with_repeats_numbered(self):
        runs = run_trainers.planned_runs("llama", "/tmp/out", "/lib/p.so", ["native", "arena", "native", "arena"])
        self.assertEqual([r[0] for r in runs], ["native", "fragctl arena", "native (2)", "fragctl arena (2)"])
        self.assertEqual([r[1] for r in runs], ["native", "fragctl", "native", "fragctl"])
        with self.assertRaises(SystemExit):
            run_trainers.planned_runs("llama", "/tmp/out", "/lib/p.so", ["native", "arenas"])


if __name__ == "__main__":
    unittest.main()
