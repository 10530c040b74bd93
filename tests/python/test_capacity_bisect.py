"""The capacity benchmark's search (benchmarks/trainers/capacity.py) on made-up
jobs that pass above a known cap: the bisection lands within one step of the
bracket on the smallest passing cap, probes the top when nothing passed, and
the table compares set-ups with native and expandable segments."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks", "trainers"))
import capacity  # noqa: E402

GiB = 1 << 30


def job_needing(need):
    probes = []

    def run(cap):
        probes.append(cap)
        return {"cap_bytes": cap, "passed": cap >= need, "median_step_s": 0.25}
    return run, probes


class CapacityBisectTest(unittest.TestCase):
    def test_bisection_finds_the_smallest_passing_cap_within_one_step(self):
        low = 10 * GiB
        tops = [int(t * low) for t in capacity.TOPS]
        for need in (10.1 * GiB, 10.5 * GiB, 11.4 * GiB, 11.7 * GiB, 13.2 * GiB):
            run, probes = job_needing(need)
            cap, best, results = capacity.bisect(run, low, tops, 5)
            first = next(i for i, top in enumerate(tops) if top >= need)
            bracket = tops[first] - (tops[first - 1] if first else low)
            self.assertGreaterEqual(cap, need)
            self.assertLessEqual(cap - need, bracket / 32 + capacity.MiB)
            self.assertTrue(best["passed"])
            self.assertEqual(len(results), 5 + first + 1)

    def test_bisection_stops_once_the_bracket_is_within_the_precision(self):
        low = 10 * GiB
        tops = [int(t * low) for t in capacity.TOPS]
        for need in (10.1 * GiB, 10.5 * GiB, 11.4 * GiB, 13.2 * GiB):
            run, probes = job_needing(need)
            cap, best, results = capacity.bisect(run, low, tops, 10, precision=0.01)
            self.assertGreaterEqual(cap, need)
            failed = max([p for p in probes if p < need] + [low])
            self.assertLessEqual(cap - failed, 0.01 * cap)  # the smallest pass is within 1% of a failure
            # and no probe more than needed: one round less leaves the bracket wider than 1%
            first = next(i for i, top in enumerate(tops) if top >= need)
            rounds = len(results) - first - 1
            bracket = tops[first] - (tops[first - 1] if first else low)
            self.assertGreater(bracket / 2 ** (rounds - 1), 0.01 * cap - capacity.MiB)

    def test_a_set_up_failing_at_every_top_costs_one_probe_per_top(self):
        run, probes = job_needing(14 * GiB)
        cap, best, results = capacity.bisect(run, 10 * GiB, [11 * GiB, 13 * GiB], 3)
        self.assertEqual((cap, best), (None, None))
        self.assertEqual(probes, [11 * GiB, 13 * GiB])
        run, probes = job_needing(13 * GiB)
        self.assertEqual(capacity.bisect(run, 10 * GiB, [11 * GiB, 13 * GiB], 3)[0], 13 * GiB)
        self.assertEqual(probes[:2], [11 * GiB, 13 * GiB])
        self.assertTrue(all(11 * GiB < p < 13 * GiB for p in probes[2:]), probes)

    def test_past_the_deadline_the_passing_top_is_the_answer(self):
        run, probes = job_needing(11 * GiB)
        cap, _, results = capacity.bisect(run, 10 * GiB, [12 * GiB, 14 * GiB], 5, deadline=0)
        self.assertEqual((cap, probes), (12 * GiB, [12 * GiB]))
        run, probes = job_needing(13 * GiB)
        cap, _, results = capacity.bisect(run, 10 * GiB, [12 * GiB, 14 * GiB], 5, deadline=0)
        self.assertEqual((cap, probes), (14 * GiB, [12 * GiB, 14 * GiB]))

    def test_table_compares_with_native_and_expandable_segments(self):
        rows = [{"model": "declm", "setup": s, "label": s, "cap_bytes": c * GiB, "live_bytes": 10 * GiB,
                 "median_step_s": 0.2, "probes": 5, "passed_probes": 3} for s, c in
                (("native", 16), ("expandable", 12), ("arena", 11.2))]
        rows.append({"model": "declm", "setup": "async", "label": "async", "cap_bytes": None, "live_bytes": 10 * GiB,
                     "probes": 6, "passed_probes": 0})
        text = capacity.markdown(rows, "H100", "capacity.py")
        self.assertIn("| declm | arena | 11.20 | -30.0% | -6.7% | 200.0 | 3/5 |", text)
        self.assertIn("| declm | async | > 13.50 (failed at every probe) |", text)


if __name__ == "__main__":
    unittest.main()
