"""The fragctl Python package on the sim backend (no GPU, no torch needed).

Run from CTest (python/CMakeLists.txt) with FRAGCTL_LIBRARY pointing at the
built libfragctl.so, or by hand:
    FRAGCTL_LIBRARY=build/libfragctl.so PYTHONPATH=python python3 -m unittest discover -s tests/python
Process-wide state (the process-default allocators, fragctl.torch) is tested
in child processes, one scenario each.
"""
import io
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


def run_child(*code, **env):
    """Runs the pieces of `code` (each dedented) in a fresh Python with the
    package importable; returns stdout."""
    environment = dict(os.environ)
    environment.update(env)
    python_dir = os.path.dirname(os.path.dirname(os.path.abspath(fragctl.__file__)))
    environment["PYTHONPATH"] = python_dir + os.pathsep + environment.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", "".join(textwrap.dedent(c) for c in code)], env=environment, capture_output=True,
                          text=True, timeout=60)
    if done.returncode != 0:
        raise AssertionError("child failed (%d):\n%s\n%s" % (done.returncode, done.stdout, done.stderr))
    return done.stdout


class AllocatorTest(unittest.TestCase):
    def test_malloc_free_and_stats(self):
        with fragctl.Allocator("buckets:arena", backend="sim", sim_capacity="1GiB") as a:
            self.assertEqual(a.policy, "buckets:arena")
            p = a.malloc(3 * MiB, stream=0x1000)
            self.assertNotEqual(p, 0)
            self.assertEqual(p % 512, 0)
            s = a.stats()
            self.assertEqual(s["schema_version"], 1)
            self.assertEqual(s["backend"], "sim")
            self.assertEqual(s["requested_bytes"]["current"], 3 * MiB)
            a.free(p, 3 * MiB, stream=0x1000)
            s = a.stats()
            self.assertEqual(s["requested_bytes"]["current"], 0)
            self.assertEqual((s["allocations"], s["frees"]), (1, 1))
            self.assertGreaterEqual(s["derived"]["reserved_over_requested"], 1.0)

    def test_options_are_fragctl_conf_keys(self):
        with fragctl.Allocator("caching", backend="sim", sim_capacity=64 * MiB, release_on_oom=False,
                               max_split_size="unlimited") as a:
            with self.assertRaises(fragctl.OutOfMemoryError) as caught:
                a.malloc(GiB)
            self.assertIn("out of memory", str(caught.exception))
            self.assertIsInstance(caught.exception, MemoryError)
            self.assertEqual(a.stats()["ooms"], 1)

    def test_bad_configuration_names_the_problem(self):
        with self.assertRaises(fragctl.ConfigurationError) as caught:
            fragctl.Allocator("nosuch", backend="sim")
        self.assertIn('unknown policy "nosuch"', str(caught.exception))
        self.assertEqual(caught.exception.status, "FRAGCTL_ERROR_INVALID_ARGUMENT")
        with self.assertRaises(ValueError):
            fragctl.Allocator("caching", backend="sim", small_sizes="1MiB")
        with self.assertRaises(fragctl.ConfigurationError):
            fragctl.Allocator("caching", backend="sim", report="a,b")

    def test_misuse_is_an_error_with_the_status(self):
        with fragctl.Allocator("caching", backend="sim", sim_capacity="1GiB") as a:
            p = a.malloc(4096)
            a.free(p, 4096)
            with self.assertRaises(fragctl.FragctlError) as caught:
                a.free(p, 4096)
            self.assertEqual(caught.exception.status, "FRAGCTL_ERROR_NOT_OWNED")
            self.assertEqual(a.stats()["misuse"]["not_owned"], 1)

    def test_status_names_are_the_librarys(self):
        from fragctl import _capi
        self.assertEqual(_capi.status_name(_capi.OUT_OF_MEMORY), "FRAGCTL_ERROR_OUT_OF_MEMORY")
        self.assertEqual(_capi.status_name(_capi.STATE), "FRAGCTL_ERROR_STATE")
        self.assertEqual(_capi.status_name(99), "FRAGCTL_ERROR_UNKNOWN")
        self.assertFalse(hasattr(_capi, "STATUS_NAMES"), "a copy of the library's table")

    def test_a_stream_that_ends_leaves_its_cache_to_the_default_stream(self):
        stream = 0x1000  # sim meets any handle on first use
        with fragctl.Allocator("caching", backend="sim", sim_capacity="1GiB") as a:
            p = a.malloc(32 * MiB, stream)
            a.free(p, 32 * MiB, stream)
            reserved = a.stats()["reserved_bytes"]["current"]
            a.stream_ending(stream)
            a.stream_ending(0)  # the default stream: nothing
            q = a.malloc(32 * MiB)  # the ended stream's segment serves the default stream
            self.assertEqual(q, p)
            self.assertEqual(a.stats()["reserved_bytes"]["current"], reserved)
            a.free(q, 32 * MiB)
        with self.assertRaises(fragctl.FragctlError):
            a.stream_ending(stream)  # closed

    def test_report_and_release_cached(self):
        with fragctl.Allocator("caching", backend="sim", sim_capacity="1GiB") as a:
            p = a.malloc(32 * MiB)
            a.free(p, 32 * MiB)
            self.assertGreater(a.stats()["reserved_bytes"]["current"], 0)
            a.release_cached()
            self.assertEqual(a.stats()["reserved_bytes"]["current"], 0)
            with tempfile.TemporaryDirectory() as d:
                path = a.report(os.path.join(d, "r.json"))
                with open(path) as f:
                    doc = json.load(f)
            self.assertEqual(doc["allocators"][0]["allocator"], "caching")
            self.assertEqual(doc["reason"], "request")

    def test_pause_gives_memory_back_and_resume_restores_contents(self):
        import ctypes
        with fragctl.Allocator("arena", backend="sim", sim_capacity="256MiB", sim_backed=True) as a:
            p = a.malloc(8 * MiB)
            pattern = bytes(range(256)) * (8 * MiB // 256)
            ctypes.memmove(p, pattern, len(pattern))
            held = a.stats()["reserved_bytes"]["current"]
            self.assertGreaterEqual(held, 8 * MiB)
            self.assertFalse(a.paused)
            a.pause(keep="host")
            self.assertTrue(a.paused)
            self.assertEqual(a.stats()["reserved_bytes"]["current"], 0)
            # Not valid now (TooLateError), not a bad argument (ConfigurationError, before 2026-11-28).
            with self.assertRaises(fragctl.TooLateError) as paused:
                a.malloc(MiB)
            self.assertNotIsInstance(paused.exception, fragctl.ConfigurationError)
            with self.assertRaises(fragctl.FragctlError) as again:
                a.pause()
            self.assertEqual(again.exception.status, "FRAGCTL_ERROR_STATE")
            a.resume()
            self.assertFalse(a.paused)
            self.assertEqual(a.stats()["reserved_bytes"]["current"], held)
            self.assertEqual(ctypes.string_at(p, len(pattern)), pattern)
            a.free(p, 8 * MiB)
            with self.assertRaises(fragctl.FragctlError) as bad:
                a.pause(keep="disk")
            self.assertIn("keep", str(bad.exception))
        with fragctl.Allocator("caching", backend="sim") as c:
            with self.assertRaises(fragctl.FragctlError) as refused:
                c.pause()
            self.assertIn("arena", str(refused.exception))

    def test_export_and_import_a_block_through_the_c_api(self):
        # fragctl_export_block / fragctl_import_block as _capi declares them
        # (CUDA IPC's handles; on sim a token this process imports).
        import ctypes
        from fragctl import _capi
        lib = _capi.library()
        with fragctl.Allocator("arena", backend="sim", sim_capacity="256MiB", sim_backed=True) as a:
            p = a.malloc(3 * MiB)
            ctypes.memset(p, 0x5C, 3 * MiB)
            size, offset = ctypes.c_size_t(), ctypes.c_size_t()
            _capi.check(lib.fragctl_export_block(a._handle, p, 3 * MiB, None, 0, ctypes.byref(size),
                                                 ctypes.byref(offset)))
            handle = ctypes.create_string_buffer(size.value)
            _capi.check(lib.fragctl_export_block(a._handle, p, 3 * MiB, handle, size.value, ctypes.byref(size),
                                                 ctypes.byref(offset)))
            self.assertEqual(handle.raw[:2], b"\x02F")
            base = ctypes.c_void_p()
            _capi.check(lib.fragctl_import_block(a._handle, handle, size.value, ctypes.byref(base)))
            view = base.value + offset.value
            self.assertNotEqual(view, p)
            self.assertEqual(ctypes.string_at(view + 3 * MiB - 16, 16), b"\x5c" * 16)
            _capi.check(lib.fragctl_close_block(a._handle, base))
            a.free(p, 3 * MiB)

    def test_closed_allocator_refuses_calls(self):
        a = fragctl.Allocator("caching", backend="sim")
        a.close()
        a.close()
        with self.assertRaises(fragctl.FragctlError):
            a.malloc(1)

    def test_library_facts(self):
        self.assertTrue(os.path.isabs(fragctl.library_path()))
        self.assertEqual(set(fragctl.policies()), {"caching", "arena", "buckets", "warmup"})
        self.assertRegex(fragctl.version(), r"^\d+\.\d+\.\d+$")


class DefaultsTest(unittest.TestCase):
    def test_pytorch_conf_is_announced_once_and_true(self):
        # Issue 28: the mapping line came once per allocator and named the
        # arena when the program built caching.
        environment = {k: v for k, v in os.environ.items() if k not in ("FRAGCTL_CONF", "FRAGCTL_POLICY")}
        environment.update(PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True", FRAGCTL_BACKEND="sim",
                           PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(fragctl.__file__))))
        # What enable("caching") does: an allocator of its own, then the
        # process defaults configured and built.
        code = ("import fragctl\n"
                "a = fragctl.Allocator(None, backend='sim', sim_capacity='1GiB')\n"
                "fragctl.configure(policy='caching', backend='sim')\n"
                "print(a.policy, fragctl.default_allocator(0).policy)\n")
        done = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True,
                              timeout=60)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout.split(), ["arena", "caching"])
        lines = [l for l in done.stderr.splitlines() if "PYTORCH_CUDA_ALLOC_CONF" in l]
        self.assertEqual(len(lines), 1, done.stderr)
        self.assertIn("policy arena where the program names none", lines[0])

    def test_sigusr1_before_the_first_allocator_is_harmless(self):
        # Regression (issue 18): with FRAGCTL_REPORT set, SIGUSR1 sent before
        # the first allocation ended the process.
        report = os.path.join(tempfile.mkdtemp(), "report.json")
        out = run_child("""
            import os, signal, fragctl
            fragctl.version()  # loads the library
            os.kill(os.getpid(), signal.SIGUSR1)  # delivered before kill returns
            print("alive")
        """, FRAGCTL_REPORT=report, FRAGCTL_BACKEND="sim")
        self.assertIn("alive", out)

    def test_flush_before_os_exit_keeps_every_trace_row_of_every_device(self):
        # Issue 16 item 4: a short run recorded only the trace's header, and
        # os._exit skips the exit hook; two devices' allocators share the path.
        directory = tempfile.mkdtemp()
        trace = os.path.join(directory, "trace.%p.csv")
        report = os.path.join(directory, "report.%p.json")
        for flush in (True, False):
            out = run_child("""
                import os, random, fragctl
                fragctl.configure("caching", backend="sim", sim_capacity="1GiB")
                rng = random.Random(7)
                for device in (0, 1):
                    a = fragctl.default_allocator(device)
                    live = []
                    for _ in range(1500):
                        if live and rng.random() < 0.45:
                            a.free(*live.pop(rng.randrange(len(live))))
                        else:
                            n = rng.randrange(1, 1 << 20)
                            live.append((a.malloc(n), n))
                print("pid:", os.getpid(), flush=True)
            """, "fragctl.flush()\n" if flush else "", "os._exit(0)\n", FRAGCTL_TRACE=trace, FRAGCTL_REPORT=report)
            pid = int(out.split("pid:")[1].split()[0])
            with open(trace.replace("%p", str(pid))) as f:
                rows = f.read().splitlines()
            allocs = sum(1 for r in rows if r.startswith("alloc,"))
            if not flush:  # positive control: without the flush the rows are lost
                # (the header and the comment after it remain: the trace reads as cut)
                self.assertEqual([r for r in rows if not r.startswith("#")], ["action,addr,size,stream,time_us"])
                continue
            with open(report.replace("%p", str(pid))) as f:
                doc = json.load(f)
            self.assertEqual(sorted(x["device"] for x in doc["allocators"]), [0, 1])
            self.assertEqual(allocs, sum(x["allocations"] for x in doc["allocators"]))
            self.assertEqual(sum(1 for r in rows if r.startswith("free_requested,")),
                             sum(x["frees"] for x in doc["allocators"]))

    def test_configure_stats_report_and_summary(self):
        out = run_child("""
            import io, json, os, tempfile, fragctl
            try:
                fragctl.stats(0)
            except fragctl.FragctlError as e:
                print("before:", "no allocation" in str(e))
            fragctl.configure("buckets:caching", backend="sim", sim_capacity="2GiB")
            a = fragctl.default_allocator(0)
            b = fragctl.default_allocator(1)
            buffer = io.StringIO()
            with fragctl.summary("block", device=0, file=buffer) as s:
                blocks = [a.malloc(n) for n in (1000, 5 * 2**20, 300)]
                for p, n in zip(blocks, (1000, 5 * 2**20, 300)):
                    a.free(p, n)
            print("summary:", buffer.getvalue().strip())
            print("result:", json.dumps(s.result, sort_keys=True))
            b.malloc(4096)
            a.close()  # no effect on a process default
            print("stats:", fragctl.stats(0)["allocator"], fragctl.stats(1)["requested_bytes"]["current"])
            path = os.path.join(tempfile.mkdtemp(), "report.json")
            doc = json.load(open(fragctl.report(path)))
            print("report:", [x["device"] for x in doc["allocators"]])
            try:
                fragctl.configure("arena")
            except fragctl.TooLateError as e:
                print("late:", "before the first allocation" in str(e))
        """)
        self.assertIn("before: True", out)
        self.assertIn("stats: buckets:caching 4096", out)
        self.assertIn("report: [0, 1]", out)
        self.assertIn("late: True", out)
        summary_line = [line for line in out.splitlines() if line.startswith("summary:")][0]
        self.assertIn("fragctl block [buckets:caching, sim:0]", summary_line)
        self.assertIn("3 allocations, 3 frees", summary_line)
        result = json.loads(out.split("result:", 1)[1].splitlines()[0])
        self.assertEqual(result["allocations"], 3)
        self.assertEqual(result["peak_requested_bytes"], 1000 + 5 * MiB + 300)

    def test_environment_configures_defaults(self):
        out = run_child("""
            import fragctl
            a = fragctl.default_allocator(0)
            print("policy:", a.policy)
        """, FRAGCTL_POLICY="warmup:caching", FRAGCTL_BACKEND="sim", FRAGCTL_CONF="warmup_bytes:64MiB")
        self.assertIn("policy: warmup:caching", out)

    def test_summary_as_a_decorator_without_allocations(self):
        out = run_child("""
            import io, fragctl
            buffer = io.StringIO()
            @fragctl.summary("idle", file=buffer)
            def idle():
                return 42
            print(idle(), buffer.getvalue().strip())
        """)
        self.assertIn("42 fragctl idle: nothing was allocated through fragctl", out)


    def test_summary_of_a_recursive_function_counts_each_call(self):
        # Regression (red team): one summary object entered again before it
        # exited (recursion, threads) kept one start: every call reported the
        # innermost call's figures (1 allocation each).
        out = run_child("""
            import io, fragctl
            fragctl.configure("caching", backend="sim", sim_capacity="1GiB")
            a = fragctl.default_allocator(0)
            buffer = io.StringIO()
            @fragctl.summary("f", device=0, file=buffer)
            def f(depth):
                a.free(a.malloc(4096), 4096)
                if depth:
                    f(depth - 1)
            f(2)
            for line in buffer.getvalue().splitlines():
                print(line.split("in the block: ")[1].split(",")[0])
        """)
        self.assertEqual(out.split(), ["1", "allocations", "2", "allocations", "3", "allocations"])

    def test_flush_names_the_output_it_could_not_write(self):
        # Regression (red team): fragctl_flush returned IO without a message,
        # so flush() raised with an earlier, unrelated error (or "").
        out = run_child("""
            import fragctl
            a = fragctl.default_allocator(0)
            a.free(a.malloc(4096), 4096)
            try:
                a.free(12345, 8)  # an unrelated earlier error on this thread
            except fragctl.FragctlError:
                pass
            try:
                fragctl.flush()
                print("no error")
            except fragctl.FragctlError as e:
                print("flush:", str(e))
        """, FRAGCTL_BACKEND="sim", FRAGCTL_REPORT="/dev/full")
        self.assertIn("flush: fragctl_flush: 1 output(s) not written", out)
        self.assertIn("/dev/full", out)
        self.assertIn("No space left on device", out)
        self.assertNotIn("not a live block", out)

    def test_a_library_that_is_not_libfragctl_is_reported_at_first_use(self):
        # Regression (red team): FRAGCTL_LIBRARY at another library raised a
        # raw AttributeError, at `import fragctl` itself when an output
        # variable was set.
        import ctypes.util
        libc = ctypes.util.find_library("c") or "libc.so.6"
        out = run_child("""
            import fragctl
            print("imported")
            try:
                fragctl.version()
            except fragctl.LibraryNotFoundError as e:
                print("first use:", "not a libfragctl of this version" in str(e))
        """, FRAGCTL_LIBRARY=libc, FRAGCTL_REPORT="/tmp/fragctl-never-written.json")
        self.assertEqual(out.split("\n")[:2], ["imported", "first use: True"])


class TorchTest(unittest.TestCase):
    def test_without_torch_the_error_says_what_is_missing(self):
        out = run_child("""
            import sys
            sys.modules["torch"] = None  # makes `import torch` fail
            import fragctl.torch
            try:
                fragctl.torch.enable("arena")
            except ImportError as e:
                print("error:", e)
        """)
        self.assertIn("error: fragctl.torch needs PyTorch", out)

    # A stand-in for the parts of torch that enable() uses.
    FAKE_TORCH = """
        import sys, types
        calls = []
        torch = types.ModuleType("torch")
        torch.__version__ = "2.11.0+fake"
        torch.cuda = types.SimpleNamespace(initialized=False)
        torch.cuda.is_initialized = lambda: torch.cuda.initialized
        class CUDAPluggableAllocator:
            def __init__(self, path, alloc, free):
                calls.append(("allocator", path, alloc, free))
        def change_current_allocator(a):
            if torch.cuda.initialized:
                raise RuntimeError("Can't swap an already initialized allocator")
            calls.append(("swap",))
        torch.cuda.memory = types.SimpleNamespace(CUDAPluggableAllocator=CUDAPluggableAllocator,
                                                  change_current_allocator=change_current_allocator)
        sys.modules["torch"] = torch
        import fragctl, fragctl.torch
    """

    def test_enable_installs_the_pluggable_allocator(self):
        out = run_child(self.FAKE_TORCH, """
            fragctl.torch.enable("buckets:caching", backend="sim", sim_capacity="1GiB", release_threshold="0")
            print("calls:", calls)
            print("path ok:", calls[0][1] == fragctl.library_path())
            print("enabled:", fragctl.torch.enabled())
            fragctl.torch.enable("buckets:caching")  # again: nothing
            try:
                fragctl.torch.enable("arena")
            except fragctl.TooLateError as e:
                print("other policy:", e)
            # What PyTorch would call, through the library the allocator names.
            import ctypes
            lib = ctypes.CDLL(calls[0][1])
            lib.fragctl_torch_alloc.restype = ctypes.c_void_p
            lib.fragctl_torch_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
            lib.fragctl_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
            p = lib.fragctl_torch_alloc(1 << 20, 0, None)
            print("live:", fragctl.stats(0)["requested_bytes"]["current"], fragctl.stats(0)["allocator"])
            lib.fragctl_torch_free(p, 1 << 20, 0, None)
            print("after:", fragctl.stats(0)["requested_bytes"]["current"])
        """)
        self.assertIn("calls: [('allocator',", out)
        self.assertIn("'fragctl_torch_alloc', 'fragctl_torch_free'), ('swap',)]", out)
        self.assertIn("path ok: True", out)
        self.assertIn("enabled: buckets:caching", out)
        self.assertIn("other policy: fragctl.torch.enable('arena'): fragctl is already enabled", out)
        self.assertIn("live: 1048576 buckets:caching", out)
        self.assertIn("after: 0", out)

    def test_enable_names_the_torch_version_a_route_needs(self):
        # Issue 28: torch 1.13 gave AttributeError, route='native' "list
        # index out of range".
        out = run_child(self.FAKE_TORCH, """
            torch.__version__ = "1.13.1"
            for route in ("auto", "native", "pluggable"):
                try:
                    fragctl.torch.enable("arena", backend="sim", route=route)
                except fragctl.FragctlError as e:
                    print("old", route, type(e).__name__, e)
            torch.__version__ = "2.5.1+cu124"
            try:
                fragctl.torch.enable("arena", backend="sim", route="native")
            except fragctl.FragctlError as e:
                print("native", e)
            print("calls:", calls)
        """)
        for route in ("auto", "native", "pluggable"):
            self.assertIn("old %s FragctlError" % route, out)
        self.assertIn("needs torch >= 2.0, and this is torch 1.13.1", out)
        self.assertIn("native fragctl.torch.enable(route='native'): the native route needs torch >= 2.11, "
                      "and this is torch 2.5.1+cu124", out)
        self.assertIn("calls: []", out)

    def test_auto_on_a_torch_older_than_native_takes_pluggable_and_says_why(self):
        environment = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(fragctl.__file__))))
        code = textwrap.dedent(self.FAKE_TORCH) + textwrap.dedent("""
            torch.__version__ = "2.5.1"
            fragctl.torch.enable("caching", backend="sim", sim_capacity="1GiB")
            print("route:", fragctl.torch.route())
        """)
        done = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True,
                              timeout=60)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("route: pluggable", done.stdout)
        self.assertIn("the native route needs torch >= 2.11, and this is torch 2.5.1", done.stderr)

    def test_enable_after_cuda_initialization_is_a_clear_error(self):
        out = run_child(self.FAKE_TORCH, """
            torch.cuda.initialized = True
            try:
                fragctl.torch.enable("arena", backend="sim")
            except fragctl.TooLateError as e:
                print("error:", e)
            print("calls:", calls)
        """)
        self.assertIn("error: fragctl.torch.enable() must run before PyTorch initializes CUDA", out)
        self.assertIn("calls: []", out)

    def test_enable_rejects_bad_options_before_touching_torch(self):
        out = run_child(self.FAKE_TORCH, """
            try:
                fragctl.torch.enable("arena", backend="sim", release_treshold="1GiB")
            except fragctl.ConfigurationError as e:
                print("error:", e)
            print("calls:", calls)
        """)
        self.assertIn('unknown key "release_treshold"', out)
        self.assertIn("calls: []", out)


if __name__ == "__main__":
    unittest.main()
