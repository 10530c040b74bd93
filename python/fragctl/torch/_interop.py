"""What fragctl.torch's services share to work on the library's memory:
native memory as tensors without a copy, the current stream as a handle,
and whether a backward pass is running. (Status codes are fragctl._capi's,
one vocabulary for every C function.)

Memory: on CPU devices (fragctl's sim backend in backed mode) a tensor over
host memory; on CUDA a tensor over ``__cuda_array_interface__`` (version 2,
no stream, so torch adds no synchronization). The tensor does not own the
memory: its owner (the checkpoint store, the block manager) must outlive it.
"""
import contextlib
import ctypes
import os
from typing import Any, Optional

from .. import _capi

class DeviceView:
    """Device memory described by __cuda_array_interface__ (version 2: no
    stream, so torch.as_tensor adds no synchronization)."""

    def __init__(self, pointer: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (pointer, False),
                                         "strides": None, "version": 2}


def wrap(torch: Any, device: Any, pointer: int, nbytes: int) -> Any:
    """A uint8 tensor on `device` over `nbytes` of memory at `pointer` (no copy)."""
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8, device=device)
    if device.type == "cpu":
        return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(pointer), dtype=torch.uint8)
    return torch.as_tensor(DeviceView(pointer, nbytes), device=device)


def typed(torch: Any, device: Any, pointer: int, shape: Any, dtype: Any) -> Any:
    """A tensor of `shape` and `dtype` on `device` over the memory at `pointer` (no copy)."""
    numel = 1
    for d in shape:
        numel *= d
    width = getattr(dtype, "itemsize", None) or torch.tensor([], dtype=dtype).element_size()
    return wrap(torch, device, pointer, numel * width).view(dtype).view(shape)


class Tensors:
    """Tensors over native memory, made once per (address, size, shape,
    dtype) and handed out again: a block gathered, or a gradient bucket,
    lands at the addresses it had before (the allocator reuses them), and
    making a tensor through __cuda_array_interface__ takes a Python object,
    its parse and a driver query of the pointer, hundreds of times a step. A tensor only describes
    addresses and holds no memory: the caller asks for one only while the
    memory's owner says it is there, and must not keep it beyond. At most
    LIMIT tensors are kept; the whole cache is dropped when full (the
    addresses a run uses settle after its first steps)."""

    LIMIT = 4096

    def __init__(self, torch: Any, device: Any) -> None:
        self._torch = torch
        self._device = device
        self._made: dict = {}
        self.built = 0  # tensors made (cache misses), for tests and benchmarks

    def _keep(self, key: Any, tensor: Any) -> Any:
        if len(self._made) >= self.LIMIT:
            self._made.clear()
        self._made[key] = tensor
        self.built += 1
        return tensor

    def raw(self, pointer: int, nbytes: int) -> Any:
        """wrap(): a uint8 tensor over `nbytes` at `pointer`."""
        key = (pointer, nbytes)
        found = self._made.get(key)
        return found if found is not None else self._keep(key, wrap(self._torch, self._device, pointer, nbytes))

    def typed(self, pointer: int, shape: Any, dtype: Any) -> Any:
        """typed(): a tensor of `shape` and `dtype` at `pointer`."""
        key = (pointer, tuple(shape), dtype)
        found = self._made.get(key)
        if found is not None:
            return found
        return self._keep(key, typed(self._torch, self._device, pointer, shape, dtype))


_HOLDS = {"host": "host memory (the sim backend with sim_backed)", "device": "GPU memory (cuda or hip)",
          "none": "no memory behind the addresses (the sim backend in accounting mode: sim_backed is false, its "
                  "default)"}


def require_memory(kind: str, device: Any, who: str, environment: bool = False) -> None:
    """Raises fragctl.ConfigurationError unless blocks of memory kind `kind`
    (Allocator.memory_kind: "host", "device", "none") can hold tensors on
    `device`: host memory for CPU tensors, GPU memory for CUDA ones. The
    message, prefixed by `who`, says what to pass instead; `environment`: the
    memory is that of allocators built from FRAGCTL_BACKEND and FRAGCTL_CONF
    (fragctl.torch.zero3's own), not of a given Allocator."""
    needed = "host" if device.type == "cpu" else "device"
    if kind == needed:
        return
    if environment:
        source = "FRAGCTL_BACKEND=%s with FRAGCTL_CONF=%r builds allocators with" % (
            os.environ.get("FRAGCTL_BACKEND", ""), os.environ.get("FRAGCTL_CONF", ""))
    else:
        source = "the allocator has"
    if needed == "host":
        fix = ("add sim_backed:true to FRAGCTL_CONF, or unset FRAGCTL_BACKEND (a CPU model then runs on sim in "
               "backed mode)" if environment else
               'pass an allocator with host memory: fragctl.Allocator(backend="sim", sim_backed=True)')
    else:
        fix = ("set FRAGCTL_BACKEND to cuda or hip, or unset it" if environment else
               'pass an allocator on the GPU: fragctl.Allocator(backend="cuda") (or "hip")')
    raise _capi.ConfigurationError("%s: %s %s, so %s tensors cannot live there%s; %s"
                                   % (who, source, _HOLDS.get(kind, kind), "CPU" if needed == "host" else "CUDA",
                                      " (writing them would crash the process)" if kind == "none" else "", fix),
                                   "FRAGCTL_ERROR_INVALID_ARGUMENT")


def backward_running(torch: Any) -> bool:
    """True while autograd's engine runs a backward pass on this thread
    (a forward then is a checkpoint's recompute; a save serves this
    backward). torch 2.0+ says so; earlier, the engine takes a final
    callback only inside a backward (a no-op one is queued to ask)."""
    task = getattr(torch._C, "_current_graph_task_id", None)
    if task is not None:
        return task() != -1
    try:
        torch.autograd.Variable._execution_engine.queue_callback(lambda: None)
    except RuntimeError:
        return False
    return True


def current_stream(torch: Any, device: Any) -> Optional[int]:
    """The handle of `device`'s current stream for the C API: None for the
    default stream and on CPU devices. Read without making a
    torch.cuda.Stream where torch has the raw getter (a tenth of a
    microsecond against three: the manager asks at every fetch, release and
    gradient)."""
    if device.type == "cuda":
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None and device.index is not None:
            return raw(device.index) or None
        return torch.cuda.current_stream(device).cuda_stream or None
    return None


_external_streams: dict = {}  # (device, handle) -> torch.cuda.ExternalStream, made once


def stream_context(torch: Any, device: Any, handle: Optional[int]) -> Any:
    """A context in which the stream `handle` (None: the default stream) is
    current on `device`; a null context on CPU devices."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    key = (str(device), handle or 0)
    stream = _external_streams.get(key)
    if stream is None:
        if len(_external_streams) >= 64:  # streams made and destroyed over a long run
            _external_streams.clear()
        stream = _external_streams[key] = torch.cuda.ExternalStream(handle or 0, device=device)
    return torch.cuda.stream(stream)
