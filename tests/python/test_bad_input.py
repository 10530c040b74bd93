"""Bad arguments to the Python package (docs/reliability.md, "Bad inputs"):
each is refused in Python with ValueError, TypeError or OverflowError before
it reaches C, where ctypes would wrap or cut it (issue 18). The last test
feeds random arguments (a fuzz-style test with a fixed seed).

Run as tests/python/test_fragctl.py is (CTest: python_fragctl).
"""
import random
import unittest

import fragctl
from fragctl import _capi

MiB = 1 << 20


def sim(**options):
    return fragctl.Allocator("caching", backend="sim", sim_capacity="1GiB", **options)


class SizesTest(unittest.TestCase):
    def test_sizes_beyond_size_t_are_overflow_errors(self):
        with sim() as a:
            # Was: 2**64 gave 0 (no error), 2**64 + 100 a 100-byte block.
            for n in (1 << 64, (1 << 64) + 100, 1 << 100):
                with self.assertRaises(OverflowError) as caught:
                    a.malloc(n)
                self.assertIn("nbytes=%d does not fit in size_t" % n, str(caught.exception))
            with self.assertRaises(ValueError):
                a.malloc(-1)
            for bad in (1.5, "4096", None, True):
                with self.assertRaises(TypeError):
                    a.malloc(bad)
            self.assertEqual(a.stats()["allocations"], 0)
            # Positive control: in range, through C, with C's own verdict.
            p = a.malloc(MiB)
            self.assertEqual(a.stats()["requested_bytes"]["current"], MiB)
            with self.assertRaises(OverflowError):
                a.free(p, 1 << 64)
            a.free(p, MiB)
            with self.assertRaises(fragctl.ConfigurationError):  # above 2^62: C refuses it
                a.malloc((1 << 64) - 1)

    def test_a_free_of_the_wrong_size_frees_and_warns_and_a_second_free_raises(self):
        # Red team, 2026-11-28: a wrong size freed the block and raised, so a caller that took the
        # exception for "not freed" and freed again did a double free.
        import warnings
        with sim() as a:
            p = a.malloc(MiB)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                a.free(p, MiB // 2)
            self.assertEqual([w.category for w in caught], [RuntimeWarning])
            self.assertIn("size differs from the allocated size", str(caught[0].message))
            self.assertEqual(a.stats()["requested_bytes"]["current"], 0)
            with self.assertRaises(fragctl.FragctlError) as again:  # control: the block is gone
                a.free(p, MiB)
            self.assertEqual(again.exception.status, "FRAGCTL_ERROR_NOT_OWNED")

    def test_pointers_and_streams_beyond_64_bits_are_overflow_errors(self):
        with sim() as a:
            with self.assertRaises(OverflowError):
                a.malloc(MiB, stream=1 << 64)
            with self.assertRaises(ValueError):
                a.malloc(MiB, stream=-1)
            p = a.malloc(MiB)
            with self.assertRaises(OverflowError):
                a.free(p + (1 << 64), MiB)  # was: the same pointer, freed
            self.assertEqual(a.stats()["requested_bytes"]["current"], MiB)
            a.free(p, MiB)


class DevicesTest(unittest.TestCase):
    def test_devices_outside_a_c_int_are_errors(self):
        # Was: device=2**32 became device 0.
        with self.assertRaises(OverflowError) as caught:
            fragctl.Allocator("caching", backend="sim", device=1 << 32)
        self.assertIn("device=4294967296 does not fit in a C int", str(caught.exception))
        with self.assertRaises(ValueError):
            fragctl.Allocator("caching", backend="sim", device=-2)
        with self.assertRaises(OverflowError):
            fragctl.default_allocator(1 << 32, create=False)
        with self.assertRaises(ValueError):
            fragctl.default_allocator(-1, create=False)
        with self.assertRaises(TypeError):
            fragctl.Allocator("caching", backend="sim", device="1")
        with fragctl.Allocator("caching", backend="sim", device=3) as a:  # positive control
            self.assertEqual(a.stats()["device"], 3)


class TextTest(unittest.TestCase):
    def test_a_nul_byte_is_a_value_error(self):
        # Was: "caching\0garbage" built caching.
        with self.assertRaises(ValueError) as caught:
            fragctl.Allocator("caching\0garbage", backend="sim")
        self.assertIn("policy", str(caught.exception))
        self.assertIn("NUL", str(caught.exception))
        with self.assertRaises(ValueError):
            fragctl.Allocator("caching", backend="sim\0x")
        with self.assertRaises(ValueError):
            sim(report="r.json\0x")
        with sim() as a:
            with self.assertRaises(ValueError):
                a.report("r\0.json")

    def test_an_option_set_to_none_is_a_type_error(self):
        # Was: silently dropped, so a misspelt key went unnoticed.
        with self.assertRaises(TypeError) as caught:
            sim(small_sizes=None)
        self.assertIn("small_sizes=None", str(caught.exception))
        with self.assertRaises(TypeError):
            sim(max_split_size=None)
        with self.assertRaises(fragctl.ConfigurationError):  # a misspelt key with a value: C names it
            sim(small_sizes="1MiB")


class RedTeamTest(unittest.TestCase):
    """Findings of a red-team pass (2026-11-27); each test fails without its fix."""

    def test_an_allocator_cannot_be_copied_or_pickled(self):
        # A copy shared the C allocator and the original's finalizer: dropping
        # one and using the other was a SIGSEGV, closing both a double destroy.
        import copy
        import pickle
        with sim() as a:
            for make in (copy.copy, copy.deepcopy, pickle.dumps):
                with self.assertRaises(TypeError) as caught:
                    make(a)
                self.assertIn("fragctl.Allocator cannot be", str(caught.exception))
            p = a.malloc(MiB)  # control: the original is untouched
            a.free(p, MiB)

    def test_attributed_sizes_are_checked_as_every_size(self):
        # Was ctypes.c_size_t(int(n)): -1 became SIZE_MAX, 2**64 became 0
        # (removing the attribution), 1.9 became 1.
        with sim() as a:
            with self.assertRaises(ValueError):
                a.attribute_device_memory("nccl", "world", -1)
            with self.assertRaises(OverflowError):
                a.attribute_device_memory("nccl", "world", 1 << 64)
            for bad in (1.9, True, "4096"):
                with self.assertRaises(TypeError):
                    a.attribute_device_memory("nccl", "world", bad)
            try:
                a.attribute_device_memory("nccl", "red-team", MiB)  # control: accepted
            finally:
                # The attribution is the device's, for the whole process: taken
                # back so that no later test of this process sees it.
                a.attribute_device_memory("nccl", "red-team", 0)

    def test_report_paths_are_file_system_paths_not_str_of_anything(self):
        # str(b"run.json") named a file "b'run.json'", str(5) one named "5".
        import os
        import pathlib
        import shutil
        import tempfile
        directory = tempfile.mkdtemp(prefix="fragctl-paths-")
        self.addCleanup(shutil.rmtree, directory, True)
        with sim() as a:
            a.report(os.fsencode(os.path.join(directory, "bytes.json")))
            a.report(pathlib.Path(directory) / "pathlike.json")
            a.report(os.path.join(directory, os.fsdecode(b"caf\xe9.json")))  # a name that is not UTF-8
            with self.assertRaises(TypeError):
                a.report(5)
        self.assertEqual(sorted(os.listdir(os.fsencode(directory))),
                         [b"bytes.json", b"caf\xe9.json", b"pathlike.json"])


    def test_a_bad_torch_route_variable_is_named_and_an_empty_one_is_auto(self):
        # FRAGCTL_TORCH_ROUTE=bogus was blamed on enable(route='bogus'), an
        # argument never passed; an empty one was refused, not taken as auto.
        from test_fragctl import run_child
        script = """
            import fragctl, fragctl.torch
            try:
                fragctl.torch.enable("arena")
            except fragctl.FragctlError as e:
                print(str(e))
        """
        self.assertIn("FRAGCTL_TORCH_ROUTE='bogus': expected 'auto', 'native' or 'pluggable'",
                      run_child(script, FRAGCTL_TORCH_ROUTE="bogus"))
        # Empty: past the route, whatever this machine's PyTorch then says
        # (no torch, torch 1.x, or enabled).
        empty = run_child(script.replace("except fragctl.FragctlError", "except Exception"), FRAGCTL_TORCH_ROUTE="")
        self.assertNotIn("FRAGCTL_TORCH_ROUTE", empty)


    def test_offload_budgets_and_layers_beyond_their_types_are_refused(self):
        # A budget of 2**64 - 1 was reported as a bad sim_capacity, an option
        # never set; where(2**32) was where(0) (ctypes wrapped it to a C int).
        try:
            import torch
        except ImportError:
            self.skipTest("needs PyTorch (any version)")
        from fragctl.torch import offload_activations
        for budget in ((1 << 62) + 1, (1 << 64) - 1):
            with self.assertRaises(fragctl.ConfigurationError) as caught:
                offload_activations(budget, backend="sim")
            self.assertIn("budget=%d: expected a size of at most 4 EiB" % budget, str(caught.exception))
        with offload_activations("64MiB", backend="sim", min_bytes=0) as o:
            x = torch.ones(1024, requires_grad=True)
            y = (x * 2).sin().sum()
            self.assertEqual(o.where(0), "device")  # control
            for bad in (1 << 32, -(1 << 32), 1 << 64):
                with self.assertRaises(OverflowError):
                    o.where(bad)
            del y


class RandomArgumentsTest(unittest.TestCase):
    """Random sizes, pointers, streams and devices: each call either succeeds
    with exactly what was asked or raises one of the documented errors."""

    def random_integer(self, rng):
        bits = rng.choice([0, 1, 8, 20, 31, 32, 33, 62, 63, 64, 65, 100])
        n = rng.getrandbits(bits) if bits else 0
        if rng.random() < 0.2:
            n = -n - 1
        if rng.random() < 0.1:
            n = (1 << bits) + rng.choice([-1, 0, 1])
        return n

    def random_argument(self, rng):
        roll = rng.random()
        if roll < 0.8:
            return self.random_integer(rng)
        return rng.choice([None, 1.0, "12", b"12", True, [], 2 ** 70])

    def test_random_arguments_give_the_value_or_a_documented_error(self):
        rng = random.Random(18)
        refused = (TypeError, ValueError, OverflowError)
        with fragctl.Allocator("caching", backend="sim", sim_capacity="256MiB") as a:
            for _ in range(3000):
                nbytes, stream = self.random_argument(rng), self.random_argument(rng)
                try:
                    p = a.malloc(nbytes, stream=stream)
                except refused:
                    continue
                except fragctl.FragctlError as e:  # C's verdict: above 2^62, or out of memory
                    self.assertIn(e.status, ("FRAGCTL_ERROR_INVALID_ARGUMENT", "FRAGCTL_ERROR_OUT_OF_MEMORY"))
                    self.assertGreater(nbytes, 128 * MiB)
                    continue
                self.assertGreaterEqual(nbytes, 0)
                self.assertLessEqual(nbytes, 256 * MiB)
                self.assertEqual(a.stats()["requested_bytes"]["current"], nbytes)
                a.free(p, nbytes, stream=stream)
            for _ in range(2000):
                d = self.random_argument(rng)
                try:
                    value = _capi.device(d, allow_unset=True)
                except refused:
                    continue
                self.assertEqual(value, d)
                self.assertTrue(-1 <= value <= _capi.INT_MAX)
            self.assertEqual(a.stats()["requested_bytes"]["current"], 0)


if __name__ == "__main__":
    unittest.main()
