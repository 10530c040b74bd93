"""fragctl's PyTorch routes against PyTorch's own allocator (GPU and PyTorch 2.x).

Each check of torch_checks.py runs in its own process under PyTorch's
allocator ("torch") and under fragctl.torch.enable with the native route,
and the answers are compared; the pluggable route's known losses are pinned
too, so that the day PyTorch forwards more to it, the docs change. Skipped,
with the reason, where PyTorch 2.x or a CUDA device is missing (CI).

    FRAGCTL_LIBRARY=build/libfragctl.so PYTHONPATH=python python3 -m unittest tests/python/test_torch_backend.py -v
"""
import json
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
GiB = 1 << 30


def _gpu_torch():
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if int(torch.__version__.split(".")[0]) < 2:
        return "PyTorch %s: the routes need PyTorch 2.x" % torch.__version__
    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


SKIP = _gpu_torch()
RESULTS = {}


def run(route, check, **env):
    key = (route, check)
    if key not in RESULTS:
        environment = dict(os.environ)
        environment.update(env)
        python_dir = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")
        environment["PYTHONPATH"] = python_dir + os.pathsep + environment.get("PYTHONPATH", "")
        p = subprocess.run([sys.executable, os.path.join(HERE, "torch_checks.py"), route, check], env=environment,
                           capture_output=True, text=True, timeout=600)
        lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
        if not lines:
            raise AssertionError("%s %s printed no result (exit %d):\n%s\n%s" % (route, check, p.returncode,
                                                                              p.stdout[-3000:], p.stderr[-3000:]))
        RESULTS[key] = json.loads(lines[-1])
        RESULTS[key]["stderr"] = p.stderr[-2000:]
        out = os.environ.get("FRAGCTL_TORCH_RESULTS")
        if out:
            with open(out, "a") as f:
                f.write(json.dumps({"route": route, "check": check, **RESULTS[key]}) + "\n")
    return RESULTS[key]


def ok(testcase, result):
    testcase.assertTrue(result["ok"], result.get("traceback", result))
    return result


@unittest.skipIf(SKIP is not None, SKIP or "")
class native_route(unittest.TestCase):
    def test_the_native_route_is_the_one_enabled(self):
        r = ok(self, run("native", "memory_api"))
        self.assertEqual(r["route"], "native")
        self.assertIn("native backend", r["stderr"])

    def test_no_memory_function_raises_or_answers_zero(self):
        torch_r = ok(self, run("torch", "memory_api"))
        ours = ok(self, run("native", "memory_api"))
        for name, value in ours.items():
            self.assertFalse(isinstance(value, str) and value.startswith("RAISES"), "%s: %s" % (name, value))
        for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
            self.assertGreaterEqual(ours[name], 2 * GiB, name)
            self.assertLessEqual(ours[name], 2 * GiB + 64 * (1 << 20), name)  # page rounding at most
            self.assertGreaterEqual(torch_r[name], 2 * GiB, name)
        for key in ("allocated_bytes.all.current", "active_bytes.all.current", "requested_bytes.all.current",
                    "reserved_bytes.all.current"):
            self.assertGreaterEqual(ours["memory_stats"][key], 2 * GiB, key)
        self.assertGreater(ours["memory_summary"], 0)
        self.assertGreater(ours["memory_snapshot"], 0)
        # Peaks reset: only the 256 MiB allocated after the reset counts (plus the 2 GiB still live).
        self.assertLess(ours["max_memory_allocated_after_reset"], ours["max_memory_allocated"] + 257 * (1 << 20))
        self.assertGreaterEqual(ours["empty_cache_returned"], int(1.9 * GiB))
        self.assertGreaterEqual(torch_r["empty_cache_returned"], int(1.9 * GiB))

    def test_reset_accumulated_memory_stats_resets_the_pools_counts_too(self):
        for route in ("torch", "native"):
            r = ok(self, run(route, "memory_api"))
            with self.subTest(route=route):
                counts = r["accumulated_after_reset"]
                self.assertIsInstance(counts, dict, counts)
                self.assertIn("allocation.all.allocated", counts)
                self.assertEqual({k: v for k, v in counts.items() if v != 0}, {})

    def test_set_per_process_memory_fraction_caps_fragctl(self):
        self.assertEqual(ok(self, run("torch", "fraction"))["capped"], True)
        r = ok(self, run("native", "fraction"))
        self.assertTrue(r["capped"], r)
        self.assertTrue(r["below_cap_ok"], r)

    def test_record_stream_keeps_a_tensor_a_side_stream_still_reads(self):
        control = ok(self, run("native", "record_stream_control"))
        self.assertIn(False, control["intact"], "positive control: without record_stream the reuse must show")
        self.assertEqual(ok(self, run("native", "record_stream"))["intact"], [True, True, True])
        self.assertEqual(ok(self, run("torch", "record_stream"))["intact"], [True, True, True])

    def test_graph_replays_are_exact_and_never_touch_other_tensors(self):
        r = ok(self, run("native", "graph"))
        self.assertEqual(r["outputs_ok"], r["replays"])
        self.assertEqual(r["between_ok"], r["replays"])
        self.assertTrue(r["all_kept"])

    def test_mem_pool_keeps_its_blocks_and_gives_its_memory_back(self):
        for route in ("torch", "native"):
            r = ok(self, run(route, "mempool"))
            with self.subTest(route=route):
                self.assertTrue(r["values_ok"], r)
                self.assertTrue(r["disjoint"], r)
                self.assertTrue(r["reused_in_pool"], r)
                self.assertTrue(r["outside_kept_out"], r)
                # After the pool is gone only the tensors outside it are held (and the runtime's rounding).
                self.assertLessEqual(r["reserved_end"] - r["reserved_start"], r["held_outside"] + (64 << 20), r)

    def test_graph_capture_into_a_pool_of_another_allocator_frees_inside_the_capture(self):
        r = ok(self, run("native", "mempool_graph"))
        self.assertEqual(r["outputs_ok"], r["replays"], r)
        self.assertTrue(r["reused_in_capture"], r)
        self.assertEqual(r["forwarded_blocks_left"], 0, r)

    def test_cuda_ipc_shares_tensors_between_processes(self):
        for route in ("torch", "native"):
            r = ok(self, run(route, "ipc"))
            with self.subTest(route=route):
                self.assertEqual(r.get("exit"), 0, r)
                self.assertTrue(r.get("read_ok"), r)
                self.assertTrue(r.get("producer_sees_writes"), r)
                self.assertTrue(r.get("kept_while_shared"), r)
                self.assertTrue(r.get("memory_returned"), r)

    def test_cuda_ipc_control_past_the_reference_counting_sees_blocks_overwritten(self):
        r = run("native", "ipc_control")
        self.assertNotIn("error", r)  # the script ran; its verdict ("ok") must be a failure
        self.assertFalse(r["ok"], r)
        self.assertTrue(r.get("control"), r)
        self.assertTrue(r.get("read_ok"), r)
        self.assertFalse(r.get("kept_while_shared", True), r)
        self.assertTrue(r.get("overwritten"), r)
        self.assertEqual(r.get("exit"), 1, r)

    def test_memory_viz_snapshot(self):
        r = ok(self, run("native", "snapshot"))
        self.assertGreater(r["segments"], 0)
        self.assertGreaterEqual(r["live_blocks"], 4)
        self.assertIn("alloc", r["actions"])
        self.assertIn("free_requested", r["actions"])
        self.assertGreater(r["entries_with_frames"], 0)
        self.assertIn("segments", r["pickle_keys"])
        self.assertIsInstance(r["trace_plot_chars"], int, r["trace_plot_chars"])

    def test_cudnn_benchmark_trains_as_native(self):
        ours = ok(self, run("native", "cudnn_benchmark"))["losses"]
        theirs = ok(self, run("torch", "cudnn_benchmark"))["losses"]
        self.assertEqual(len(ours), len(theirs))
        for a, b in zip(ours, theirs):
            self.assertAlmostEqual(a, b, delta=1e-3 * max(1.0, abs(b)))

    def test_compile_reduce_overhead_trains_as_native(self):
        ours = ok(self, run("native", "compile_reduce_overhead"))["losses"]
        theirs = ok(self, run("torch", "compile_reduce_overhead"))["losses"]
        self.assertEqual(ours, theirs)

    def test_hf_trainer_with_memory_metrics(self):
        ours = ok(self, run("native", "hf_trainer"))
        theirs = ok(self, run("torch", "hf_trainer"))
        self.assertEqual(ours["losses"], theirs["losses"])
        self.assertTrue(ours["memory_metrics"], "Trainer logged no memory metrics")
        self.assertTrue(any(v != 0 for v in ours["memory_metrics"].values()), ours["memory_metrics"])

    def test_lightning_device_stats_monitor(self):
        ours = ok(self, run("native", "lightning"))
        theirs = ok(self, run("torch", "lightning"))
        self.assertGreater(ours["memory_columns"], 0)
        self.assertEqual(ours["memory_columns"], theirs["memory_columns"])
        self.assertEqual(ours["loss"], theirs["loss"])

    def test_fsdp2_one_gpu(self):
        self.assertEqual(ok(self, run("native", "fsdp2"))["losses"], ok(self, run("torch", "fsdp2"))["losses"])


@unittest.skipIf(SKIP is not None, SKIP or "")
class pluggable_route(unittest.TestCase):
    """The fallback: allocate and free only. Pins what it loses (docs/pytorch.md)."""

    def test_memory_stats_raise_there(self):
        r = ok(self, run("pluggable", "memory_api"))
        self.assertEqual(r["route"], "pluggable")
        self.assertTrue(str(r["memory_allocated"]).startswith("RAISES"))
        self.assertIn("pluggable route", r["stderr"])
        self.assertIn("record_stream", r["stderr"])


if __name__ == "__main__":
    unittest.main()
