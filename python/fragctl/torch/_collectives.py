"""The block manager's collectives run by torch.distributed
(fragctl_zero3_collectives in fragctl/zero3/zero3.h).

Each C callback wraps the manager's buffers as tensors (CPU tensors over
sim-backed memory; CUDA tensors through __cuda_array_interface__ on the
manager's communication stream) and runs one torch.distributed collective on
the given process group. A Python exception never crosses into C: it is
recorded (``failure``) and the callback returns FRAGCTL_ZERO3_COLLECTIVE, or
FRAGCTL_ZERO3_TIMEOUT when the group's timeout expired. A BaseException that
is not an Exception (KeyboardInterrupt, SystemExit) is kept in ``interrupt``
for the caller to re-raise once the manager has returned.
"""
import ctypes
from typing import Any, Optional, Tuple

from ._interop import ZERO3_COLLECTIVE, ZERO3_OK, ZERO3_TIMEOUT, stream_context, wrap


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


class TorchCollectives:
    """Callbacks over `group` for a manager whose memory is on `device`."""

    def __init__(self, torch: Any, group: Any, timeout_ms: int, device: Any) -> None:
        import torch.distributed as dist
        self.torch = torch
        self.dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.device = device
        self.use_all_reduce = dist.get_backend(group) == "gloo"  # gloo has no reduce-scatter
        self.failure: Optional[Tuple[str, str, str]] = None  # (collective, tag, message)
        self.interrupt: Optional[BaseException] = None  # a KeyboardInterrupt a callback caught
        # Keep the ctypes function objects alive as long as the manager.
        self._all_gather = ALL_GATHER(self._gather)
        self._reduce_scatter = REDUCE_SCATTER(self._scatter)
        self.struct = Collectives(self.rank, self.size, timeout_ms, None, self._all_gather, self._reduce_scatter)

    def _fail(self, collective: str, tag: bytes, error: BaseException) -> int:
        if not isinstance(error, Exception):
            self.interrupt = error
        self.failure = (collective, tag.decode(errors="replace") if tag else "", "%s: %s" % (type(error).__name__,
                                                                                           error))
        return ZERO3_TIMEOUT if _is_timeout(error) else ZERO3_COLLECTIVE

    def _gather(self, _context, parts, count, stream, tag) -> int:
        try:
            with stream_context(self.torch, self.device, stream):
                for i in range(count):
                    part = parts[i]
                    recv = wrap(self.torch, self.device, part.recv, part.bytes * self.size)
                    send = wrap(self.torch, self.device, part.send, part.bytes).clone()
                    self.dist.all_gather(list(recv.chunk(self.size)), send, group=self.group)
            return ZERO3_OK
        except BaseException as e:  # noqa: BLE001 (nothing may cross into C)
            return self._fail("all_gather", tag, e)

    def _scatter(self, _context, parts, count, dtype, stream, tag) -> int:
        torch = self.torch
        try:
            element = {0: torch.uint8, 1: torch.float16, 2: torch.bfloat16, 3: torch.float32}[dtype]
            width = torch.tensor([], dtype=element).element_size()
            with stream_context(self.torch, self.device, stream):
                for i in range(count):
                    part = parts[i]
                    n = part.elements
                    send = wrap(self.torch, self.device, part.send, n * width * self.size).view(element)
                    recv = wrap(self.torch, self.device, part.recv, n * width).view(element)
                    if self.use_all_reduce:
                        total = send.clone()
                        self.dist.all_reduce(total, group=self.group)
                        recv.copy_(total[self.rank * n:(self.rank + 1) * n])
                    elif hasattr(self.dist, "reduce_scatter_tensor"):
                        self.dist.reduce_scatter_tensor(recv, send.clone(), group=self.group)
                    else:  # torch 1.13
                        self.dist._reduce_scatter_base(recv, send.clone(), group=self.group)
            return ZERO3_OK
        except BaseException as e:  # noqa: BLE001 (nothing may cross into C)
            return self._fail("reduce_scatter", tag, e)
