"""fragctl: GPU memory allocator and fragmentation control, from Python.

Pure Python over libfragctl.so's C API (ctypes): ``_capi`` binds it,
``_api`` holds Allocator and the process-default allocators' functions,
``_summary`` builds on them; this module exports them (layers.txt gives the
order, fragctl.torch above). The parts:

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
from ._capi import (ConfigurationError, FragctlError, LibraryNotFoundError, OutOfMemoryError, TooLateError,
                    library, library_path, preload_library)
from . import _capi
from ._api import (Allocator, OptionValue, configure, default_allocator, flush, policies, report, stats,  # noqa: F401
                   version)
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


def _hooks_at_import() -> None:
    """Loads libfragctl now when the environment may ask for outputs
    (FRAGCTL_REPORT, FRAGCTL_PROMETHEUS, FRAGCTL_TRACE, or FRAGCTL_CONF's
    report, prometheus and trace keys): the library then installs its process
    hooks as it loads (it decides from the same variables), so SIGUSR1 or
    SIGTERM sent before the first allocator is handled, not fatal (issue 27;
    docs/reliability.md, "Process lifecycle"). A library that cannot be
    loaded is reported at first use, as without these variables."""
    import os
    if any(os.environ.get(name) for name in ("FRAGCTL_REPORT", "FRAGCTL_PROMETHEUS", "FRAGCTL_TRACE", "FRAGCTL_CONF")):
        try:
            library()
        except FragctlError:
            return
        import atexit
        atexit.register(_flush_at_exit)


def _flush_at_exit() -> None:
    """Writes the outputs as the interpreter finalizes. After an uncaught
    KeyboardInterrupt CPython ends the process by SIGINT itself, past the C
    library's exit hooks; the flush fragctl's handler started on the signal
    runs on its own thread, so this one makes the last outputs certain."""
    try:
        flush()
    except FragctlError:
        pass  # the library logged which output and why


_hooks_at_import()
