"""`pip install ./python` into a fresh venv, offline, as docs/packaging.md says:
the wheel carries libfragctl.so and the fragctl command from fragctl's CMake
build, names no checkout path, and the installed package finds its own
library without FRAGCTL_LIBRARY.

Uses the wheel's build directory, already built by tools/test.sh
(FRAGCTL_TEST_WHEEL_BUILD_DIR), through `--config-settings build-dir=` with a
path relative to the checkout, as the docs write it (pip 23.0, Debian's,
has no -C)."""
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import venv

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("FRAGCTL_TEST_WHEEL_BUILD_DIR", "")
if not os.path.exists(os.path.join(BUILD, "CMakeCache.txt")):
    BUILD = ""
TRACE = os.path.join(REPO, "benchmarks", "traces", "sample.trace.csv.gz")


def fresh_venv():
    """A temporary folder holding a venv with pip (skips the test without one): (folder, venv path)."""
    tmp = tempfile.TemporaryDirectory()
    path = os.path.join(tmp.name, "venv")
    try:
        venv.create(path, with_pip=True)
    except Exception as e:  # Debian's python3 without python3-venv
        tmp.cleanup()
        raise unittest.SkipTest("cannot create a venv with pip (install python3-venv): %s" % e)
    return tmp, path


@unittest.skipUnless(BUILD, "no wheel build directory (FRAGCTL_TEST_WHEEL_BUILD_DIR): tools/test.sh makes one")
class PipInstallTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp, cls.venv = fresh_venv()
        cls.python = os.path.join(cls.venv, "bin", "python")
        cls.install = subprocess.run(
            [cls.python, "-m", "pip", "install", "--no-index", "--no-build-isolation", "--no-cache-dir",
             "--disable-pip-version-check", "--quiet", "--config-settings",
             "build-dir=" + os.path.relpath(BUILD, REPO), os.path.join(REPO, "python")],
            capture_output=True, text=True, timeout=600)
        # Run as a user would: elsewhere, without the suite's FRAGCTL_LIBRARY or PYTHONPATH.
        cls.env = {k: v for k, v in os.environ.items() if k not in ("FRAGCTL_LIBRARY", "PYTHONPATH")}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_in_venv(self, *args):
        return subprocess.run(list(args), env=self.env, cwd=self.tmp.name, capture_output=True, text=True,
                              timeout=120)

    def package_dir(self):
        found = glob.glob(os.path.join(self.venv, "lib", "python*", "site-packages", "fragctl"))
        self.assertEqual(len(found), 1, found)
        return found[0]

    def test_installs(self):
        self.assertEqual(self.install.returncode, 0, self.install.stdout + self.install.stderr)

    def test_finds_its_own_library_and_works(self):
        self.assertEqual(self.install.returncode, 0, self.install.stderr)
        code = ("import fragctl; a = fragctl.Allocator('caching', backend='sim', sim_capacity='1GiB'); "
                "p = a.malloc(1 << 20); a.free(p, 1 << 20); "
                "print(fragctl.library_path()); print(a.policy, a.stats()['requested_bytes']['peak']); "
                "print(fragctl.__version__ == fragctl.version(), fragctl.__version__)")
        done = self.run_in_venv(self.python, "-c", code)
        self.assertEqual(done.returncode, 0, done.stderr)
        lines = done.stdout.splitlines()
        self.assertEqual(lines[0], os.path.realpath(os.path.join(self.package_dir(), "lib", "libfragctl.so")))
        self.assertEqual(lines[1], "caching 1048576")
        self.assertTrue(lines[2].startswith("True "), lines[2])

    def test_relocatable_typed_and_licensed(self):
        self.assertEqual(self.install.returncode, 0, self.install.stderr)
        package = self.package_dir()
        self.assertFalse(os.path.exists(os.path.join(package, "_location.py")))
        self.assertTrue(os.path.exists(os.path.join(package, "py.typed")))
        for path in glob.glob(os.path.join(package, "*.py")):
            with open(path, encoding="utf-8") as f:
                self.assertNotIn(REPO, f.read(), path)
        dist_info = glob.glob(os.path.join(os.path.dirname(package), "fragctl-*.dist-info"))
        self.assertEqual(len(dist_info), 1, dist_info)
        self.assertTrue(os.path.exists(os.path.join(dist_info[0], "LICENSE")))
        with open(os.path.join(dist_info[0], "METADATA"), encoding="utf-8") as f:
            self.assertIn("License: Apache-2.0", f.read().splitlines())

    def test_carries_the_header_the_native_torch_route_compiles_against(self):
        self.assertEqual(self.install.returncode, 0, self.install.stderr)
        header = os.path.join(self.package_dir(), "include", "fragctl", "fragctl.h")
        with open(header, "rb") as copy, open(os.path.join(REPO, "include", "fragctl", "fragctl.h"), "rb") as source:
            self.assertEqual(copy.read(), source.read())
        # The native route finds the package's copy first, not the checkout's.
        done = self.run_in_venv(self.python, "-c", "from fragctl._native import _include_dirs; print(_include_dirs()[0])")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(os.path.realpath(done.stdout.strip()), os.path.realpath(os.path.dirname(os.path.dirname(header))))

    def test_python_m_fragctl_runs_the_cli(self):
        self.assertEqual(self.install.returncode, 0, self.install.stderr)
        done = self.run_in_venv(self.python, "-m", "fragctl", "--help")
        self.assertEqual(done.returncode, 0, done.stderr)
        for command in ("replay", "report", "info"):
            self.assertIn("  " + command + " ", done.stdout)
        done = self.run_in_venv(self.python, "-m", "fragctl", "info", TRACE)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("sample.trace.csv.gz", done.stdout)
        done = self.run_in_venv(os.path.join(self.venv, "bin", "fragctl"), "policies")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("arena", done.stdout)
        done = self.run_in_venv(self.python, "-m", "fragctl", "no-such-command")
        self.assertEqual(done.returncode, 2, done.stdout + done.stderr)


# A cmake installed with pip into the user's venv, as beside many torch
# installs: a Python script that imports its package from the venv's
# site-packages and runs the real cmake (here the one the suite found).
FAKE_CMAKE_PACKAGE = """import os, sys
def main():
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "pip_cmake_calls.log"), "a") as log:
        log.write(" ".join(sys.argv[1:]) + "\\n")
    os.execv(%r, [%r] + sys.argv[1:])
"""
FAKE_CMAKE_SCRIPT = """#!%s
import sys
from pip_cmake import main
sys.exit(main())
"""


@unittest.skipUnless(BUILD, "no wheel build directory (FRAGCTL_TEST_WHEEL_BUILD_DIR): tools/test.sh makes one")
class PipInstallIsolatedTest(unittest.TestCase):
    """`pip install ./python` as pip runs it by default, in an isolated build
    environment, with the venv's first cmake one installed by pip: pip's
    isolation takes site-packages away from every Python it starts, so that
    cmake cannot import itself unless the backend runs it without pip's
    PYTHONPATH (it failed so on the GPU machine's torch venv)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp, cls.venv = fresh_venv()
        real_cmake = shutil.which("cmake")
        if real_cmake is None:
            raise unittest.SkipTest("no cmake on the PATH")
        cls.python = os.path.join(cls.venv, "bin", "python")
        site_packages = glob.glob(os.path.join(cls.venv, "lib", "python*", "site-packages"))[0]
        with open(os.path.join(site_packages, "pip_cmake.py"), "w", encoding="utf-8") as f:
            f.write(FAKE_CMAKE_PACKAGE % (real_cmake, real_cmake))
        script = os.path.join(cls.venv, "bin", "cmake")
        with open(script, "w", encoding="utf-8") as f:
            f.write(FAKE_CMAKE_SCRIPT % cls.python)
        os.chmod(script, 0o755)
        cls.calls = os.path.join(site_packages, "pip_cmake_calls.log")
        env = {k: v for k, v in os.environ.items() if k not in ("FRAGCTL_LIBRARY", "PYTHONPATH")}
        env["PATH"] = os.path.join(cls.venv, "bin") + os.pathsep + env.get("PATH", "")
        cls.install = subprocess.run(
            [cls.python, "-m", "pip", "install", "--no-index", "--no-cache-dir", "--disable-pip-version-check",
             "--quiet", "--config-settings", "build-dir=" + os.path.relpath(BUILD, REPO),
             os.path.join(REPO, "python")],
            env=env, capture_output=True, text=True, timeout=600)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_installs_with_the_venvs_pip_cmake(self):
        self.assertEqual(self.install.returncode, 0, self.install.stdout + self.install.stderr)
        # The venv's cmake built it (the build and the install, at least).
        with open(self.calls, encoding="utf-8") as f:
            calls = f.read().splitlines()
        self.assertTrue(any(c.startswith("--build ") for c in calls), calls)
        self.assertTrue(any(c.startswith("--install ") for c in calls), calls)
        done = subprocess.run([self.python, "-c", "import fragctl; print(fragctl.library_path())"],
                              cwd=self.tmp.name, capture_output=True, text=True, timeout=120,
                              env={k: v for k, v in os.environ.items() if k not in ("FRAGCTL_LIBRARY", "PYTHONPATH")})
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertTrue(done.stdout.strip().startswith(os.path.realpath(self.venv)), done.stdout)

    def test_the_venvs_cmake_cannot_import_itself_under_pips_isolation(self):
        # The positive control: the fake cmake fails as pip's does when a
        # sitecustomize like pip's takes site-packages off sys.path.
        hide = os.path.join(self.tmp.name, "hide")
        os.makedirs(hide, exist_ok=True)
        with open(os.path.join(hide, "sitecustomize.py"), "w", encoding="utf-8") as f:
            f.write("import sys\nsys.path[:] = [p for p in sys.path if 'site-packages' not in p]\n")
        env = dict(os.environ, PYTHONPATH=hide)
        done = subprocess.run([os.path.join(self.venv, "bin", "cmake"), "--version"], env=env,
                              capture_output=True, text=True, timeout=60)
        self.assertNotEqual(done.returncode, 0, done.stdout)
        self.assertIn("No module named 'pip_cmake'", done.stderr)


if __name__ == "__main__":
    unittest.main()
