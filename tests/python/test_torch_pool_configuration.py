"""The native PyTorch route's pools (CUDA graph pools, MemPools, regions)
are made with the backend and the backend's options of the process-default
allocators fragctl.torch.enable configures, not with fragctl_create's
defaults (backend "auto", no options). Needs neither PyTorch nor
libfragctl.so: the native module is a stand-in.

    PYTHONPATH=python python3 -m unittest tests/python/test_torch_pool_configuration.py -v
"""
import types
import unittest
from unittest import mock

import fragctl.torch
from fragctl.torch import _pools


class pool_configuration(unittest.TestCase):
    def test_enables_backend_and_backend_options_reach_the_pools(self):
        environ = {"FRAGCTL_CONF": "sim_capacity:1GiB,release_threshold:1GiB,report:/tmp/r.json",
                   "FRAGCTL_BACKEND": "cuda"}
        options = {"sim_backed": True, "block_table": True, "report": "run.json", "thread_safe": False,
                   "sim_capacity": "2GiB", "limit": "1GiB"}
        self.assertEqual(_pools.native_pool_configuration("sim", options, environ),
                         ("sim_capacity:1GiB,sim_backed:true,thread_safe:false,sim_capacity:2GiB", "sim"))

    def test_the_environment_when_enable_names_nothing(self):
        environ = {"FRAGCTL_CONF": "sim_backed:true", "FRAGCTL_BACKEND": "sim"}
        self.assertEqual(_pools.native_pool_configuration(None, {}, environ), ("sim_backed:true", "sim"))
        self.assertEqual(_pools.native_pool_configuration(None, {}, {}), ("", ""))

    def test_policy_options_outputs_and_the_cap_stay_the_device_allocators(self):
        for key in ("release_threshold", "max_split_size", "report", "trace", "prometheus", "limit",
                    "warmup_bytes", "block_table", "device"):
            self.assertFalse(_pools.for_pools(key), key)
        for key in ("sim_capacity", "sim_backed", "sim_granularity", "thread_safe"):
            self.assertTrue(_pools.for_pools(key), key)


class native_allocator_wiring(unittest.TestCase):
    def test_enable_hands_the_configuration_to_the_native_module(self):
        calls = []
        module = types.SimpleNamespace(allocator=lambda library: "allocator over " + library,
                                       configure_pools=lambda options, backend: calls.append((options, backend)))
        fake_torch = types.SimpleNamespace(
            cuda=types.SimpleNamespace(memory=types.SimpleNamespace(_CUDAAllocator=lambda a: ("wrapped", a))))
        import fragctl._native as native
        with mock.patch.object(native, "load", return_value=module), \
                mock.patch.object(fragctl.torch._capi, "library_path", return_value="/lib/libfragctl.so"), \
                mock.patch.dict("os.environ", {"FRAGCTL_CONF": "", "FRAGCTL_BACKEND": ""}):
            got = fragctl.torch._native_allocator(fake_torch, "sim", {"sim_backed": True, "block_table": True})
        self.assertEqual(got, ("wrapped", "allocator over /lib/libfragctl.so"))
        self.assertEqual(calls, [("sim_backed:true", "sim")])


if __name__ == "__main__":
    unittest.main()
