"""fragctl.torch._progress on a fake store (no PyTorch, no processes): what a
rank whose collective passed fragctl's deadline says about every other rank
from the records they published (issue 31): the ranks that have not entered
it, where each last was, the ones whose process looks dead, the ones that
diverged, and, past a few, the ranks waiting too summed up in one line.
Processes and gloo: tests/torch/test_zero3.py.

    PYTHONPATH=python python3 -m unittest tests/python/test_zero3_progress.py -v
"""
import json
import time
import unittest
from types import SimpleNamespace

from fragctl.torch import _progress


class FakeStore:
    """torch.distributed's Store as Progress uses it: set, get, wait."""

    def __init__(self):
        self.values = {}

    def set(self, key, value):
        self.values[key] = value.encode() if isinstance(value, str) else value

    def get(self, key):
        return self.values[key]

    def wait(self, keys, _timeout):
        for key in keys:
            if key not in self.values:
                raise RuntimeError("Wait timeout")


def progress_of(size, store, rank=0):
    world = object()
    dist = SimpleNamespace(distributed_c10d=SimpleNamespace(_get_default_store=lambda: store),
                           get_world_size=lambda: size, group=SimpleNamespace(WORLD=world))
    progress = _progress.Progress(dist, world, rank, size, deadline=0.5, group_timeout_s=1.0, explicit=False)
    progress.describe = lambda block: ("block %d 'layers.%d'" % (block, block), ["layers.%d" % block])
    return progress


def publish(store, prefix, rank, start, current=None, done=None, gave_up=None, published=None):
    store.set(prefix + str(rank), json.dumps({"rank": rank, "start": start, "in": current, "done": done,
                                              "gave_up": gave_up, "published": published or time.time()}))


class ReportTest(unittest.TestCase):
    def setUp(self):
        self.store = FakeStore()

    def tearDown(self):
        for progress in getattr(self, "made", []):
            progress.close()

    def waiting(self, size):
        """Rank 0 of `size`, in all_gather #5 of block 2 since a moment ago."""
        progress = progress_of(size, self.store)
        self.made = getattr(self, "made", []) + [progress]
        for _ in range(4):
            progress.enter("all_gather", 1, 4096)
            progress.leave()
        progress.enter("all_gather", 2, 8192)
        return progress

    def test_names_the_missing_the_dead_and_the_diverged(self):
        progress = self.waiting(12)
        now, start = time.time(), time.time() - 60
        same = [5, "all_gather", 2, 8192, now - 1]
        for rank in (1, 2, 3, 4, 6, 8, 9):
            publish(self.store, progress.prefix, rank, start, current=same)
        publish(self.store, progress.prefix, 5, start, done=[4, "reduce_scatter", 1, 4096, now - 20])
        publish(self.store, progress.prefix, 7, start, done=[4, "all_gather", 1, 4096, now - 100], published=now - 100)
        publish(self.store, progress.prefix, 10, start, current=[5, "reduce_scatter", 3, 4096, now - 2])
        # rank 11 published nothing
        report = progress.report()
        self.assertEqual(report["missing"], [5, 7, 11])
        self.assertEqual(report["diverged"], [10])
        text = "\n".join(report["lines"])
        self.assertRegex(text, r"rank 5 has not entered all_gather #5 of block 2 'layers.2'; it completed #4 "
                               r"\(reduce_scatter of block 1 'layers.1'\) at 40.0 s and has been silent 20.\d s "
                               r"\(its process last published 0.\d s ago\)")
        self.assertRegex(text, r"rank 7 has not entered all_gather #5 of block 2 'layers.2'.*nothing published for "
                               r"100.\d s: its process may have died or be frozen")
        self.assertIn("rank 10 is in reduce_scatter #5 of block 3 'layers.3' while this rank is in all_gather #5 of "
                      "block 2 'layers.2': the ranks' collectives diverged", text)
        self.assertIn("rank 11: no record in the store", text)
        for rank in (1, 2, 3, 4, 6, 8, 9):
            self.assertIn("rank %d is in all_gather #5 of block 2 'layers.2' too" % rank, text)
        self.assertEqual(sorted(report["records"]), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])

    def test_many_ranks_waiting_too_are_summed_up_in_one_line(self):
        progress = self.waiting(40)
        now, start = time.time(), time.time() - 60
        for rank in range(1, 40):
            if rank == 17:
                publish(self.store, progress.prefix, rank, start, done=[4, "all_gather", 1, 4096, now - 3])
            elif rank == 30:
                publish(self.store, progress.prefix, rank, start, current=[5, "all_gather", 2, 8192, now - 3],
                        gave_up=[5, now - 0.5])
            else:
                publish(self.store, progress.prefix, rank, start, current=[5, "all_gather", 2, 8192, now - 1])
        report = progress.report()
        self.assertEqual(report["missing"], [17])
        self.assertEqual(len(report["lines"]), 2, report["lines"])
        self.assertIn("rank 17 has not entered all_gather #5", report["lines"][0])
        self.assertEqual(report["lines"][1], "ranks 1-16, 18-39 are in it too, or gave up at their deadline")

    def test_this_ranks_record_is_published_and_marked_when_it_gives_up(self):
        progress = self.waiting(2)
        progress.give_up()
        mine = json.loads(self.store.get(progress.prefix + "0"))
        self.assertEqual(mine["in"][:3], [5, "all_gather", 2])
        self.assertEqual(mine["done"][:3], [4, "all_gather", 1])
        self.assertEqual(mine["gave_up"][0], 5)
        # The other rank reads it as having entered and given up.
        other = progress_of(2, self.store, rank=1)
        other.prefix = progress.prefix  # one process plays both ranks: its second manager numbers itself 2
        self.made.append(other)
        for _ in range(4):
            other.enter("all_gather", 1, 4096)
            other.leave()
        other.enter("all_gather", 2, 8192)
        report = other.report()
        self.assertEqual(report["missing"], [])
        self.assertRegex(report["lines"][0], r"rank 0 gave up on all_gather #5 of block 2 'layers.2' [0-9.]+ s ago: "
                                             r"its deadline passed")


if __name__ == "__main__":
    unittest.main()


class QueuedTest(unittest.TestCase):
    """On GPUs collectives are queued: a rank may have queued past the one
    another rank's deadline passed on, none of them complete yet."""

    def test_a_rank_that_queued_past_it_waits_too_and_only_the_absent_one_is_missing(self):
        store = FakeStore()
        progress = progress_of(3, store)
        self.addCleanup(progress.close)
        for _ in range(4):
            progress.enter("all_gather", 1, 4096)
            progress.leave()
        progress.enter("all_gather", 2, 8192)
        stuck = progress.current  # #5, queued, not complete
        progress.enter("all_gather", 3, 8192)  # #6 queued behind it
        self.assertEqual(progress.current[0], 6)
        now, start = time.time(), time.time() - 60
        # rank 1 completed #4 and queued nothing more; rank 2 queued #5 and #6.
        publish(store, progress.prefix, 1, start, done=[4, "all_gather", 1, 4096, now - 10])
        publish(store, progress.prefix, 2, start, current=[6, "all_gather", 3, 8192, now - 1],
                done=[4, "all_gather", 1, 4096, now - 10])
        report = progress.report(stuck)
        self.assertEqual(report["missing"], [1])
        self.assertEqual(report["diverged"], [])
        text = "\n".join(report["lines"])
        self.assertIn("rank 1 has not entered all_gather #5 of block 2 'layers.2'", text)
        self.assertIn("rank 2 has queued all_gather #5 of block 2 'layers.2' and later collectives, up to #6", text)
        # Completing #5 keeps #6 as the one it is in; completing #6 clears it.
        progress.complete(stuck)
        self.assertEqual((progress.done[0], progress.current[0]), (5, 6))
        progress.complete(progress.current)
        self.assertEqual((progress.done[0], progress.current), (6, None))
