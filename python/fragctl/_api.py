"""fragctl's Python API over libfragctl.so's C API: Allocator, the
process-default allocators (configure, default_allocator, stats, report,
flush), version() and policies(). The package (fragctl/__init__.py)
exports them; fragctl.summary and fragctl.torch build on them.
"""
import contextlib
import ctypes
import threading
import time
import warnings
import weakref
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from . import _capi
from ._capi import FragctlError, library

#: An option value: a byte count, a size string such as "512MiB", a bool or a string.
OptionValue = Union[int, float, str, bool]


def version() -> str:
    """libfragctl's version string."""
    return library().fragctl_version().decode()


def policies() -> List[str]:
    """Names of the policies a policy expression may use."""
    return library().fragctl_policy_names().decode().split(",")


#: What Allocator.attributing gave each (allocator handle, use, label) so far.
_attributed: Dict[Tuple[Optional[int], str, str], int] = {}


class Allocator:
    """A fragctl allocator (a backend, a policy chain and its adaptors).

    ``Allocator("buckets:arena", backend="sim", sim_capacity="8GiB")``.
    ``policy`` None means the default for the backend; ``backend`` is
    "cuda", "hip", "sim" or None (auto); ``device`` -1 takes the options'.
    Usable as a context manager (closes on exit).

    Thread-safe, close() included: it waits for the calls other threads
    have in flight, and a call that starts once it has begun raises
    FragctlError ("closed"), never touches the freed allocator. An
    allocator dropped without close() is destroyed when it is collected
    (not at interpreter exit: the process's end writes its report then).
    """

    def __init__(self, policy: Optional[str] = None, backend: Optional[str] = None, device: int = -1,
                 **options: OptionValue) -> None:
        self._unopened()
        self._create(policy, _capi.options_string(options), backend, device)

    def _unopened(self) -> None:
        """The fields of an Allocator without an allocator yet."""
        self._guard = threading.Lock()  # orders a call's start against close()
        self._closer = threading.Lock()  # one close() at a time
        self._calls: Dict[object, None] = {}  # a token per call in flight
        self._closing = False
        self._handle = ctypes.c_void_p()
        self._owned = False
        self._finalizer = None

    @classmethod
    def _from_text(cls, policy: Optional[str], options: Optional[str], backend: Optional[str],
                   device: int = -1) -> "Allocator":
        """An Allocator whose options are FRAGCTL_CONF text ("key:value,...")."""
        self = cls.__new__(cls)
        self._unopened()
        self._create(policy, options, backend, device)
        return self

    def _create(self, policy: Optional[str], options: Optional[str], backend: Optional[str], device: int) -> None:
        """fragctl_create: this object owns the new allocator."""
        handle = ctypes.c_void_p()
        args = (_capi.text(policy, "policy"), _capi.text(options, "options"), _capi.text(backend, "backend"),
                _capi.device(device, allow_unset=True))
        _capi.check(library().fragctl_create(*args, ctypes.byref(handle)))
        self._handle = handle
        self._owned = True
        # Not at exit (atexit=False): allocators still alive then are the
        # process's to report, as the defaults are.
        self._finalizer = weakref.finalize(self, _destroy_dropped, handle.value)
        self._finalizer.atexit = False

    @classmethod
    def _wrap(cls, handle: ctypes.c_void_p) -> "Allocator":
        self = cls.__new__(cls)
        self._unopened()
        self._handle = handle
        return self

    # A call into the library holds a token in self._calls from _begin until
    # it has returned; close() waits until none is left. The token is added
    # last in _begin and removed as the first step after the call (a dict
    # store and delete, which a KeyboardInterrupt cannot split), so an
    # interrupt never leaves one behind for close() to wait on.

    def _begin(self, token: object) -> ctypes.c_void_p:
        with self._guard:
            if self._closing or not self._handle:
                raise FragctlError("fragctl.Allocator: the allocator is closed", "FRAGCTL_ERROR_INVALID_ARGUMENT")
            self._calls[token] = None
            return self._handle

    def _call(self, function: Any, *args: Any) -> Any:
        """``function(handle, *args)``, a C API call on this allocator's
        handle, made while close() cannot destroy it. FragctlError once closed."""
        token = object()
        try:
            return function(self._begin(token), *args)
        finally:
            self._calls.pop(token, None)

    @property
    def policy(self) -> str:
        """The policy expression built, defaults filled in ("buckets:arena")."""
        return self._call(library().fragctl_policy).decode()

    @property
    def memory_kind(self) -> str:
        """What the blocks are: "host" (host memory the CPU may use: sim with
        ``sim_backed=True``), "device" (GPU memory: cuda, hip) or "none"
        (sim in accounting mode, the default: addresses without memory)."""
        kind = ctypes.c_int()
        _capi.check(self._call(library().fragctl_memory_kind_of, ctypes.byref(kind)))
        return _capi.memory_kind_name(kind.value)

    def malloc(self, nbytes: int, stream: int = 0) -> int:
        """Allocates ``nbytes`` usable on ``stream`` (an int handle; 0 = default stream). Returns the address.

        A KeyboardInterrupt (or other exception) that arrives once the block
        exists frees it again before it propagates: no block is lost."""
        nbytes, stream = _capi.size(nbytes), _capi.address(stream, "stream")
        lib, calls, token, out = library(), self._calls, object(), ctypes.c_void_p()
        try:
            handle = self._begin(token)
            status = lib.fragctl_malloc(handle, ctypes.byref(out), nbytes, stream)
            if status != _capi.OK:
                _capi.check(status)
            del calls[token]  # from here to the return nothing lets an interrupt in
            return out.value or 0
        except BaseException:
            if token in calls:
                if out.value:  # made, then interrupted before it could be returned
                    lib.fragctl_free(handle, out.value, nbytes, stream)
                del calls[token]
            raise

    def free(self, ptr: int, nbytes: int, stream: int = 0) -> None:
        """Frees ``ptr`` (of ``nbytes``) stream-ordered on ``stream``. A size other than the allocated one
        frees the block all the same and warns (RuntimeWarning; counted as misuse in the statistics): it
        does not raise, so that no caller frees the block again. A pointer that is not a live block raises
        FragctlError (status FRAGCTL_ERROR_NOT_OWNED) and changes nothing."""
        ptr, nbytes, stream = _capi.address(ptr, "ptr"), _capi.size(nbytes), _capi.address(stream, "stream")
        status = self._call(library().fragctl_free, ptr, nbytes, stream)
        if status == _capi.SIZE_MISMATCH:
            warnings.warn(library().fragctl_last_error().decode(errors="replace"), RuntimeWarning, stacklevel=2)
            return
        _capi.check(status)

    def stream_ending(self, stream: int) -> None:
        """Call before destroying ``stream`` (an int handle) that blocks were allocated or freed on: waits
        for the work queued on it, then the allocator forgets it (its frees are complete, its cached
        blocks go to the default stream), so that it never hands the runtime the destroyed handle. 0
        (the default stream) does nothing."""
        stream = _capi.address(stream, "stream")
        _capi.check(self._call(library().fragctl_stream_ending, stream))

    def release_cached(self) -> None:
        """Returns wholly free cached memory to the device."""
        _capi.check(self._call(library().fragctl_release_cached))

    def pause(self, keep: str = "none") -> None:
        """Gives the device memory under every block back to the device,
        keeping each block's address, until resume() (docs/interop.md,
        "Pause and resume"). ``keep="host"`` copies the blocks' contents to
        pinned host memory and resume() writes them back; ``"none"`` leaves
        them undefined. Allocating while paused raises TooLateError (a
        FragctlError); freeing is fine. Only the ``arena`` policy can pause."""
        modes = {"none": 0, "host": 1}
        if keep not in modes:
            raise _capi.ConfigurationError("pause: keep is %r, not 'none' or 'host'" % (keep,), "FRAGCTL_ERROR_INVALID_ARGUMENT")
        _capi.check(self._call(library().fragctl_pause, modes[keep]))

    def resume(self) -> None:
        """Maps fresh device memory under every paused block at the same
        address and restores what pause(keep="host") kept. Raises
        FragctlError (OUT_OF_MEMORY) when the device cannot give the memory
        back yet; the allocator then stays paused and resume() may be
        called again."""
        _capi.check(self._call(library().fragctl_resume))

    @property
    def paused(self) -> bool:
        """Whether pause() holds the allocator."""
        flag = ctypes.c_int()
        _capi.check(self._call(library().fragctl_paused, ctypes.byref(flag)))
        return bool(flag.value)

    def stats(self) -> Dict[str, Any]:
        """Statistics as a dict (the JSON schema of docs/statistics.md)."""
        import json
        out = ctypes.c_void_p()
        _capi.check(self._call(library().fragctl_stats_json, ctypes.byref(out)))
        return json.loads(_capi.take_string(out))

    def device_memory_split(self) -> Dict[str, Any]:
        """The allocator's device memory split by whose it is, as a dict
        (docs/reports.md, "The device memory that is not fragctl's"): used,
        this_process and other_processes (NVML; None without per-process
        figures), fragctl (this allocator's reserved bytes), not_fragctl,
        other_fragctl, graph_pools, context, nccl, other."""
        import json
        out = ctypes.c_void_p()
        _capi.check(self._call(library().fragctl_device_memory_split_json, ctypes.byref(out)))
        return json.loads(_capi.take_string(out))

    def attribute_device_memory(self, use: str, label: str, nbytes: int) -> None:
        """Records that ``label`` (a communicator's name) holds ``nbytes`` of
        this allocator's device for ``use`` ("nccl"), replacing what it held
        before; 0 removes it. Every report's split on the device counts it."""
        _capi.check(self._call(library().fragctl_attribute_device_memory, _capi.text(use, "use"),
                               _capi.text(label, "label"), _capi.size(nbytes, "nbytes")))

    def process_memory_outside(self) -> Optional[int]:
        """This process's device memory on the allocator's device that no
        fragctl allocator holds (NVML), or None where the backend has no
        per-process figures."""
        out = ctypes.c_size_t()
        status = self._call(library().fragctl_process_device_memory_outside, ctypes.byref(out))
        if status == _capi.STATE:
            return None
        _capi.check(status)
        return out.value

    @contextlib.contextmanager
    def attributing(self, use: str, label: str) -> Iterator[None]:
        """Attributes to ``label`` the device memory the process takes
        outside fragctl while the ``with`` block runs (process_memory_outside
        before and after): wrap ``torch.distributed.init_process_group`` and
        a first collective (NCCL allocates its buffers lazily). Adds to what
        ``label`` held; does nothing without per-process figures."""
        before = self.process_memory_outside()
        yield
        after = self.process_memory_outside()
        if before is None or after is None or after <= before:
            return
        key = (self._handle.value, use, label)
        held = _attributed.get(key, 0) + (after - before)
        self.attribute_device_memory(use, label, held)
        _attributed[key] = held

    def report(self, path: Any) -> Any:
        """Writes a report document with this allocator's statistics and memory
        map to ``path`` (a str, bytes or os.PathLike); returns ``path``."""
        _capi.check(self._call(library().fragctl_write_report, _capi.path(path, "path")))
        return path

    def close(self) -> None:
        """Destroys the allocator (blocks still live are freed with a
        warning). Process defaults stay; this object is closed either way.
        Waits for calls other threads have in flight; later calls raise
        FragctlError. TooLateError (and the allocator stays open) while a
        checkpoint store or ZeRO-3 manager still uses it, or a block imported
        through it is open."""
        with self._closer:
            with self._guard:
                if not self._handle:
                    return
                self._closing = True
            try:
                while self._calls:
                    time.sleep(0.0002)
                if self._owned:
                    _capi.check(library().fragctl_destroy(self._handle))
                    self._finalizer.detach()
                self._handle = ctypes.c_void_p()
            finally:
                self._closing = False

    def __enter__(self) -> "Allocator":
        return self

    # A copy would share the C allocator and the original's finalizer: the
    # first to go destroyed it under the other (SIGSEGV, or a double destroy).
    def __copy__(self) -> "Allocator":
        raise TypeError("fragctl.Allocator cannot be copied: it owns a device allocator; share the object itself")

    def __deepcopy__(self, memo: Any) -> "Allocator":
        return self.__copy__()

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError("fragctl.Allocator cannot be pickled: it owns a device allocator in this process")

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return "fragctl.Allocator(%r)" % (self.policy if self._handle else "closed")


def _destroy_dropped(handle: int) -> None:
    """weakref.finalize callback of an Allocator collected without close().
    Nothing can be calling it (a call holds a reference); a store or
    manager on it holds one too, so fragctl_destroy is not refused."""
    try:
        library().fragctl_destroy(handle)
    except Exception:  # noqa: BLE001 (a finalizer must not raise; the library may be unloading)
        pass


def configure(policy: Optional[str] = None, backend: Optional[str] = None, **options: OptionValue) -> None:
    """Sets how the process-default allocators (one per device, used by
    fragctl.torch and the LD_PRELOAD library) are built: the environment's
    FRAGCTL_* configuration with ``policy``, ``backend`` and ``options``
    applied on top. Must run before the first allocation (TooLateError);
    validates everything now (ConfigurationError)."""
    conf = _capi.options_string(options) if options else None
    _capi.check(library().fragctl_configure_defaults(_capi.text(policy, "policy"), _capi.text(conf, "options"),
                                                     _capi.text(backend, "backend")))


def default_allocator(device: int = 0, create: bool = True) -> Optional[Allocator]:
    """The process-default Allocator of ``device``; None if it does not
    exist and ``create`` is False."""
    handle = ctypes.c_void_p()
    _capi.check(library().fragctl_default_allocator(_capi.device(device), 1 if create else 0, ctypes.byref(handle)))
    return Allocator._wrap(handle) if handle.value else None


def _current_device() -> int:
    import sys
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return torch.cuda.current_device()
    except Exception:  # a torch without CUDA, or a stand-in
        pass
    return 0


def stats(device: Optional[int] = None) -> Dict[str, Any]:
    """Statistics of the process-default allocator of ``device`` (default:
    PyTorch's current device, else 0) as a dict (docs/statistics.md). Raises
    FragctlError when nothing was allocated through fragctl on it yet."""
    device = _current_device() if device is None else device
    allocator = default_allocator(device, create=False)
    if allocator is None:
        raise FragctlError("fragctl: no allocation went through fragctl on device %d yet "
                           "(call fragctl.torch.enable() before using CUDA, or LD_PRELOAD libfragctl_preload.so)"
                           % device, "FRAGCTL_ERROR_STATE")
    return allocator.stats()


def flush() -> None:
    """Writes now what fragctl holds for later: buffered trace rows
    (FRAGCTL_TRACE) and the FRAGCTL_REPORT / FRAGCTL_PROMETHEUS files of live
    allocators, as at exit. Call it before ``os._exit()`` (multiprocessing
    workers end that way), which skips the exit hook. Raises FragctlError
    when a file could not be written."""
    _capi.check(library().fragctl_flush())


def report(path: Any) -> Any:
    """Writes the report of every process-default allocator (one per device
    used) to ``path`` (a str, bytes or os.PathLike; docs/statistics.md, "The
    report file"); returns ``path``."""
    _capi.check(library().fragctl_write_default_report(_capi.path(path, "path")))
    return path
