"""The block manager's collectives run by torch.distributed
(fragctl_zero3_collectives in fragctl/zero3/zero3.h).

Each C callback wraps the manager's buffers as tensors (CPU tensors over
sim-backed memory; CUDA tensors through __cuda_array_interface__ on the
manager's communication stream) and runs one torch.distributed collective on
the given process group. A Python exception never crosses into C: it is
recorded (``failure``) and the callback returns FRAGCTL_ERROR_COLLECTIVE, or
FRAGCTL_ERROR_TIMEOUT when fragctl's deadline passed (or the group's timeout
expired). A BaseException that is not an Exception (KeyboardInterrupt,
SystemExit) is kept in ``interrupt`` for the caller to re-raise once the
manager has returned.

Deadlines (issue 31). Every collective is counted and recorded
(_progress.Progress: the hot path is a few attribute writes). On CPU ranks
(gloo) each torch.distributed call is issued with ``async_op=True`` and
waited for until fragctl's deadline, ``deadline`` seconds after the callback
was entered, which is earlier than the group's own timeout; past it the
callback reads every rank's record from the store (``report``: who has not
entered this collective) and returns FRAGCTL_ERROR_TIMEOUT. Any other
failure reads the records too, so a rank that arrives after the others gave
up learns that they did.

On GPUs (NCCL) a collective is queued (``async_op=True``, then ``wait()``,
which only orders the manager's stream after it, as ``async_op=False``
does) and its work kept until it completes (``is_completed()``, an event
query). Each queued collective has fragctl's deadline too, checked at every
callback and by a watcher thread (the driving thread may be blocked in a
CUDA synchronization behind the hung collective): past it, the ranks'
records are read, the message is written to stderr and the hang into the
manager's reports (fragctl_zero3_record_hang) at once, before PyTorch's NCCL
watchdog (the group's timeout, later) aborts the communicator and ends the
process; the next callback returns FRAGCTL_ERROR_TIMEOUT, so a driving
thread that is not blocked raises CollectiveTimeoutError.
"""
import collections
import ctypes
import os
import re
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Deque, Dict, Optional, Tuple

from .. import _capi
from . import _errors
from ._interop import Tensors, stream_context
from ._progress import Progress

Entry = Tuple[int, str, Any, int, float]  # a collective as Progress records it


class GatherPart(ctypes.Structure):
    _fields_ = [("send", ctypes.c_void_p), ("recv", ctypes.c_void_p), ("bytes", ctypes.c_size_t)]


class ScatterPart(ctypes.Structure):
    _fields_ = [("send", ctypes.c_void_p), ("recv", ctypes.c_void_p), ("elements", ctypes.c_size_t)]


ALL_GATHER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(GatherPart), ctypes.c_size_t,
                              ctypes.c_void_p, ctypes.c_char_p)
REDUCE_SCATTER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ScatterPart), ctypes.c_size_t,
                                  ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)


class Collectives(ctypes.Structure):
    _fields_ = [("rank", ctypes.c_int), ("size", ctypes.c_int), ("timeout_ms", ctypes.c_longlong),
                ("context", ctypes.c_void_p), ("all_gather", ALL_GATHER), ("reduce_scatter", REDUCE_SCATTER)]


def _is_timeout(error: BaseException) -> bool:
    text = str(error).lower()
    return "timed out" in text or "timeout" in text


_BLOCK_TAG = re.compile(r"block (\d+) '")


def block_of(tag: str) -> Any:
    """The block index the manager's tag names ("block 3 'layers.2'" -> 3),
    else the tag itself ("persistent gradients")."""
    match = _BLOCK_TAG.match(tag)
    return int(match.group(1)) if match else tag


_blocks_of_tags: Dict[bytes, Any] = {}  # the manager's tag -> block_of(it): a few per block, read per collective


def _block_of_tag(tag: bytes) -> Any:
    found = _blocks_of_tags.get(tag)
    if found is None:
        if len(_blocks_of_tags) >= 65536:
            _blocks_of_tags.clear()
        found = _blocks_of_tags[tag] = block_of(tag.decode(errors="replace") if tag else "")
    return found


class DeadlinePassed(Exception):
    """fragctl's deadline for the current collective passed."""


class TorchCollectives:
    """Callbacks over `group` for a manager whose memory is on `device`;
    ``deadline`` (seconds) is fragctl's per collective, ``group_timeout`` the
    group's own (None where torch does not say), ``explicit`` whether the
    deadline is shard()'s timeout= rather than derived from the group's."""

    def __init__(self, torch: Any, group: Any, deadline: float, group_timeout: Optional[float], explicit: bool,
                 device: Any) -> None:
        import torch.distributed as dist
        self.torch = torch
        self.dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.device = device
        self.use_all_reduce = dist.get_backend(group) == "gloo"  # gloo has no reduce-scatter
        self.blocking = device.type == "cpu"  # gloo: the call's work is waited for, up to the deadline
        # GPUs: the flat collectives (torch 1.13 names them _all_gather_base, _reduce_scatter_base)
        self._gather_flat = getattr(dist, "all_gather_into_tensor", None) or getattr(dist, "_all_gather_base", None)
        self._scatter_flat = getattr(dist, "reduce_scatter_tensor", None) or getattr(dist, "_reduce_scatter_base", None)
        self.failure: Optional[Tuple[str, str, str]] = None  # (collective, tag, message)
        self.report: Optional[Dict[str, Any]] = None  # the ranks' view at the failure (Progress.report)
        self.failed: Optional[Tuple[int, str, Any, int, float]] = None  # the record of the failed collective
        self.deadline_passed = False  # it failed at fragctl's deadline (not at torch's timeout)
        self.interrupt: Optional[BaseException] = None  # a KeyboardInterrupt a callback caught
        self.recorded = False  # the failure is in the reports (_errors.raise_for_status)
        self.raised = False  # the driving thread raised it
        self.handle: Any = None  # the manager (fragctl_zero3*) once made: where the watcher records a hang
        self.progress = Progress(dist, group, self.rank, self.size, deadline, group_timeout, explicit)
        # GPUs: collectives queued and not yet complete, oldest first, each
        # (entry, work, deadline); the one whose deadline passed.
        self._queued: Deque[Tuple[Entry, Any, float]] = collections.deque()
        self._queued_lock = threading.Lock()
        self._expire_lock = threading.Lock()
        self.expired: Optional[Entry] = None
        self._closing = threading.Event()
        self._watcher: Optional[threading.Thread] = None
        # Tensors over the manager's buffers (shards, gathered blocks,
        # buckets, gradient slices), made once per address.
        self._tensors = Tensors(torch, device)
        self._widths = {0: 1, 1: 2, 2: 2, 3: 4}
        # Keep the ctypes function objects alive as long as the manager.
        self._all_gather = ALL_GATHER(self._gather)
        self._reduce_scatter = REDUCE_SCATTER(self._scatter)
        self.struct = Collectives(self.rank, self.size, int(deadline * 1000), None, self._all_gather,
                                  self._reduce_scatter)

    def close(self) -> None:
        self._closing.set()
        watcher, self._watcher = self._watcher, None
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(1.0)
        self.progress.close()

    def detach(self) -> None:
        """The manager is about to be destroyed: a hang found from now on is
        not recorded through it (waits for one being recorded)."""
        with self._expire_lock:
            self.handle = None

    # --- GPUs: queued collectives and their deadlines -----------------------

    def _queue(self, work: Any) -> None:
        """Keeps `work`, the current collective's, until it completes."""
        with self._queued_lock:
            self._queued.append((self.progress.current, work, time.monotonic() + self.progress.deadline))
            if self._watcher is None and not self._closing.is_set():
                self._watcher = threading.Thread(target=_watch, args=(self,), name="fragctl-zero3-deadline",
                                                 daemon=True)
                self._watcher.start()

    def _retire(self) -> Optional[Tuple[Entry, Any, float]]:
        """Retires the queued collectives that completed, oldest first;
        returns the oldest that has not, or None."""
        with self._queued_lock:
            while self._queued and self._queued[0][1].is_completed():
                entry = self._queued.popleft()[0]
                self.progress.complete(entry)
            return self._queued[0] if self._queued else None

    def _check_queued(self) -> None:
        """Raises DeadlinePassed when a queued collective passed its deadline."""
        if not self._queued and self.expired is None:
            return
        oldest = self._retire()
        if self.expired is None and oldest is not None and time.monotonic() > oldest[2]:
            self.expire(oldest[0])
        if self.expired is not None:
            raise DeadlinePassed()

    def expire(self, entry: Entry) -> None:
        """Queued collective `entry` passed its deadline: reads the ranks'
        records, writes the message to stderr and the hang into the
        manager's reports, once (the watcher or the driving thread, whichever
        comes first)."""
        with self._expire_lock:
            if self.expired is not None:
                return
            self.failed = entry
            self.deadline_passed = True
            self.failure = (entry[1], self.progress.describe(entry[2])[0],
                            "the collective queued on the GPU did not complete")
            self.progress.give_up(entry)
            self.report = self.progress.report(entry)
            text = _errors.collective_message(_capi.TIMEOUT, self, self.rank, "")
            try:
                sys.stderr.write("[fragctl] %s\n" % text)
                sys.stderr.flush()
            except Exception:  # noqa: BLE001 (no stderr: the reports still get it)
                pass
            if self.handle is not None:
                _errors.record(_capi.library(), self.handle, _errors.hang_record(_capi.TIMEOUT, self, self.rank, text))
                self.recorded = True
            self.expired = entry

    def _fail(self, collective: str, tag: bytes, error: BaseException) -> int:
        if not isinstance(error, Exception):
            self.interrupt = error
        if self.expired is not None and isinstance(error, DeadlinePassed):
            return _capi.TIMEOUT  # expire() named the ranks already
        self.deadline_passed = isinstance(error, DeadlinePassed)
        timed_out = self.deadline_passed or _is_timeout(error)
        cause = error.__cause__ if isinstance(error, DeadlinePassed) and error.__cause__ else error
        self.failure = (collective, tag.decode(errors="replace") if tag else "",
                        "%s: %s" % (type(cause).__name__, cause))
        self.failed = self.progress.current
        if isinstance(error, Exception):  # the ranks' records; not for Ctrl-C, which should be quick
            if timed_out:
                self.progress.give_up()
            self.report = self.progress.report()
        return _capi.TIMEOUT if timed_out else _capi.COLLECTIVE

    def _wait(self, work: Any) -> None:
        """Waits for `work` until the current collective's deadline; raises
        DeadlinePassed past it."""
        if not self.blocking:
            return
        left = self.progress.deadline_at - time.monotonic()
        if left <= 0:
            raise DeadlinePassed()
        try:
            work.wait(timeout=timedelta(seconds=max(left, 0.001)))  # timedelta(0) would mean "no timeout"
        except RuntimeError as e:
            if time.monotonic() >= self.progress.deadline_at - 0.001:
                raise DeadlinePassed() from e
            raise

    def _gather(self, _context, parts, count, stream, tag) -> int:
        torch = self.torch
        try:
            self._check_queued()
            self.progress.enter("all_gather", _block_of_tag(tag),
                                sum(parts[i].bytes for i in range(count)) * self.size)
            with stream_context(self.torch, self.device, stream):
                for i in range(count):
                    part = parts[i]
                    recv = self._tensors.raw(part.recv, part.bytes * self.size)
                    send = self._tensors.raw(part.send, part.bytes)
                    if self.blocking:
                        # Into tensors of its own: a collective abandoned at the
                        # deadline may still complete later, after the manager's
                        # buffer went back to its allocator.
                        gathered = [torch.empty_like(send) for _ in range(self.size)]
                        self._wait(self.dist.all_gather(gathered, send.clone(), group=self.group, async_op=True))
                        torch.cat(gathered, out=recv)
                    else:
                        # One flat output and the manager's own buffers: no
                        # list of chunks (a gathered-size temporary and a copy)
                        # and no clone. In place (send == recv + rank * bytes)
                        # is NCCL's in-place all-gather.
                        work = self._gather_flat(recv, send, group=self.group, async_op=True)
                        work.wait()  # orders this stream after it; the host does not wait
                        self._queue(work)
            if self.blocking:
                self.progress.leave()
            return _capi.OK
        except BaseException as e:  # noqa: BLE001 (nothing may cross into C)
            return self._fail("all_gather", tag, e)

    def _scatter(self, _context, parts, count, dtype, stream, tag) -> int:
        torch = self.torch
        try:
            self._check_queued()
            element = {0: torch.uint8, 1: torch.float16, 2: torch.bfloat16, 3: torch.float32}[dtype]
            width = self._widths[dtype]
            self.progress.enter("reduce_scatter", _block_of_tag(tag),
                                sum(parts[i].elements for i in range(count)) * width * self.size)
            with stream_context(self.torch, self.device, stream):
                for i in range(count):
                    part = parts[i]
                    n = part.elements
                    send = self._tensors.typed(part.send, (n * self.size,), element)
                    recv = self._tensors.typed(part.recv, (n,), element)
                    if self.use_all_reduce:  # into a tensor of its own, copied out once complete
                        total = send.clone()
                        self._wait(self.dist.all_reduce(total, group=self.group, async_op=self.blocking))
                        recv.copy_(total[self.rank * n:(self.rank + 1) * n])
                    else:
                        # The manager's buffers as they are (in place when recv is
                        # send's own chunk, NCCL's in-place reduce-scatter): no
                        # copy of the whole bucket.
                        work = self._scatter_flat(recv, send, group=self.group, async_op=True)
                        work.wait()  # orders this stream after it; the host does not wait
                        self._queue(work)
            if self.blocking:
                self.progress.leave()
            return _capi.OK
        except BaseException as e:  # noqa: BLE001 (nothing may cross into C)
            return self._fail("reduce_scatter", tag, e)


#: After a queued collective expired, how long past the process group's
#: timeout PyTorch's NCCL watchdog has to end the process before fragctl does.
END_GRACE_S = 30.0


def _watch(collectives: TorchCollectives) -> None:
    """The watcher thread of a manager on GPUs: retires completed
    collectives and expires the oldest one past its deadline, even while the
    driving thread is blocked elsewhere. Ends at close(), or once one
    expired and the driving thread raised it. A process that neither
    raised it nor was ended by PyTorch's watchdog END_GRACE_S after the
    group's timeout (the driving thread blocked behind the hung collective,
    the watchdog stalled: seen on torch 2.11 while it dumped its debug
    information) is ended here, its reports written first: no rank hangs."""
    poll = min(0.1, collectives.progress.gap)
    while not collectives._closing.wait(poll):
        try:
            oldest = collectives._retire()
            if oldest is not None and time.monotonic() > oldest[2]:
                collectives.expire(oldest[0])
        except Exception:  # noqa: BLE001 (a work's query failed: the driving thread's next call reports it)
            return
        if collectives.expired is not None:
            break
    else:
        return
    progress = collectives.progress
    after_timeout = max(0.0, (progress.group_timeout or progress.deadline) - progress.deadline)
    end_at = time.monotonic() + after_timeout + END_GRACE_S
    while not collectives._closing.wait(0.5):
        if collectives.raised:
            return
        if time.monotonic() >= end_at:
            try:
                sys.stderr.write("[fragctl] zero3 rank %d: still running %g s after the process group's timeout, "
                                 "the hung collective's error not taken (PyTorch's NCCL watchdog did not end the "
                                 "process); ending it\n" % (collectives.rank, END_GRACE_S))
                sys.stderr.flush()
                _capi.library().fragctl_flush()
            finally:
                os._exit(1)
