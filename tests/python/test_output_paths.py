"""Output paths through the Python package (issue 27; docs/reliability.md,
"Bad inputs"): a report written to a device writes into it and never
replaces it, and the claims of report paths are released with their
allocators. Device nodes are private ones (mknod in a temporary directory),
never a system path; those tests skip when not root.

Run as tests/python/test_fragctl.py is (CTest: python_fragctl).
"""
import os
import stat
import tempfile
import unittest

import fragctl

MiB = 1 << 20


def sim(**options):
    return fragctl.Allocator("caching", backend="sim", sim_capacity="1GiB", **options)


def open_descriptors():
    return len(os.listdir("/proc/self/fd"))


@unittest.skipUnless(os.geteuid() == 0, "needs root to mknod a private character device")
class DeviceReportTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.null = os.path.join(self.dir.name, "null")
        self.full = os.path.join(self.dir.name, "full")
        os.mknod(self.null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        os.mknod(self.full, 0o666 | stat.S_IFCHR, os.makedev(1, 7))

    def tearDown(self):
        self.dir.cleanup()

    def assert_device(self, path, minor):
        st = os.lstat(path)
        self.assertTrue(stat.S_ISCHR(st.st_mode), "%s is no longer a character device" % path)
        self.assertEqual(st.st_rdev, os.makedev(1, minor))

    def test_report_to_a_full_device_fails_and_leaves_it_a_device(self):
        # Was: Allocator.report("/dev/full") renamed a JSON file over the node.
        with sim() as a:
            with self.assertRaises(fragctl.FragctlError) as caught:
                a.report(self.full)
            self.assertIn(os.strerror(28), str(caught.exception))  # ENOSPC
            self.assertEqual(a.report(self.null), self.null)
        self.assert_device(self.full, 7)
        self.assert_device(self.null, 3)
        self.assertEqual(sorted(os.listdir(self.dir.name)), ["full", "null"])

    def test_report_option_at_a_device_writes_into_it(self):
        # As FRAGCTL_REPORT=/dev/null: the report at close goes into the device.
        with sim(report=self.null, prometheus=self.null) as a:
            a.free(a.malloc(MiB), MiB)
        self.assert_device(self.null, 3)
        self.assertEqual(sorted(os.listdir(self.dir.name)), ["full", "null"])


class ReportClaimTest(unittest.TestCase):
    def test_reports_named_in_a_loop_do_not_hold_descriptors(self):
        # Was: 1,000 reports named in a loop held 1,008 descriptors.
        with tempfile.TemporaryDirectory() as d:
            with sim(report=os.path.join(d, "warm.json")):
                pass
            before = open_descriptors()
            for i in range(1000):
                with sim(report=os.path.join(d, "r%d.json" % i)) as a:
                    a.free(a.malloc(MiB), MiB)
            self.assertEqual(open_descriptors(), before)
            self.assertTrue(os.path.exists(os.path.join(d, "r999.json")))

    def test_report_to_a_symlink_is_refused_and_the_link_kept(self):
        with tempfile.TemporaryDirectory() as d:
            target = os.path.join(d, "target.json")
            with open(target, "w") as f:
                f.write("keep")
            link = os.path.join(d, "link.json")
            os.symlink(target, link)
            with sim() as a:
                with self.assertRaises(fragctl.FragctlError) as caught:
                    a.report(link)
                self.assertIn("symbolic link", str(caught.exception))
                # Positive control: a plain path is written.
                a.report(os.path.join(d, "plain.json"))
            self.assertTrue(os.path.islink(link))
            with open(target) as f:
                self.assertEqual(f.read(), "keep")
            self.assertTrue(os.path.isfile(os.path.join(d, "plain.json")))


if __name__ == "__main__":
    unittest.main()
