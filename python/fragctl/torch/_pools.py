"""Which allocators a fragctl.torch service works on: the one answer to "the
allocator handle(s) for this service on this device", for
offload_activations and zero3.shard.

In order:

1. the caller's ``allocator``, if given: every role uses it;
2. else, while fragctl.torch.enable is active and the device is a GPU,
   PyTorch's own, the process-default allocator of that device, so that one
   pool serves tensors and the service;
3. else private allocators made here with fragctl_create, the policy,
   options, backend and device given explicitly (nothing is read from or
   written to the process environment on the way): the service owns them
   and closes them with ``Pools.close``. They are whole fragctl allocators,
   with statistics, thread safety, limits and reports.

A service asks for one role (offload: the store's region) or two
(ZeRO-3: long-lived memory and gathered blocks); the caller's and PyTorch's
allocator fill both, the private case makes one allocator per role.
"""
import os
from typing import Any, List, NamedTuple, Optional, Tuple

from .. import Allocator, _capi, default_allocator
from ._interop import require_memory


class Private(NamedTuple):
    """How to make a private allocator: fragctl_create's arguments, options
    as FRAGCTL_CONF text; ``from_environment``: they are the environment's
    (FRAGCTL_POLICY, FRAGCTL_CONF, FRAGCTL_BACKEND), which error messages
    then name."""

    policy: Optional[str]
    options: Optional[str]
    backend: Optional[str]
    device: int = -1
    from_environment: bool = False


class Pools:
    """The allocators of one service: ``long_lived`` and ``transient`` (one
    Allocator unless private ones were made per role), ``owned`` those made
    here, which ``close`` closes."""

    def __init__(self, roles: List[Allocator], owned: List[Allocator]) -> None:
        self._roles = roles
        self.owned = owned

    @property
    def long_lived(self) -> Allocator:
        return self._roles[0]

    @property
    def transient(self) -> Allocator:
        return self._roles[-1]

    def close(self) -> None:
        """Closes the private allocators (after the service that used them)."""
        owned, self.owned = self.owned, []
        for a in owned:
            a.close()


def open_pools(torch: Any, device: Any, who: str, given: Optional[Allocator], private: Private,
               roles: int = 1) -> Pools:
    """The allocators for a service (``who``, for messages) whose tensors
    live on ``device`` (a torch.device with its index): see the module's
    docstring. Raises fragctl.ConfigurationError when their memory cannot
    hold tensors on ``device`` (host memory for CPU tensors, GPU memory for
    CUDA ones), closing what it made."""
    if given is not None:
        pools = Pools([given], [])
    elif enabled_on(device):
        pools = Pools([default_allocator(device.index if device.index is not None else torch.cuda.current_device())],
                      [])
    else:
        owned: List[Allocator] = []
        pools = Pools(owned, owned)
        try:
            for _ in range(roles):
                owned.append(Allocator._from_text(private.policy, private.options, private.backend, private.device))
        except BaseException:
            pools.close()
            raise
    try:
        require_memory(pools.long_lived.memory_kind, device, who,
                       environment=bool(pools.owned) and private.from_environment)
    except BaseException:
        pools.close()
        raise
    return pools


def require_device(allocator: Allocator, device: Any, who: str) -> None:
    """Raises ValueError unless ``allocator`` is on ``device``'s GPU (its
    backend's device ordinal is the torch.device's index): a service's
    memory must be where its tensors are. CPU devices take any sim device."""
    if device.type != "cuda":
        return
    stats = allocator.stats()
    index = device.index if device.index is not None else 0
    if stats.get("device") != index:
        raise ValueError("%s: the allocator is on %s device %s, the model on %s" % (who, stats.get("backend"),
                                                                                   stats.get("device"), device))


def enabled_on(device: Any) -> bool:
    """Whether fragctl.torch.enable is active and ``device`` is a GPU (CUDA
    or HIP, both ``cuda`` to torch): PyTorch's allocator is fragctl's there."""
    from ._runtime import enabled
    return enabled() is not None and device.type == "cuda"


def zero3_private(device: Any, parameter_bytes: int) -> Private:
    """The private allocators of a ZeRO-3 manager for a model on ``device``
    holding ``parameter_bytes``: for a CPU model, unless FRAGCTL_BACKEND is
    set, caching allocators on sim in backed mode (8 x the parameters, at
    least 256 MiB); else the environment's policy, options and backend on
    the model's device."""
    if device.type == "cpu" and "FRAGCTL_BACKEND" not in os.environ:
        return Private("caching", "sim_backed:true,sim_capacity:%d" % max(8 * parameter_bytes, 256 << 20), "sim")
    return Private(os.environ.get("FRAGCTL_POLICY") or None, os.environ.get("FRAGCTL_CONF") or None,
                   os.environ.get("FRAGCTL_BACKEND") or None, device.index if device.type == "cuda" else -1,
                   from_environment=True)


def offload_private(backend: str, device: Any, budget: int) -> Private:
    """The private allocator of an activation store: caching on ``backend``,
    on sim in backed mode (real host memory that CPU tensors can alias) with
    room for the budget."""
    options = "sim_backed:true,sim_capacity:%d" % (budget + (64 << 20)) if backend == "sim" else None
    return Private("caching", options, backend, device.index or 0)


def offload_backend(torch: Any, backend: Optional[str], allocator_kind: Optional[str]) -> str:
    """The backend whose memory an activation store uses: ``backend`` if
    given; else the given allocator's ("sim" for host memory: its
    ``allocator_kind``); else "cuda" (or "hip" on ROCm torch) where a GPU is
    available, else "sim"."""
    if backend is not None:
        return backend
    if allocator_kind == "host":
        return "sim"
    if allocator_kind == "device" or torch.cuda.is_available():
        return "hip" if getattr(torch.version, "hip", None) else "cuda"
    return "sim"


def offload_target(torch: Any, backend: Optional[str], device: Optional[int],
                   allocator_kind: Optional[str]) -> Tuple[str, Any]:
    """(backend, torch.device whose tensors move) of an activation store
    (offload_backend); the device always carries its index ("cuda:0", never
    "cuda"), the form a tensor's ``.device`` has: ``device``, else the
    current one."""
    backend = offload_backend(torch, backend, allocator_kind)
    if backend == "sim":
        return backend, torch.device("cpu")
    return backend, torch.device("cuda", torch.cuda.current_device() if device is None else device)


def for_pools(key: str) -> bool:
    """Whether FRAGCTL_CONF key ``key`` of the process-default allocators is
    also the native route's pools': the backend's (``sim_*``) and
    ``thread_safe``. A pool's policy is its kind's, not enable()'s, so the
    policies' own keys (release_threshold, max_split_size, ...) would only be
    ignored there, with a warning per pool; the outputs (report, trace), the
    cap, the pre-reservation, the device and the live-block table are the
    process's or the device allocator's."""
    return key.startswith("sim_") or key == "thread_safe"


def native_pool_configuration(backend: Optional[str], options: dict,
                              environ: Any = os.environ) -> Tuple[str, str]:
    """(options, backend) of the allocators the native route makes for CUDA
    graph pools, MemPools and regions, from the configuration of the
    process-default allocators fragctl.torch.enable builds: FRAGCTL_CONF,
    then enable()'s ``options`` (a later key wins), the keys ``for_pools``
    keeps; enable()'s ``backend``, else FRAGCTL_BACKEND. Options are
    FRAGCTL_CONF text, "" for none; backend "" means "auto". The pool's
    policy is its kind's (graph_pool:caching, or arena for a region)."""
    items = []
    for text in (environ.get("FRAGCTL_CONF", ""), _capi.options_string(options) if options else ""):
        for item in text.split(","):
            item = item.strip()
            if item and for_pools(item.split(":", 1)[0].strip()):
                items.append(item)
    return ",".join(items), backend or environ.get("FRAGCTL_BACKEND") or ""
