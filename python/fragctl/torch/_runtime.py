"""What fragctl.torch's services (offload, zero3) need of its surface,
below both of them (layers.txt): PyTorch itself, imported on first use with
a message that says what to do without it, and the policy
fragctl.torch.enable() installed in this process.

That policy stays fragctl.torch's own state: as it is imported,
fragctl.torch hands its ``enabled`` function over (``answer_enabled``), and
the services ask ``enabled()`` here, so none of them imports the surface
above it.
"""


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("fragctl.torch needs PyTorch, which cannot be imported here (%s). Install torch, or use "
                          "fragctl without it: fragctl.Allocator, fragctl.stats(), LD_PRELOAD=libfragctl_preload.so"
                          % e) from e
    return torch


_enabled_query = None  # fragctl.torch.enabled, once fragctl.torch has handed it over


def answer_enabled(query):
    """fragctl.torch calls it once as it is imported: ``query()`` answers
    enabled() from then on."""
    global _enabled_query
    _enabled_query = query


def enabled():
    """The policy fragctl.torch.enable installed in this process, or None."""
    return _enabled_query() if _enabled_query is not None else None
