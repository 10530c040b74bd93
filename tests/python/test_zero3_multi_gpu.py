"""benchmarks/zero3/multi_gpu.py's bookkeeping on made-up jobs: the data is
the same in every variant, each job is compared with FSDP2 of its own
round, and the device sampler keeps the training steps' peak apart from the
job's (the phase after training must not count). No GPU, no torch.

    python3 -m unittest tests/python/test_zero3_multi_gpu.py -v
"""
import os
import sys
import tempfile
import threading
import time
import unittest
from types import SimpleNamespace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks", "zero3"))
import multi_gpu  # noqa: E402


def rank(losses, tokens=1000, seconds=1.0, warmup=1, **extra):
    row = {"rank": 0, "warmup": warmup, "losses": losses, "steady_tokens": tokens, "steady_seconds": seconds,
           "step_seconds": [9.0] + [seconds / (len(losses) - warmup)] * (len(losses) - warmup),
           "retries_steady": 0, "fragctl_memory_calls_per_steady_step": None, "torch_max_reserved": 2**30,
           "outside_torch_bytes": {"steps_max": 2**29}}
    row.update(extra)
    return row


def job(variant, round_, ranks, peaks=(2**31, 2**31), training=None):
    j = {"variant": variant, "name": multi_gpu.VARIANTS[variant][0], "round": round_, "ranks": ranks,
         "peak_device_bytes": list(peaks), "peak_device_bytes_training": training}
    multi_gpu.summarize(j)
    return j


class MultiGpuBookkeepingTest(unittest.TestCase):
    def test_sequence_lengths_are_fixed_by_the_seed_and_in_range(self):
        args = multi_gpu.options(["--out", "x", "--steps", "50"])
        lengths = multi_gpu.sequence_lengths(args)
        self.assertEqual(lengths, multi_gpu.sequence_lengths(args))  # every rank, every variant
        self.assertEqual(len(lengths), 50)
        self.assertTrue(all(args.seq_min <= n <= args.seq_max and n % args.seq_step == 0 for n in lengths))
        self.assertGreater(len(set(lengths)), 5)  # variable
        other = multi_gpu.options(["--out", "x", "--steps", "50", "--seed", "2"])
        self.assertNotEqual(lengths, multi_gpu.sequence_lengths(other))

    def test_each_job_is_compared_with_fsdp2_of_its_round(self):
        jobs = [job("fsdp2", 0, [rank([3.0, 2.0], 1000), rank([3.0, 2.2], 1000)]),
                job("zero3-arena", 0, [rank([3.0, 2.05], 900), rank([3.0, 2.2], 900)]),
                job("fsdp2", 1, [rank([3.0, 2.0], 500), rank([3.0, 2.2], 500)]),
                job("zero3-arena", 1, [rank([3.0, 2.1], 500), rank([3.0, 2.2], 500)])]
        self.assertAlmostEqual(jobs[0]["tokens_per_s"], 2000.0)  # every rank's tokens over the slowest's time
        self.assertEqual(jobs[1]["losses"], [3.0, 2.125])  # the mean over ranks, per step
        text = "\n".join(multi_gpu.tables(SimpleNamespace(bandwidth_iters=20), jobs))
        self.assertIn("| 0 | zero3.shard, enable(\"arena\") | 1800 (0.900x) |", text)
        self.assertIn("| 1 | zero3.shard, enable(\"arena\") | 1000 (1.000x) |", text)
        self.assertAlmostEqual(jobs[1]["max_loss_diff_to_fsdp2"], 0.025)
        self.assertAlmostEqual(jobs[3]["max_loss_diff_to_fsdp2"], 0.05)

    def test_a_failed_rank_leaves_the_job_unmeasured(self):
        j = job("zero3-caching", 0, [rank([3.0, 2.0]), {"rank": 1, "missing": "failed: RuntimeError: x"}])
        self.assertNotIn("tokens_per_s", j)
        text = "\n".join(multi_gpu.tables(SimpleNamespace(bandwidth_iters=20), [j]))
        self.assertIn("not run: failed: RuntimeError: x", text)

    def test_the_training_peak_is_shown_where_the_sampler_froze_one(self):
        both = job("fsdp2", 0, [rank([1.0, 1.0])] * 2, peaks=(8 * 2**30, 8 * 2**30), training=[5 * 2**30, 6 * 2**30])
        self.assertEqual(both["peak_device_gib"], [5.0, 6.0])
        self.assertEqual(both["peak_device_gib_job"], [8.0, 8.0])
        job_only = job("fsdp2", 0, [rank([1.0, 1.0])] * 2, peaks=(8 * 2**30, 8 * 2**30))
        self.assertEqual(job_only["peak_device_gib"], [8.0, 8.0])

    def test_the_sampler_freezes_the_peak_once_every_rank_marked_its_steps_done(self):
        directory = tempfile.mkdtemp()
        sampler = multi_gpu.DeviceSampler.__new__(multi_gpu.DeviceSampler)  # without NVML
        used = [[100, 100]]
        sampler.used = lambda: list(used[0])
        sampler.markers = [os.path.join(directory, "trained-%d" % r) for r in range(2)]
        sampler.training_peaks, sampler.baseline, sampler.peaks = None, [100, 100], [100, 100]
        sampler.stopping = threading.Event()
        sampler.thread = threading.Thread(target=sampler._run, daemon=True)
        sampler.thread.start()

        def settle():
            time.sleep(0.1)
        used[0] = [500, 600]
        settle()
        open(sampler.markers[0], "w").close()
        used[0] = [550, 600]
        settle()  # one rank done: still training
        open(sampler.markers[1], "w").close()
        settle()
        used[0] = [900, 900]  # after training (the bandwidth phase)
        settle()
        self.assertEqual(sampler.stop(), ([800, 800], [450, 500]))


if __name__ == "__main__":
    unittest.main()
