"""The wheel a user installs (docs/packaging.md), as built by tools/wheel.sh.

* Every ELF file in it needs only the system libraries a manylinux wheel may
  assume, or files of the wheel found through $ORIGIN run paths (read here
  with readelf, independently of the build backend's own check); Abseil's
  libraries are inside it, renamed.
* Its platform tag states the glibc floor its binaries really need.
* Installed with ``pip install --no-index --no-deps`` into a fresh venv, as
  on a GPU machine: ``python -m fragctl --version``, the ``fragctl``
  command, ``fragctl run`` (report written, exit status and signals passed
  through) and ``fragctl.preload_library()``.
* ``import torch`` then ``import fragctl``, and the reverse, both allocate
  (Debian's torch, through a venv that sees the system's packages).

The wheel is looked for in FRAGCTL_TEST_WHEEL_DIR (CTest sets it to the
build's wheel/ folder, which tools/test.sh fills).
"""
import glob
import json
import os
import re
import signal
import subprocess
import tempfile
import unittest
import venv
import zipfile

WHEEL_DIR = os.environ.get("FRAGCTL_TEST_WHEEL_DIR", "")
WHEELS = sorted(glob.glob(os.path.join(WHEEL_DIR, "fragctl-*.whl"))) if WHEEL_DIR else []
SYSTEM = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libgcc_s.so.1",
          "libstdc++.so.6", "libz.so.1", "ld-linux-x86-64.so.2"}
TORCH_PYTHON = "/usr/bin/python3"
SIM = ["--backend", "sim", "--policy", "caching", "--conf", "sim_capacity:1GiB,sim_backed:true"]


def readelf(flag, path):
    return subprocess.run(["readelf", flag, "-W", path], capture_output=True, text=True, check=True).stdout


@unittest.skipUnless(WHEELS, "no wheel in FRAGCTL_TEST_WHEEL_DIR=%r: build one with tools/wheel.sh "
                             "(tools/test.sh does)" % WHEEL_DIR)
class WheelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.wheel = WHEELS[-1]
        cls.tmp = tempfile.TemporaryDirectory()
        cls.unpacked = os.path.join(cls.tmp.name, "unpacked")
        with zipfile.ZipFile(cls.wheel) as z:
            z.extractall(cls.unpacked)
            cls.names = z.namelist()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def elves(self):
        found = []
        for name in self.names:
            path = os.path.join(self.unpacked, name)
            with open(path, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    found.append((name, path))
        return found

    def test_carries_everything_a_user_runs(self):
        for name in ["fragctl/lib/libfragctl.so", "fragctl/lib/libfragctl_preload.so",
                     "fragctl/lib/libfragctl_jemalloc.so", "fragctl/bin/fragctl", "fragctl/include/fragctl/fragctl.h",
                     "fragctl/_native/torch_allocator.cpp", "fragctl/_native/c_api.cpp",
                     "fragctl/_native/c_api.hpp", "fragctl/_native/graph_pools.cpp",
                     "fragctl/_native/graph_pools.hpp", "fragctl/_native/device_stats.cpp",
                     "fragctl/_native/device_stats.hpp", "fragctl/_native/history.cpp",
                     "fragctl/_native/history.hpp", "fragctl/torch/__init__.py"]:
            self.assertIn(name, self.names)

    def test_every_elf_needs_only_the_system_and_its_own_files(self):
        elves = self.elves()
        self.assertGreaterEqual(len(elves), 4, elves)
        own = {os.path.basename(name): os.path.dirname(name) for name, _ in elves}
        for name, path in elves:
            dynamic = readelf("-d", path)
            needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", dynamic)
            runpaths = re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*)\]", dynamic)
            searched = {os.path.normpath(os.path.join(os.path.dirname(name), entry.replace("$ORIGIN", ".")))
                        for r in runpaths for entry in r.split(":")}
            for entry in (e for r in runpaths for e in r.split(":")):
                self.assertTrue(entry.startswith("$ORIGIN"), "%s: run path %r outside the wheel" % (name, entry))
            for library in needed:
                if library in SYSTEM:
                    continue
                self.assertIn(library, own, "%s needs %s, which is neither a system library nor in the wheel"
                              % (name, library))
                self.assertIn(own[library], searched, "%s needs %s but its run paths %s do not reach %s"
                              % (name, library, runpaths, own[library]))

    def test_fragctl_exports_no_third_party_symbol(self):
        # spdlog, fmt, nlohmann and jemalloc are compiled into fragctl's own
        # libraries; none of their names may leave them (PyTorch has its own
        # fmt). Abseil is carried as its own, renamed, libraries.
        for name, path in self.elves():
            if not os.path.basename(name).startswith("libfragctl"):
                continue
            symbols = readelf("--dyn-syms", path)
            exported = [line.split()[-1] for line in symbols.splitlines()
                        if re.search(r"\b(FUNC|OBJECT)\s+(GLOBAL|WEAK)\s+DEFAULT\s+\d+", line)]
            foreign = [s for s in exported if re.match(r"_ZN(K)?\d*(4absl|3fmt|6spdlog|8nlohmann)", s)
                       or s.startswith(("je_", "mallocx", "mallctl"))]
            self.assertEqual(foreign, [], "%s exports third-party symbols" % name)

    def test_platform_tag_states_the_glibc_floor(self):
        tag = re.search(r"-py3-none-manylinux_2_(\d+)_x86_64\.whl$", os.path.basename(self.wheel))
        self.assertIsNotNone(tag, self.wheel)
        floor = max(int(v) for _, path in self.elves()
                    for v in re.findall(r"Name: GLIBC_2\.(\d+)", readelf("-V", path)))
        self.assertEqual(int(tag.group(1)), floor)

    def test_metadata_names_the_license_and_torch(self):
        metadata = [n for n in self.names if n.endswith(".dist-info/METADATA")]
        self.assertEqual(len(metadata), 1)
        with open(os.path.join(self.unpacked, metadata[0]), encoding="utf-8") as f:
            text = f.read()
        self.assertIn("License: Apache-2.0", text)
        self.assertRegex(text, r'Requires-Dist: torch>=2\.\d+; extra == "torch"')


@unittest.skipUnless(WHEELS, "no wheel in FRAGCTL_TEST_WHEEL_DIR=%r: build one with tools/wheel.sh" % WHEEL_DIR)
class InstalledWheelTest(unittest.TestCase):
    """pip install of the wheel file alone, into a fresh venv."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.venv = os.path.join(cls.tmp.name, "venv")
        try:
            venv.create(cls.venv, with_pip=True)
        except Exception as e:  # a python3 without ensurepip
            raise unittest.SkipTest("cannot create a venv with pip (install python3-venv): %s" % e)
        cls.python = os.path.join(cls.venv, "bin", "python")
        cls.bin = os.path.join(cls.venv, "bin")
        install = subprocess.run([cls.python, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet",
                                  "--disable-pip-version-check", WHEELS[-1]], capture_output=True, text=True,
                                 timeout=300)
        if install.returncode != 0:
            raise AssertionError("pip install of %s failed:\n%s%s" % (WHEELS[-1], install.stdout, install.stderr))
        cls.env = {k: v for k, v in os.environ.items()
                   if k not in ("FRAGCTL_LIBRARY", "PYTHONPATH", "LD_PRELOAD") and not k.startswith("FRAGCTL_")}
        cls.env["PATH"] = cls.bin + os.pathsep + cls.env.get("PATH", "")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_here(self, *args, timeout=120):
        return subprocess.run(list(args), env=self.env, cwd=self.tmp.name, capture_output=True, text=True,
                              timeout=timeout)

    def test_version_from_python_and_the_command(self):
        module = self.run_here(self.python, "-m", "fragctl", "--version")
        command = self.run_here(os.path.join(self.bin, "fragctl"), "--version")
        self.assertEqual(module.returncode, 0, module.stderr)
        self.assertEqual(command.returncode, 0, command.stderr)
        self.assertRegex(module.stdout, r"^fragctl \d+\.\d+\.\d+")
        self.assertEqual(module.stdout, command.stdout)

    def test_preload_library_is_the_wheels(self):
        done = self.run_here(self.python, "-c", "import fragctl; print(fragctl.preload_library())")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertTrue(done.stdout.strip().startswith(self.venv), done.stdout)
        self.assertTrue(done.stdout.strip().endswith("/fragctl/lib/libfragctl_preload.so"), done.stdout)

    def test_fragctl_run_preloads_the_shim_and_writes_the_report(self):
        report = os.path.join(self.tmp.name, "run.report.json")
        # Inside the child: the shim is preloaded, and the package uses the
        # libfragctl it loaded, so the process-default allocator's report is
        # the one FRAGCTL_REPORT names.
        code = ("import os, fragctl; "
                "assert 'libfragctl_preload.so' in os.environ['LD_PRELOAD'], os.environ['LD_PRELOAD']; "
                "assert os.environ['PYTORCH_CUDA_ALLOC_CONF'] == 'backend:cudaMallocAsync'; "
                "a = fragctl.default_allocator(0); p = a.malloc(3 << 20); print(fragctl.library_path()); "
                "raise SystemExit(3)")
        done = self.run_here("fragctl", "run", *SIM, "--report", report, "--", self.python, "-c", code)
        self.assertEqual(done.returncode, 3, done.stdout + done.stderr)
        self.assertIn("/fragctl/lib/libfragctl.so", done.stdout)
        self.assertIn("fragctl run: report %s" % report, done.stderr)
        with open(report, encoding="utf-8") as f:
            text = f.read()
        self.assertIn("3145728", text)

    def test_fragctl_run_finds_a_report_named_relatively_or_with_placeholders(self):
        # Regression (red team, 2026-11-28): `fragctl run` said "no report at
        # ..." for a report it had written: a relative FRAGCTL_REPORT (its
        # directory read as "") and a name with "%p" or "{rank}" (matched
        # literally).
        code = "import fragctl; a = fragctl.default_allocator(0); p = a.malloc(1 << 20)"
        for name, extra in (("relative.json", {"FRAGCTL_REPORT": "relative.json"}),
                            ("placeholder.%p.json", {}), ("ranked.{rank}.json", {"RANK": "7"})):
            report = os.path.join(self.tmp.name, name)
            env = dict(self.env, **extra)
            options = [] if "FRAGCTL_REPORT" in extra else ["--report", name]
            done = subprocess.run(["fragctl", "run", *SIM, *options, "--", self.python, "-c", code], env=env,
                                  cwd=self.tmp.name, capture_output=True, text=True, timeout=120)
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertNotIn("no report at", done.stderr)
            written = re.search(r"fragctl run: report (\S+)", done.stderr)
            self.assertIsNotNone(written, done.stderr)
            expected = report.replace("%p", r"\d+").replace("{rank}", "7").replace(".", r"\.")
            self.assertRegex(written.group(1), "^" + expected + "$")
            self.assertTrue(os.path.isfile(written.group(1)))

    def test_fragctl_run_dies_of_the_programs_signal(self):
        done = self.run_here("fragctl", "run", *SIM, "--", self.python, "-c",
                             "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
        self.assertEqual(done.returncode, -signal.SIGTERM, done.stderr)

    def test_fragctl_run_passes_a_signal_on_to_the_program(self):
        marker = os.path.join(self.tmp.name, "got-usr2")
        code = ("import signal, time, sys; "
                "signal.signal(signal.SIGUSR2, lambda *a: (open(%r, 'w').write('yes'), sys.exit(0))); "
                "print('ready', flush=True); time.sleep(60); sys.exit(5)" % marker)
        proc = subprocess.Popen(["fragctl", "run", *SIM, "--", self.python, "-c", code], env=self.env,
                                cwd=self.tmp.name, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.assertEqual(proc.stdout.readline().strip(), "ready")
        proc.send_signal(signal.SIGUSR2)
        out, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 0, err)
        self.assertTrue(os.path.exists(marker))

    def host_provider(self, *launcher):
        """The offload store's pinned host tier provider, seen from Python."""
        code = ("import ctypes, json, fragctl; from fragctl import _capi; "
                "a = fragctl.Allocator('caching', backend='sim', sim_capacity='1GiB', sim_backed=True); "
                "lib = _capi.library(); store = ctypes.c_void_p(); "
                "_capi.check(a._call(lib.fragctl_checkpoint_create, 64 << 20, 2, 0, ctypes.byref(store))); "
                "text = ctypes.c_void_p(); "
                "_capi.check(lib.fragctl_checkpoint_stats_json(store, ctypes.byref(text))); "
                "print(json.dumps(json.loads(ctypes.string_at(text.value))))")
        done = self.run_here(*launcher, self.python, "-c", code)
        self.assertEqual(done.returncode, 0, done.stderr)
        return json.loads(done.stdout.splitlines()[-1])

    def test_fragctl_run_gives_python_the_jemalloc_host_tier(self):
        # Positive control: a plain Python process cannot load jemalloc late
        # (static TLS), so its store falls back to size classes.
        plain = self.host_provider()
        under_run = self.host_provider("fragctl", "run", *SIM, "--")
        self.assertIn("size_classes", json.dumps(plain))
        self.assertIn("jemalloc", json.dumps(under_run))

    def test_fragctl_run_refuses_a_bad_policy_before_starting(self):
        done = self.run_here("fragctl", "run", "--policy", "arean", "--", self.python, "-c", "print('started')")
        self.assertEqual(done.returncode, 2, done.stderr)
        self.assertNotIn("started", done.stdout)
        self.assertIn("arean", done.stderr)


@unittest.skipUnless(WHEELS and os.path.exists(TORCH_PYTHON), "needs a wheel and %s" % TORCH_PYTHON)
class ImportOrderTest(unittest.TestCase):
    """The wheel beside Debian's PyTorch (which links its own fmt): both
    import orders load and allocate."""

    @classmethod
    def setUpClass(cls):
        if subprocess.run([TORCH_PYTHON, "-c", "import torch"], capture_output=True).returncode != 0:
            raise unittest.SkipTest("%s cannot import torch (tools/install-deps.sh --torch)" % TORCH_PYTHON)
        cls.tmp = tempfile.TemporaryDirectory()
        target = os.path.join(cls.tmp.name, "site")
        # pip's --target, as a user without a venv would install it.
        pip = subprocess.run([TORCH_PYTHON, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet",
                              "--disable-pip-version-check", "--target", target, WHEELS[-1]],
                             capture_output=True, text=True, timeout=300)
        if pip.returncode != 0 and "No module named pip" in pip.stderr:
            raise unittest.SkipTest("%s has no pip (python3-pip)" % TORCH_PYTHON)
        if pip.returncode != 0:
            raise AssertionError(pip.stderr)
        cls.env = {k: v for k, v in os.environ.items() if k not in ("FRAGCTL_LIBRARY",) and
                   not k.startswith("FRAGCTL_")}
        cls.env["PYTHONPATH"] = target

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def allocate_after(self, first, second):
        code = ("import %s, %s, torch, fragctl; "
                "a = fragctl.Allocator('caching', backend='sim', sim_capacity='1GiB', sim_backed=True); "
                "p = a.malloc(1 << 20); a.free(p, 1 << 20); t = torch.ones(4); "
                "print(fragctl.library_path(), int(t.sum()), a.stats()['requested_bytes']['peak'])"
                % (first, second))
        done = subprocess.run([TORCH_PYTHON, "-c", code], env=self.env, capture_output=True, text=True, timeout=120)
        self.assertEqual(done.returncode, 0, done.stderr)
        path, ones, peak = done.stdout.split()
        self.assertTrue(path.startswith(self.env["PYTHONPATH"]), path)
        self.assertEqual((ones, peak), ("4", "1048576"))

    def test_torch_first(self):
        self.allocate_after("torch", "fragctl")

    def test_fragctl_first(self):
        self.allocate_after("fragctl", "torch")


if __name__ == "__main__":
    unittest.main()
