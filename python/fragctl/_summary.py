"""``fragctl.summary``: a short fragmentation summary of a block of code."""
import contextlib
import sys
import threading
import time
from typing import IO, Any, Dict, Optional

from ._api import stats
from ._capi import FragctlError


def _gib(n: float) -> str:
    return "%.2f GiB" % (n / 2.0 ** 30)


class summary(contextlib.ContextDecorator):
    """Prints what fragctl's process-default allocator did during a block::

        with fragctl.summary("train"):
            for batch in loader: ...

        @fragctl.summary("step")
        def step(batch): ...

    One line on ``file`` (default stderr) at the end of the block, e.g.
    ``fragctl train [arena, cuda:0]: 12.3 s, peak requested 9.81 GiB,
    peak reserved 10.02 GiB (1.021x, fragmentation 2.1%), in the block:
    15000 allocations, 14990 frees, 12 device calls, 0 OOMs``. Peaks are
    since the allocator was built (the process's peaks). The figures of the
    last exit are in ``.result`` (a dict); it is None when nothing went
    through fragctl on the device.
    """

    def __init__(self, label: str = "", device: Optional[int] = None, file: Optional[IO[str]] = None) -> None:
        self.label = label
        self.device = device
        self.file = file
        self.result = None
        # What each open block began with, per thread, innermost last: a
        # decorated function that recurses, or runs on several threads at
        # once, enters this one object again before it exits (one shared
        # start gave every call the innermost one's figures).
        self._open = threading.local()

    def _entries(self) -> list:
        entries = getattr(self._open, "entries", None)
        if entries is None:
            entries = self._open.entries = []
        return entries

    def _stats(self) -> Optional[Dict[str, Any]]:
        try:
            return stats(self.device)
        except FragctlError:
            return None

    def __enter__(self) -> "summary":
        self._entries().append((self._stats(), time.perf_counter()))
        return self

    def __exit__(self, *exc: object) -> bool:
        entered, start = self._entries().pop()
        seconds = time.perf_counter() - start
        after = self._stats()
        out = self.file if self.file is not None else sys.stderr
        name = ("fragctl " + self.label).rstrip()
        if after is None:
            self.result = None
            print("%s: nothing was allocated through fragctl" % name, file=out)
            return False
        before = entered or {}

        def delta(*keys):
            a, b = after, before
            for k in keys:
                a = a.get(k, 0) if isinstance(a, dict) else 0
                b = b.get(k, 0) if isinstance(b, dict) else 0
            return a - b

        derived = after.get("derived", {})
        self.result = {
            "seconds": seconds,
            "allocator": after["allocator"],
            "backend": after["backend"],
            "device": after["device"],
            "peak_requested_bytes": after["requested_bytes"]["peak"],
            "peak_reserved_bytes": after["reserved_bytes"]["peak"],
            "reserved_over_requested": derived.get("reserved_over_requested", 0.0),
            "fragmentation": derived.get("fragmentation", 0.0),
            "allocations": delta("allocations"),
            "frees": delta("frees"),
            "device_calls": delta("backend_counters", "memory_calls"),
            "ooms": delta("ooms"),
        }
        r = self.result
        print("%s [%s, %s:%d]: %.3g s, peak requested %s, peak reserved %s (%.3fx, fragmentation %.1f%%), "
              "in the block: %d allocations, %d frees, %d device calls, %d OOMs"
              % (name, r["allocator"], r["backend"], r["device"], seconds, _gib(r["peak_requested_bytes"]),
                 _gib(r["peak_reserved_bytes"]), r["reserved_over_requested"], 100.0 * r["fragmentation"],
                 r["allocations"], r["frees"], r["device_calls"], r["ooms"]), file=out)
        return False
