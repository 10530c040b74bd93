"""fragctl: GPU memory allocator and fragmentation control, from Python.

Pure Python over libfragctl.so's C API (ctypes). The parts:

* ``fragctl.torch.enable(policy="arena", **options)``: PyTorch allocates
  every CUDA tensor through fragctl (docs/pytorch.md).
* ``fragctl.stats()``, ``fragctl.report(path)``, ``fragctl.summary(...)``:
  what the process-default allocators (PyTorch's, or the LD_PRELOAD
  library's) hold and how fragmented they are.
* ``fragctl.Allocator``: an allocator of your own, e.g. on the ``sim``
  backend to try a policy without a GPU.

Options are FRAGCTL_CONF keys as keyword arguments (docs/configuration.md):
sizes as byte counts or strings such as ``"512MiB"``, booleans, strings.
Arguments are checked before they reach C: a size or address outside
0..2**64-1 or a device outside the C int range is an OverflowError, a
negative one a ValueError, a non-integer a TypeError, a string with a NUL
byte a ValueError, an option set to None a TypeError.
"""
import ctypes
from typing import Any, Dict, List, Optional, Union

from ._capi import (ConfigurationError, FragctlError, LibraryNotFoundError, OutOfMemoryError, TooLateError,
                    library, library_path, preload_library)
from . import _capi
from ._summary import summary

try:
    from ._version import __version__  # written by the wheel build from CMakeLists.txt
except ImportError:  # imported from a checkout (PYTHONPATH=python): not installed
    __version__ = "0+checkout"

__all__ = [
    "Allocator", "ConfigurationError", "FragctlError", "LibraryNotFoundError", "OutOfMemoryError", "TooLateError",
    "__version__", "configure", "default_allocator", "flush", "library_path", "policies", "preload_library",
    "report", "stats",
    "summary", "version",
]

#: An option value: a byte count, a size string such as "512MiB", a bool or a string.
OptionValue = Union[int, float, str, bool]


def version() -> str:
    """libfragctl's version string."""
    return library().fragctl_version().decode()


def policies() -> List[str]:
    """Names of the policies a policy expression may use."""
    return library().fragctl_policy_names().decode().split(",")


class Allocator:
    """A fragctl allocator (a backend, a policy chain and its adaptors).

    ``Allocator("buckets:arena", backend="sim", sim_capacity="8GiB")``.
    ``policy`` None means the default for the backend; ``backend`` is
    "cuda", "hip", "sim" or None (auto); ``device`` -1 takes the options'.
    Usable as a context manager (closes on exit). Thread-safe.
    """

    def __init__(self, policy: Optional[str] = None, backend: Optional[str] = None, device: int = -1,
                 **options: OptionValue) -> None:
        handle = ctypes.c_void_p()
        args = (_capi.text(policy, "policy"), _capi.text(_capi.options_string(options), "options"),
                _capi.text(backend, "backend"), _capi.device(device, allow_unset=True))
        _capi.check(library().fragctl_create(*args, ctypes.byref(handle)))
        self._handle = handle
        self._owned = True

    @classmethod
    def _wrap(cls, handle: ctypes.c_void_p) -> "Allocator":
        self = cls.__new__(cls)
        self._handle = handle
        self._owned = False
        return self

    def _live(self):
        if not self._handle:
            raise FragctlError("allocator is closed", "FRAGCTL_ERROR_INVALID_ARGUMENT")
        return self._handle

    @property
    def policy(self) -> str:
        """The policy expression built, defaults filled in ("buckets:arena")."""
        return library().fragctl_policy(self._live()).decode()

    def malloc(self, nbytes: int, stream: int = 0) -> int:
        """Allocates ``nbytes`` usable on ``stream`` (an int handle; 0 = default stream). Returns the address."""
        out = ctypes.c_void_p()
        nbytes, stream = _capi.size(nbytes), _capi.address(stream, "stream")
        _capi.check(library().fragctl_malloc(self._live(), ctypes.byref(out), nbytes, stream))
        return out.value or 0

    def free(self, ptr: int, nbytes: int, stream: int = 0) -> None:
        """Frees ``ptr`` (of ``nbytes``) stream-ordered on ``stream``."""
        ptr, nbytes, stream = _capi.address(ptr, "ptr"), _capi.size(nbytes), _capi.address(stream, "stream")
        _capi.check(library().fragctl_free(self._live(), ptr, nbytes, stream))

    def release_cached(self) -> None:
        """Returns wholly free cached memory to the device."""
        _capi.check(library().fragctl_release_cached(self._live()))

    def stats(self) -> Dict[str, Any]:
        """Statistics as a dict (the JSON schema of docs/statistics.md)."""
        import json
        out = ctypes.c_void_p()
        _capi.check(library().fragctl_stats_json(self._live(), ctypes.byref(out)))
        return json.loads(_capi.take_string(out))

    def report(self, path: str) -> str:
        """Writes a report document with this allocator's statistics and memory map to ``path``; returns ``path``."""
        _capi.check(library().fragctl_write_report(self._live(), _capi.text(path, "path")))
        return path

    def close(self) -> None:
        """Destroys the allocator (every block must be freed). Process defaults stay."""
        if self._owned and self._handle:
            _capi.check(library().fragctl_destroy(self._handle))
        self._handle = ctypes.c_void_p()

    def __enter__(self) -> "Allocator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return "fragctl.Allocator(%r)" % (self.policy if self._handle else "closed")


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


def report(path: str) -> str:
    """Writes the report of every process-default allocator (one per device
    used) to ``path`` (docs/statistics.md, "The report file"); returns ``path``."""
    _capi.check(library().fragctl_write_default_report(_capi.text(path, "path")))
    return path
