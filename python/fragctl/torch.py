"""PyTorch: every CUDA tensor allocated through fragctl.

    import torch, fragctl.torch
    fragctl.torch.enable("arena")          # before anything touches CUDA
    ... train ...
    print(fragctl.stats()["derived"])      # torch.cuda.memory_stats() does not
                                           # work with a pluggable allocator

``enable`` installs a ``torch.cuda.memory.CUDAPluggableAllocator`` whose
functions are libfragctl.so's ``fragctl_torch_alloc`` / ``fragctl_torch_free``:
one process-default allocator per device, stream-ordered on the stream
PyTorch allocates on. docs/pytorch.md has the details and the limits
(``Tensor.record_stream`` and ``torch.cuda.empty_cache`` are not forwarded
by PyTorch to pluggable allocators).
"""
from . import _capi
from . import configure as _configure

_enabled = None  # the policy enabled in this process


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("fragctl.torch needs PyTorch, which cannot be imported here (%s). Install torch, or use "
                          "fragctl without it: fragctl.Allocator, fragctl.stats(), LD_PRELOAD=libfragctl_preload.so"
                          % e) from e
    return torch


def enabled():
    """The policy fragctl.torch.enable installed in this process, or None."""
    return _enabled


def enable(policy="arena", backend=None, **options):
    """Makes PyTorch allocate CUDA memory through fragctl with ``policy``.

    Call it before the first CUDA allocation, ideally right after
    ``import torch``: PyTorch cannot swap its allocator once CUDA is
    initialized, and then this raises fragctl.TooLateError. ``options`` are
    FRAGCTL_CONF keys (``release_threshold="1GiB"``, ``report="run.json"``,
    ``warmup_profile="run1.json"``), applied on top of the FRAGCTL_*
    environment; a bad one raises fragctl.ConfigurationError now. Calling it
    again with the same policy does nothing. Returns the
    CUDAPluggableAllocator.
    """
    global _enabled
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
    _configure(policy=policy, backend=backend, **options)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(_capi.library_path(), "fragctl_torch_alloc",
                                                         "fragctl_torch_free")
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as e:
        raise _capi.TooLateError("fragctl.torch.enable(): PyTorch refused to swap its allocator (%s); call enable() "
                                 "before the first CUDA allocation" % e, "FRAGCTL_ERROR_STATE") from e
    _enabled = policy
    return allocator
