"""PyTorch: every CUDA tensor allocated through fragctl.

    import torch, fragctl.torch
    fragctl.torch.enable("arena")          # before anything touches CUDA
    ... train ...
    print(torch.cuda.memory_stats())       # answered by fragctl

Two routes (docs/pytorch.md):

* ``native`` (the default where a C++ compiler is present): a C++
  implementation of PyTorch's whole allocator interface over fragctl
  (``fragctl/_native/torch_allocator.cpp``), compiled against the installed
  torch on first use and cached. Every ``torch.cuda`` memory call is
  answered by fragctl: ``memory_stats`` and friends, ``empty_cache``,
  ``set_per_process_memory_fraction``, ``Tensor.record_stream``, CUDA graph
  pools (``torch.cuda.graph``, ``torch.compile(mode="reduce-overhead")``),
  ``cacheInfo`` (``cudnn.benchmark``) and memory_viz snapshots.
* ``pluggable`` (the fallback): ``torch.cuda.memory.CUDAPluggableAllocator``
  over libfragctl's ``fragctl_torch_alloc`` / ``fragctl_torch_free``. PyTorch
  forwards only allocate and free on this route; what it loses is said once
  when it is enabled (``PLUGGABLE_LOSSES``).

Services on top (docs/torch-services.md): ``offload_activations`` keeps the
tensors autograd saves for backward in fragctl's activation-checkpoint store
under a device budget, the rest in pinned host memory;
``fragctl.torch.zero3.shard`` partitions a model over torch.distributed
ranks in fragctl's ZeRO-3 block manager.
"""
import sys

from .. import _capi
from .. import configure as _configure
from . import _runtime
from ._memory import nccl_memory  # noqa: F401  (re-exported)
from ._runtime import _torch
from .offload import offload_activations  # noqa: F401  (re-exported)

_enabled = None  # the policy enabled in this process
_route = None  # "native" or "pluggable"

PLUGGABLE_LOSSES = (
    "torch.cuda.memory_stats(), memory_allocated(), max_memory_*(), memory_summary(), reset_peak_memory_stats() "
    "raise; Tensor.record_stream() is ignored, so a tensor freed while another stream still uses it can be "
    "overwritten (synchronize such streams yourself); torch.cuda.empty_cache() and "
    "set_per_process_memory_fraction() do nothing (use fragctl.default_allocator(d).release_cached() and the "
    "`limit` option); torch.compile(mode='reduce-overhead'), cudnn.benchmark and memory snapshots fail")


# The oldest torch each route works with (docs/pytorch.md "Versions").
# pluggable: torch.cuda.memory.CUDAPluggableAllocator and
# change_current_allocator came in 2.0. native: torch_allocator.cpp
# implements the CUDAAllocator interface as of 2.11, the version it is
# tested with; that interface changes between releases.
MINIMUM_TORCH = {"pluggable": (2, 0), "native": (2, 11)}


def _version_tuple(version):
    """(major, minor) of a torch version string ("2.11.0+cu130" -> (2, 11))."""
    parts = []
    for piece in str(version).split("+")[0].split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit()) if piece else ""
        parts.append(int(digits) if digits else 0)
    return tuple(parts + [0] * (2 - len(parts)))


def _version_gap(torch, route):
    """None when this torch has what ``route`` needs, else a sentence saying
    which version was found and which is needed."""
    needed = MINIMUM_TORCH[route]
    found = _version_tuple(getattr(torch, "__version__", "0"))
    if found >= needed:
        return None
    return ("the %s route needs torch >= %d.%d, and this is torch %s"
            % (route, needed[0], needed[1], getattr(torch, "__version__", "of an unknown version")))


def enabled():
    """The policy fragctl.torch.enable installed in this process, or None."""
    return _enabled


_runtime.answer_enabled(enabled)  # the services ask fragctl.torch._runtime.enabled()


def route():
    """The route enable() installed: "native", "pluggable", or None."""
    return _route


def _native_allocator(torch, backend, options):
    """The native route's allocator; its pools are made with the process-default
    allocators' ``backend`` and ``options`` (enable()'s, on top of the environment)."""
    from .. import _native
    from ._pools import native_pool_configuration
    module = _native.load()
    allocator = module.allocator(_capi.library_path())
    module.configure_pools(*native_pool_configuration(backend, options))
    return torch.cuda.memory._CUDAAllocator(allocator)


def enable(policy="arena", backend=None, route="auto", **options):
    """Makes PyTorch allocate CUDA memory through fragctl with ``policy``.

    Call it before the first CUDA allocation, ideally right after
    ``import torch``: PyTorch cannot swap its allocator once CUDA is
    initialized, and then this raises fragctl.TooLateError. ``options`` are
    FRAGCTL_CONF keys (``release_threshold="1GiB"``, ``report="run.json"``,
    ``warmup_profile="run1.json"``), applied on top of the FRAGCTL_*
    environment; a bad one raises fragctl.ConfigurationError now.

    ``route``: "native" (PyTorch's whole allocator interface, compiled on
    first use; raises if it cannot be built), "pluggable" (allocate and free
    only), or "auto" (native, else pluggable with one warning that says why
    and what is lost). ``FRAGCTL_TORCH_ROUTE`` overrides "auto". One line on
    stderr says which route is active. Calling it again with the same policy
    does nothing. Returns the installed torch allocator object.
    """
    global _enabled, _route
    import os
    source = "fragctl.torch.enable(route=%r)" % (route,)
    if route == "auto":
        # An empty variable is unset (auto); a bad one is named, not blamed on
        # an argument the caller never passed.
        route = os.environ.get("FRAGCTL_TORCH_ROUTE") or "auto"
        source = "FRAGCTL_TORCH_ROUTE=%r" % (route,)
    if route not in ("auto", "native", "pluggable"):
        raise _capi.ConfigurationError("%s: expected 'auto', 'native' or 'pluggable'" % source,
                                       "FRAGCTL_ERROR_INVALID_ARGUMENT")
    torch = _torch()
    if _enabled is not None:
        if _enabled == policy:
            return None
        raise _capi.TooLateError("fragctl.torch.enable(%r): fragctl is already enabled with policy %r in this process"
                                 % (policy, _enabled), "FRAGCTL_ERROR_STATE")
    if torch.cuda.is_initialized():
        raise _capi.TooLateError(
            "fragctl.torch.enable() must run before PyTorch initializes CUDA, and CUDA is initialized already "
            "(a tensor was put on the GPU, or torch.cuda was queried). Call it right after `import torch`, "
            "or use LD_PRELOAD=libfragctl_preload.so with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync.",
            "FRAGCTL_ERROR_STATE")
    gap = _version_gap(torch, "pluggable")
    if gap is not None:
        raise _capi.FragctlError("fragctl.torch.enable(): %s (use LD_PRELOAD=libfragctl_preload.so, or "
                                 "`fragctl run`, with older torch)" % gap, "FRAGCTL_ERROR_STATE")
    native_gap = _version_gap(torch, "native")
    if route == "native" and native_gap is not None:
        raise _capi.FragctlError("fragctl.torch.enable(route='native'): %s" % native_gap, "FRAGCTL_ERROR_STATE")
    if route in ("auto", "native") and native_gap is None:
        # The native backend frees by pointer alone: fragctl keeps each live block's size and stream.
        options.setdefault("block_table", True)
    _configure(policy=policy, backend=backend, **options)
    allocator = None
    why_not_native = native_gap
    if route in ("auto", "native") and native_gap is None:
        try:
            allocator = _native_allocator(torch, backend, options)
        except Exception as e:  # a missing compiler, headers or ninja: say so, fall back
            if route == "native":
                raise _capi.FragctlError("fragctl.torch.enable(route='native'): the native PyTorch backend cannot "
                                         "be built here: %s" % e, "FRAGCTL_ERROR_STATE") from e
            why_not_native = "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[-1] if str(e).strip() else "")
    chosen = "native" if allocator is not None else "pluggable"
    if allocator is None:
        allocator = torch.cuda.memory.CUDAPluggableAllocator(_capi.library_path(), "fragctl_torch_alloc",
                                                             "fragctl_torch_free")
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as e:
        raise _capi.TooLateError("fragctl.torch.enable(): PyTorch refused to swap its allocator (%s); call enable() "
                                 "before the first CUDA allocation" % e, "FRAGCTL_ERROR_STATE") from e
    _enabled = policy
    _route = chosen
    import atexit
    atexit.register(_flush_while_cuda_lives)
    if chosen == "native":
        print("fragctl: PyTorch allocates through fragctl (%s, native backend)" % policy, file=sys.stderr)
    else:
        reason = ("the native backend is not used (%s); " % why_not_native) if why_not_native else ""
        print("fragctl: PyTorch allocates through fragctl (%s, pluggable route): %son this route %s"
              % (policy, reason, PLUGGABLE_LOSSES), file=sys.stderr)
    return allocator



def _flush_while_cuda_lives():
    """Writes the FRAGCTL_REPORT files at interpreter exit, before the CUDA
    runtime's own exit handlers run: the device memory and its split can be
    measured now, not in the exit hook that writes the files last (which
    keeps these figures; docs/reports.md)."""
    try:
        _capi.library().fragctl_flush()
    except Exception:  # a report path that cannot be written says so itself
        pass

_regions = {}  # (tag, device) -> the torch.cuda.MemPool of fragctl.torch.region(tag) there


def _device_index(torch, device):
    return torch.cuda.current_device() if device is None else torch.device("cuda", device).index


def region(tag):
    """``with fragctl.torch.region(tag):`` allocates the CUDA tensors made
    inside (on the current device, by this thread) in a region of fragctl's
    memory of its own, so that ``pause(tag=tag)`` can hand exactly them back
    to the GPU while everything else stays (a trainer's weights and optimizer
    state while an inference engine in the same process keeps its memory).
    A region is a ``torch.cuda.MemPool`` whose allocator is a fragctl
    ``arena``; entering it again reuses it. Needs enable() on the native
    route."""
    torch = _torch()
    if _enabled is None or _route != "native":
        raise _capi.TooLateError("fragctl.torch.region(): needs fragctl.torch.enable() on the native route (this "
                                 "process: %s)" % ("route %s" % _route if _enabled else "not enabled"),
                                 "FRAGCTL_ERROR_STATE")
    key = (str(tag), torch.cuda.current_device())
    pool = _regions.get(key)
    if pool is None:
        from .. import _native
        module = _native.load()
        module.arm_region(key[0])
        try:
            pool = torch.cuda.MemPool()
        finally:
            module.arm_region("")
        _regions[key] = pool
    return torch.cuda.use_mem_pool(pool)


def _pausable(call, device, tag):
    """(torch, device index, the fragctl.Allocator pause/resume act on)."""
    torch = _torch()
    if _enabled is None:
        raise _capi.TooLateError("fragctl.torch.%s(): fragctl.torch.enable() did not run in this process: PyTorch's "
                                 "memory is not fragctl's" % call, "FRAGCTL_ERROR_STATE")
    index = _device_index(torch, device)
    from .. import Allocator, default_allocator
    if tag is None:
        return torch, index, default_allocator(index)
    from .. import _native
    handle = _native.load().region_allocator(str(tag), index) if (str(tag), index) in _regions else 0
    if not handle:
        raise _capi.ConfigurationError("fragctl.torch.%s(tag=%r): no fragctl.torch.region(%r) on device %d"
                                       % (call, tag, tag, index), "FRAGCTL_ERROR_INVALID_ARGUMENT")
    import ctypes
    return torch, index, Allocator._wrap(ctypes.c_void_p(handle))


def pause(keep="none", device=None, tag=None):
    """Hands the device memory under fragctl's tensors on ``device``
    (default: the current one) back to the GPU, keeping every tensor's
    address, so that another process or library can use it; ``resume()``
    maps fresh memory at the same addresses. ``tag=None`` pauses every
    tensor of the device's default allocator (all of fragctl's memory there
    but regions and graph pools); ``tag=T`` only those allocated under
    ``with fragctl.torch.region(T):``, and allocations elsewhere go on.
    ``keep="host"`` copies the contents to pinned host memory first and
    resume() writes them back; with ``"none"`` they are undefined after
    resume (e.g. a KV cache to be refilled). Waits for the device's queued
    work first. Until resume() nothing can be allocated in what is paused
    (PyTorch raises RuntimeError); tensors can be freed. Needs enable() with the
    ``arena`` policy (a region is always an arena). CUDA graph pools keep
    their memory (docs/interop.md, "Pause and resume")."""
    torch, index, allocator = _pausable("pause", device, tag)
    torch.cuda.synchronize(index)
    allocator.pause(keep)


def resume(device=None, tag=None):
    """Maps fresh device memory under every tensor pause() released (of
    region ``tag``, or of the default allocator), at the same addresses,
    restoring the contents pause(keep="host") kept; tensors and CUDA graphs
    captured before the pause work as before. Raises
    fragctl.OutOfMemoryError while the device cannot give the memory back
    (another process still holds it); then it stays paused and resume() may
    be called again."""
    _, _, allocator = _pausable("resume", device, tag)
    allocator.resume()


def forwarded_pools(device=None):
    """The memory on ``device`` (default: the current one) in
    ``torch.cuda.MemPool(allocator=X)`` pools, whose allocations fragctl
    forwards to another library's allocator X (the NCCL backend's
    ``mem_allocator``, vLLM's CuMemAllocator): a dict of ``pools``,
    ``blocks`` (X's allocations held), ``live_bytes`` (requested by live
    tensors), ``held_bytes`` (X's blocks, live and kept for reuse) and
    ``cached_bytes`` (kept for reuse). That memory is X's: it is not in
    fragctl's statistics (torch.cuda.memory_stats, fragctl.stats). Needs
    enable() on the native route; all zeros before any such pool."""
    torch = _torch()
    if _enabled is None or _route != "native":
        return {"pools": 0, "blocks": 0, "live_bytes": 0, "held_bytes": 0, "cached_bytes": 0}
    from .. import _native
    return dict(_native.load().forwarded(_device_index(torch, device)))
