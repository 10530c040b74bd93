"""The GPU run scripts (tools/gpu) without a GPU: each is run from a copy of
its folder whose tools/gpu/trainers_setup.sh is a stand-in, so what the
script does around the setup (what it tells when the setup fails, the order
of its processes) is checked here; the setup itself runs only on a GPU host.
"""
import os
import shutil
import stat
import subprocess
import tempfile
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

# A setup that fails as trainers_setup.sh does on a failed build: its
# message goes where the caller sends its output, then it exits.
FAILING_SETUP = """\
echo "error: stand-in compile error"
echo "build failed; see build.log"
exit 1
"""

# A setup that succeeds: sets `out` and `python` as trainers_setup.sh does,
# `python` a stand-in that prints its arguments.
PASSING_SETUP = """\
out=${OUT:-gpu-results}
mkdir -p "$out"
out=$(cd "$out" && pwd)
python=$PWD/fake-python
echo "built"
"""


class CallCostScriptTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.root = self.dir.name
        os.makedirs(os.path.join(self.root, "tools", "gpu"))
        shutil.copy(os.path.join(ROOT, "tools", "gpu", "call_cost.sh"), os.path.join(self.root, "tools", "gpu"))
        fake = os.path.join(self.root, "fake-python")
        with open(fake, "w", encoding="utf-8") as f:
            f.write('#!/bin/sh\necho "python $*"\n')
        os.chmod(fake, os.stat(fake).st_mode | stat.S_IXUSR)

    def tearDown(self):
        self.dir.cleanup()

    def run_script(self, setup):
        with open(os.path.join(self.root, "tools", "gpu", "trainers_setup.sh"), "w", encoding="utf-8") as f:
            f.write(setup)
        env = dict(os.environ, OUT=os.path.join(self.root, "out"))
        return subprocess.run(["bash", "tools/gpu/call_cost.sh"], cwd=self.root, env=env, capture_output=True,
                              text=True, timeout=60, check=False)

    def test_a_failed_setup_is_told_not_only_logged(self):
        # The setup exits the sourcing shell, so a handler after `source ... ||`
        # never ran: the run ended with status 1 and not a word on the console.
        r = self.run_script(FAILING_SETUP)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("build failed; see build.log", r.stdout + r.stderr)
        with open(os.path.join(self.root, "out", "call_cost-setup.log"), encoding="utf-8") as f:
            self.assertIn("stand-in compile error", f.read())

    def test_three_rounds_alternate_the_modes(self):
        r = self.run_script(PASSING_SETUP)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        modes = [line.split("--mode ")[1].split()[0] for line in r.stdout.splitlines() if "call_cost.py" in line]
        self.assertEqual(modes, ["native", "expandable", "arena", "arena", "expandable", "native",
                                 "native", "expandable", "arena"])


if __name__ == "__main__":
    unittest.main()
