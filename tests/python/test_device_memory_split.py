"""The device memory that is not fragctl's, from Python (issue 31,
deliverable 2; docs/reports.md): the split on the sim backend, an
attribution, and the report file that carries both.

    FRAGCTL_LIBRARY=build/libfragctl.so PYTHONPATH=python python3 -m unittest tests/python/test_device_memory_split.py
"""
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

import fragctl

GiB = 1 << 30
MiB = 1 << 20


class DeviceMemorySplitTest(unittest.TestCase):
    def allocator(self):
        return fragctl.Allocator("caching", backend="sim", sim_capacity="8GiB", sim_context="512MiB",
                                 sim_other_processes="1GiB")

    def test_the_split_names_the_context_and_the_other_processes(self):
        with self.allocator() as a:
            ptr = a.malloc(64 * MiB)
            split = a.device_memory_split()
            self.assertTrue(split["per_process"])
            self.assertEqual(split["context"], 512 * MiB)
            self.assertEqual(split["other_processes"], 1 * GiB)
            self.assertEqual(split["nccl"], 0)
            self.assertEqual(split["fragctl"] + split["not_fragctl"], split["used"])
            self.assertEqual(split["this_process"], split["fragctl"] + 512 * MiB)
            self.assertEqual(a.process_memory_outside(), 512 * MiB)
            a.free(ptr, 64 * MiB)

    def test_an_attributed_communicator_is_nccl_in_the_split_and_the_report(self):
        with self.allocator() as a:
            a.attribute_device_memory("nccl", "world", 256 * MiB)
            # sim's device does not hold those bytes: they are cut from the
            # context, never counted twice.
            self.assertEqual(a.device_memory_split()["nccl"], 256 * MiB)
            with tempfile.TemporaryDirectory() as d:
                path = a.report(os.path.join(d, "r.json"))
                with open(path) as f:
                    doc = json.load(f)
            split = doc["allocators"][0]["device_memory"]["split"]
            self.assertEqual(split["nccl"], 256 * MiB)
            self.assertEqual(split["other_processes"], 1 * GiB)
            self.assertEqual(split["context"] + split["nccl"], 512 * MiB)
            a.attribute_device_memory("nccl", "world", 0)
            self.assertEqual(a.device_memory_split()["nccl"], 0)
            with self.assertRaises(fragctl.ConfigurationError):
                a.attribute_device_memory("cublas", "x", 1)

    def test_attributing_measures_what_the_block_took_outside_fragctl(self):
        with self.allocator() as a:
            with a.attributing("nccl", "group"):
                ptr = a.malloc(32 * MiB)  # fragctl's own bytes are not the communicator's
            self.assertEqual(a.device_memory_split()["nccl"], 0)
            a.free(ptr, 32 * MiB)

    def test_fragctl_torch_attributes_a_process_group_on_the_default_allocator(self):
        # Process-wide state (the default allocator): in a child process.
        code = textwrap.dedent("""
            import fragctl, fragctl.torch
            with fragctl.torch.nccl_memory("world", device=0):
                pass  # sim: nothing taken outside fragctl
            split = fragctl.default_allocator(0).device_memory_split()
            print(split["context"], split["nccl"], split["per_process"])
        """)
        env = dict(os.environ, FRAGCTL_BACKEND="sim", FRAGCTL_CONF="sim_context:256MiB")
        python_dir = os.path.dirname(os.path.dirname(os.path.abspath(fragctl.__file__)))
        env["PYTHONPATH"] = python_dir + os.pathsep + env.get("PYTHONPATH", "")
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout.split(), [str(256 * MiB), "0", "True"])


if __name__ == "__main__":
    unittest.main()
