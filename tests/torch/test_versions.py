"""fragctl.torch.enable() on the installed torch: where that torch lacks what
a route needs (Debian's torch 1.13 has no CUDAPluggableAllocator), the error
names the version found and the minimum, never an AttributeError (issue 28)."""
import os
import subprocess
import sys
import unittest

from support import torch, SKIP


def _major_minor(version):
    return tuple(int("".join(c for c in part if c.isdigit()) or 0) for part in version.split("+")[0].split(".")[:2])


@unittest.skipIf(SKIP, SKIP)
class VersionTest(unittest.TestCase):
    def enable(self, route):
        code = ("import fragctl, fragctl.torch\n"
                "try:\n"
                "    fragctl.torch.enable('arena', backend='sim', route=%r)\n"
                "    print('enabled', fragctl.torch.route())\n"
                "except fragctl.FragctlError as e:\n"
                "    print('refused', e)\n" % route)
        done = subprocess.run([sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True,
                              timeout=120)
        self.assertEqual(done.returncode, 0, done.stderr)
        return done.stdout

    def test_each_route_is_taken_or_refused_by_version(self):
        import fragctl.torch
        found = _major_minor(torch.__version__)
        for route in ("auto", "pluggable", "native"):
            out = self.enable(route)
            # Below every route's minimum, each refusal names the lowest.
            lowest = fragctl.torch.MINIMUM_TORCH["pluggable"]
            needed = lowest if found < lowest else fragctl.torch.MINIMUM_TORCH[
                "pluggable" if route == "auto" else route]
            if found < needed:
                self.assertIn("refused", out)
                self.assertIn("this is torch %s" % torch.__version__, out)
                self.assertIn(">= %d.%d" % needed, out)
            else:
                self.assertNotIn("refused", out, route)


if __name__ == "__main__":
    unittest.main()
