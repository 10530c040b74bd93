"""`pip install ./python` works offline (the in-tree build backend needs
nothing), and the installed package finds and uses libfragctl.so."""
import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class PipInstallTest(unittest.TestCase):
    def test_install_into_a_directory_and_import(self):
        with tempfile.TemporaryDirectory() as target:
            done = subprocess.run(
                [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-cache-dir",
                 "--disable-pip-version-check", "--quiet", "--target", target, os.path.join(REPO, "python")],
                capture_output=True, text=True, timeout=120)
            self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
            self.assertTrue(os.path.exists(os.path.join(target, "fragctl", "_location.py")))
            env = dict(os.environ, PYTHONPATH=target)
            code = ("import fragctl, fragctl._location as l; "
                    "print(fragctl.__file__.startswith(%r), l.source_tree == %r, fragctl.Allocator('caching', "
                    "backend='sim').policy)" % (target, REPO))
            done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                  cwd=target, timeout=60)
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertEqual(done.stdout.split(), ["True", "True", "caching"])


if __name__ == "__main__":
    unittest.main()
