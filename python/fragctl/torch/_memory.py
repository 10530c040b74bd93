"""The device memory torch.distributed's NCCL process group takes, for the
split of the device memory that is not fragctl's (docs/reports.md).

NCCL allocates its communicators and buffers itself, not through fragctl,
and lazily: a peer's buffers at the first collective with it. What the
process took outside fragctl while ``init_process_group`` and a first
collective ran (NVML's per-process figure less fragctl's reserved bytes,
before and after) is that group's, and is attributed to it in every report
of the device.
"""
import contextlib
from typing import Iterator, Optional

from .. import _api
from ._runtime import _torch


@contextlib.contextmanager
def nccl_memory(label: str = "torch.distributed", device: Optional[int] = None) -> Iterator[None]:
    """Attributes to ``label`` the device memory the process takes outside
    fragctl while the block runs, on ``device`` (default: PyTorch's current
    CUDA device)::

        with fragctl.torch.nccl_memory("world"):
            dist.init_process_group("nccl")
            dist.barrier()  # NCCL connects and allocates at the first collective

    Does nothing where there are no per-process figures (no NVML, a
    container hiding this process's pid, the sim backend without them)."""
    if device is None:
        torch = _torch()
        device = torch.cuda.current_device() if torch.cuda.is_available() else 0
    allocator = _api.default_allocator(device)
    with allocator.attributing("nccl", label):
        yield
