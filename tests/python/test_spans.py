"""fragctl_watch_spans / fragctl_spans through ctypes (fragctl._capi), on
the sim backend: the span events a library that registers memory by range
(NCCL, through PyTorch's trace trackers) relies on. Run as test_fragctl.py."""
import ctypes
import unittest

import fragctl
from fragctl import _capi

MiB = 1 << 20


class SpansTest(unittest.TestCase):
    def test_each_handle_is_reported_when_mapped_and_before_it_is_unmapped(self):
        lib = _capi.library()
        events = []

        @_capi.SPAN_CALLBACK
        def on_span(event, address, size, _context):
            events.append((event, address, size))

        listed = []

        @_capi.SPAN_VISIT
        def visit(address, size, _context):
            listed.append((address, size))

        with fragctl.Allocator("arena", backend="sim", sim_capacity="256MiB", map_chunk="2MiB",
                               release_threshold=0, release_delay=0) as a:
            _capi.check(a._call(lib.fragctl_watch_spans, on_span, None))
            p = a.malloc(5 * MiB)
            self.assertEqual([e for e, _, _ in events], [0, 0, 0])  # FRAGCTL_SPAN_MAPPED, one per handle
            self.assertEqual([(addr, size) for _, addr, size in events],
                             [(p + k * 2 * MiB, 2 * MiB) for k in range(3)])
            _capi.check(a._call(lib.fragctl_spans, visit, None))
            self.assertEqual(listed, [(addr, size) for _, addr, size in events])
            del events[:]
            a.free(p, 5 * MiB)
            a.release_cached()
            self.assertEqual(sorted((e, size) for e, _, size in events), [(1, 2 * MiB)] * 3)  # UNMAPPING
            _capi.check(a._call(lib.fragctl_watch_spans, ctypes.cast(None, _capi.SPAN_CALLBACK), None))


if __name__ == "__main__":
    unittest.main()
