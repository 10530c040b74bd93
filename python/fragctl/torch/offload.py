"""Activation offload: autograd's saved tensors in fragctl's checkpoint store.

``offload_activations`` is a context manager over
``torch.autograd.graph.saved_tensors_hooks`` (docs/torch-services.md). Every
tensor autograd saves for backward while it is active, on the store's device,
of at least ``min_bytes``, and not a parameter (nor a view of one), is copied
into the store (fragctl/checkpoint/checkpoint.h) and the original is left to
autograd's reference counting: the store keeps it in its device region
while the budget allows and otherwise in pinned host memory, copied out on
its own copy stream without a host synchronization, and brings it back ahead
of need in backward (prefetch in reverse order of the saves).

Saves made while a backward pass runs (a recomputing checkpoint's forward,
or anything else autograd saves inside backward) stay where autograd keeps
them by default: the same backward uses them moments later, so moving them
would cost two copies and free nothing at the peak. A backward that builds
a graph for a later one (``create_graph=True``, double backward) saves for
that later backward: pass ``keep_backward_saves=False`` to move those too.

Identity of a saved tensor: its position in the sequence of saves since the
store's last reset (a "layer" of the store), so that the sequence repeats
from one training step to the next and the store can plan evictions one save
early from the second step. A tensor autograd saves more than once (the
log-probabilities of ``cross_entropy`` are saved by its log-softmax and by
its nll-loss) is moved once: a later save of the same tensor (the same
memory, shape, strides and dtype, still alive and not modified in place
since) shares the first one's entry, and an unpack while another unpack's
result is alive returns that result, as autograd does without hooks.

Lifetime: a saved tensor is dropped from the store when autograd frees it
(backward without ``retain_graph``, or the graph going away); when a ``with``
block begins and nothing saved earlier is alive, the store ends its
iteration (reset). Unpacking copies the tensor out of the store into a fresh
tensor on the current stream, so nothing autograd holds ever aliases store
memory that a later prefetch may reuse.

Threads: the hooks may run on autograd's worker threads; one lock
serializes every call into the store.
"""
import ctypes
import json
import threading
import weakref
from typing import Any, Callable, Dict, Optional, Tuple, Union

from .. import Allocator, _capi
from ._runtime import _torch
from ._deepspeed import ConfigSource, DeepSpeedKeyNote, activation_checkpointing  # noqa: F401 (DeepSpeedKeyNote: API)
from ._interop import backward_running, current_stream, require_memory, stream_context, wrap
from ._pools import offload_backend, offload_private, offload_target, open_pools

Size = Union[int, str]

# fragctl_checkpoint_residence values.
_RESIDENCE = {0: "absent", 1: "device", 2: "host"}

_entered = threading.local()  # .stack: the offload_activations blocks this thread is inside


def active() -> Optional["offload_activations"]:
    """The innermost offload_activations block this thread is inside (with
    hooks installed), or None. fragctl.torch.zero3 hands it the saved tensors
    its own hook does not keep, so that the two compose."""
    stack = getattr(_entered, "stack", None)
    return stack[-1] if stack else None


_alignment = 0


def _store_alignment() -> int:
    """What the store rounds its budget and every checkpoint up to
    (docs/checkpoint.md): held once, in the library
    (fragctl_checkpoint_alignment), read on first use."""
    global _alignment
    if not _alignment:
        _alignment = _capi.library().fragctl_checkpoint_alignment()
    return _alignment


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


class _OnHost:
    """What the pack hook returns for a tensor that went straight to the host."""

    __slots__ = ("owner", "tensor", "generation", "unpacked", "__weakref__")

    def __init__(self, owner: "offload_activations", tensor: Any) -> None:
        self.owner = owner  # whose _unpack brings it back (fragctl.torch.zero3 asks for it)
        self.tensor = tensor
        self.generation = owner._generation
        self.unpacked: Optional[Callable[[], Any]] = None  # weak: the tensor the last unpack returned


class _Saved:
    """What the pack hook returns for a tensor moved into the store."""

    __slots__ = ("owner", "generation", "layer", "nbytes", "shape", "dtype", "unpacked", "host", "__weakref__")

    def __init__(self, owner: "offload_activations", layer: int, nbytes: int, shape: Any, dtype: Any) -> None:
        self.owner = owner
        self.generation = owner._generation
        self.layer = layer
        self.nbytes = nbytes
        self.shape = shape
        self.dtype = dtype
        self.unpacked: Optional[Callable[[], Any]] = None  # weak: the tensor the last unpack returned
        self.host: Optional[Any] = None  # its bytes on the host once dropped from the store (_spill_got)

    def __del__(self) -> None:
        owner = self.owner
        if owner is not None:
            owner._release(self)


class offload_activations:
    """Keeps the tensors autograd saves for backward in fragctl's
    activation-checkpoint store, under a device budget.

    ::

        offload = fragctl.torch.offload_activations(budget="8GiB")
        for batch in loader:
            with offload:
                loss = model(batch)
                loss.backward()

    One object serves every step (the store's device region is allocated
    once, on first entry, and the store plans evictions from the second step
    on); ``with fragctl.torch.offload_activations("8GiB"): ...`` works too,
    but builds a new store each time. ``backward`` may run inside or after
    the ``with`` block.

    Args:
        budget: device bytes for saved tensors (an int, or a size string such
            as ``"8GiB"``): the size of the store's region, allocated once and
            never exceeded; at least the largest tensor moved.
        min_bytes: tensors smaller than this stay where autograd keeps them.
        prefetch_depth: saved tensors fetched back ahead of need in backward
            (0: each is fetched when unpacked).
        evict_ahead: from the second step, make room for the next save one
            save early, so the copy overlaps compute.
        keep_backward_saves: tensors saved while a backward pass runs (a
            recomputing checkpoint) stay where autograd keeps them. False
            moves them too: for a backward with
            ``create_graph=True`` whose saves serve a later backward.
        config: a DeepSpeed ``ds_config.json`` (a path or a dict) or its
            ``activation_checkpointing`` block: the DeepSpeed keys below are
            read from it, keys absent from it at DeepSpeed's defaults (so
            ``cpu_checkpointing`` false, no offload, unless the block sets it);
            the keywords below override it. One DeepSpeedKeyNote warning lists
            the values taken without DeepSpeed's effect and what fragctl does
            instead.
        cpu_checkpointing: DeepSpeed's key. True (the default without
            ``config``) offloads what does not fit the budget to pinned host
            memory; False installs no hooks, so activations stay where autograd
            keeps them.
        contiguous_memory_optimization: DeepSpeed's key. The store always
            keeps device copies in one contiguous region; False is taken with
            the note.
        partition_activations: DeepSpeed's key for splitting activations over
            model-parallel ranks, which this store does not do; True is
            refused.
        synchronize_checkpoint_boundary: DeepSpeed's key. True makes the host
            wait for the store's copies at the end of each ``with`` block.
        number_checkpoints: DeepSpeed's key (it sizes DeepSpeed's contiguous
            buffers); taken with the note: the budget sizes the region.
        profile: DeepSpeed's key; True (per-checkpoint timing logs) is
            refused, ``stats()`` is the store's profile.
        allocator: the fragctl.Allocator the region comes from. Default: the
            process-default allocator of the device when
            ``fragctl.torch.enable`` is active, else a private ``caching``
            allocator on ``backend``.
        backend: "cuda", "hip" or "sim" for the private allocator; default
            "cuda" (or "hip" on ROCm torch) where a GPU is available, else
            "sim" in backed mode, where "device" tensors are CPU tensors (for
            tests without a GPU).
        device: the CUDA device index (default: the current device).

    Raises:
        TypeError: a budget or size of the wrong type.
        ValueError: a size below 1 byte, an unsupported DeepSpeed key value.
        fragctl.ConfigurationError: a size string that does not parse; a
            DeepSpeed config that cannot be read, holds an unknown key or a
            value fragctl cannot honour (named with the reason and the file).
        fragctl.OutOfMemoryError: the region cannot be allocated. A tensor
            larger than the budget, or one that finds the rest of the region
            in use, is copied straight to (pinned) host memory instead and
            counted in ``stats()["tensors_to_host_direct"]``.
    """

    def __init__(self, budget: Size = "8GiB", *, config: ConfigSource = None, min_bytes: Size = "1MiB",
                 prefetch_depth: int = 2, evict_ahead: bool = True, keep_backward_saves: bool = True,
                 cpu_checkpointing: Optional[bool] = None, contiguous_memory_optimization: Optional[bool] = None,
                 partition_activations: Optional[bool] = None, synchronize_checkpoint_boundary: Optional[bool] = None,
                 number_checkpoints: Optional[int] = None, profile: Optional[bool] = None,
                 allocator: Optional[Allocator] = None, backend: Optional[str] = None,
                 device: Optional[int] = None) -> None:
        self.budget = _capi.parse_size(budget, "budget")
        if self.budget == 0:
            raise ValueError("fragctl.torch.offload_activations: budget=%r: the store needs at least one byte" % budget)
        self.min_bytes = _capi.parse_size(min_bytes, "min_bytes")
        self.prefetch_depth = _capi.size(prefetch_depth, "prefetch_depth")
        for name, value in (("evict_ahead", evict_ahead), ("keep_backward_saves", keep_backward_saves)):
            if not isinstance(value, bool):
                raise TypeError("fragctl.torch.offload_activations: %s must be a bool, got %r" % (name, value))
        deepspeed, self.notes = activation_checkpointing(config, {
            "cpu_checkpointing": cpu_checkpointing, "contiguous_memory_optimization": contiguous_memory_optimization,
            "partition_activations": partition_activations,
            "synchronize_checkpoint_boundary": synchronize_checkpoint_boundary,
            "number_checkpoints": number_checkpoints, "profile": profile}, "fragctl.torch.offload_activations")
        if backend is not None and backend not in ("cuda", "hip", "sim"):
            raise ValueError("fragctl.torch.offload_activations: backend=%r: expected 'cuda', 'hip', 'sim' or None"
                             % (backend,))
        if device is not None:
            device = _capi.device(device)
        if allocator is not None and not isinstance(allocator, Allocator):
            raise TypeError("fragctl.torch.offload_activations: allocator must be a fragctl.Allocator, got %s"
                            % type(allocator).__name__)
        self.evict_ahead = evict_ahead
        self.keep_backward_saves = keep_backward_saves
        self.cpu_checkpointing = deepspeed["cpu_checkpointing"]
        self.synchronize_checkpoint_boundary = deepspeed["synchronize_checkpoint_boundary"]
        self._torch = _torch()
        self._requested_backend = backend
        self._requested_device = device
        self._allocator = allocator
        # The store's tensors live in the allocator's blocks, so its memory
        # decides their device, and memory that none can live in is refused
        # (issue 27 H4: a sim allocator without memory behind its addresses
        # crashed the process).
        self._allocator_kind = allocator.memory_kind if allocator is not None else None
        if allocator is not None:
            store_backend = offload_backend(self._torch, backend, self._allocator_kind)
            require_memory(self._allocator_kind, self._torch.device("cpu" if store_backend == "sim" else "cuda"),
                           "fragctl.torch.offload_activations")
        self._pools = None  # the store's allocator (_pools.open_pools) while open
        self._store = None  # ctypes.c_void_p
        self._device = None  # the torch.device whose tensors move
        self._lock = threading.RLock()
        self._generation = 0  # bumped by reset and close: older handles are stale
        self._next_layer = 0
        self._live = 0  # handles of this generation alive
        self._hooks = []  # saved_tensors_hooks entered, innermost last
        self._moved = 0
        self._kept = 0
        self._kept_in_backward = 0  # saved while backward ran (recompute): left in place
        self._direct = 0  # tensors the region could not take, copied straight to the host
        self._direct_bytes = 0
        self._shared = 0  # saves of a tensor already in the store this step: no second copy
        self._spilled = 0  # checkpoints an unpack had pinned, moved to the host to make room (_spill_got)
        # layer -> (weak _Saved, pointer, stream): checkpoints an unpack got and
        # autograd still holds; the store keeps each in the region until its drop.
        self._got: Dict[int, Tuple[Any, int, Optional[int]]] = {}
        # (address, shape, strides, dtype) -> (weak original, its version, weak _Saved), this generation.
        self._packed: Dict[Tuple[Any, ...], Tuple[Any, int, Any]] = {}

    # --- the store --------------------------------------------------------

    def _resolve(self) -> Tuple[str, Any]:
        """(backend, torch.device whose tensors move) as _open will choose
        them (_pools.offload_target)."""
        return offload_target(self._torch, self._requested_backend, self._requested_device, self._allocator_kind)

    def _open(self) -> None:
        backend, self._device = self._resolve()
        pools = open_pools(self._torch, self._device, "fragctl.torch.offload_activations", self._allocator,
                           offload_private(backend, self._device, self.budget))
        handle = ctypes.c_void_p()
        try:
            _capi.check(pools.long_lived._call(_capi.library().fragctl_checkpoint_create, self.budget,
                                               self.prefetch_depth, int(self.evict_ahead), ctypes.byref(handle)))
        except BaseException:
            pools.close()  # no store: a private allocator goes too
            raise
        self._store = handle
        self._pools = pools
        self._allocator = pools.long_lived

    def close(self) -> None:
        """Frees the store (waiting for its copies) and its region. Tensors
        saved and not yet unpacked can no longer be unpacked afterwards."""
        with self._lock:
            if self._store is not None:
                _capi.library().fragctl_checkpoint_destroy(self._store)
                self._store = None
                self._generation += 1
                self._live = 0
                self._got.clear()
            if self._pools is not None:
                if self._pools.owned:
                    self._allocator = None
                self._pools.close()
                self._pools = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass

    # --- the context --------------------------------------------------------

    def __enter__(self) -> "offload_activations":
        if not self.cpu_checkpointing:
            self._hooks.append(None)
            return self
        with self._lock:
            if self._store is None:
                self._open()
            elif self._live == 0 and self._next_layer > 0:
                self._reset()
        hooks = self._torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        hooks.__enter__()
        self._hooks.append(hooks)
        if not hasattr(_entered, "stack"):
            _entered.stack = []
        _entered.stack.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        hooks = self._hooks.pop()
        if hooks is not None:
            _entered.stack.pop()
            hooks.__exit__(*exc)
            if self.synchronize_checkpoint_boundary:
                self.synchronize()

    def _reset(self) -> None:
        _capi.check(_capi.library().fragctl_checkpoint_reset(self._store))
        self._generation += 1
        self._next_layer = 0
        self._packed.clear()
        self._got.clear()

    # --- hooks --------------------------------------------------------------

    def movable(self, tensor: Any) -> bool:
        """Whether the hooks would move ``tensor`` into the store if saved
        in forward (on the store's device, strided, at least ``min_bytes``,
        not a parameter nor a view of one; saves made during backward are
        left alone too unless ``keep_backward_saves`` is False). Usable
        before the first ``with`` block (to size a budget); opens nothing."""
        if self._device is None:
            self._device = self._resolve()[1]
        return self._movable(tensor)

    def _movable(self, tensor: Any) -> bool:
        torch = self._torch
        if tensor.device != self._device or tensor.layout != torch.strided or tensor.is_sparse:
            return False
        if tensor.numel() * tensor.element_size() < max(self.min_bytes, 1):
            return False
        base = tensor if tensor._base is None else tensor._base
        # Parameters, and leaves that require grad as parameters do, and their
        # views (Linear saves weight.t()): moving them would free nothing.
        return not (isinstance(base, torch.nn.Parameter) or (base.is_leaf and base.requires_grad))

    def _stream(self) -> Optional[int]:
        return current_stream(self._torch, self._device)

    def _wrap(self, pointer: int, nbytes: int) -> Any:
        """A uint8 tensor over `nbytes` of store memory at `pointer` (no copy)."""
        return wrap(self._torch, self._device, pointer, nbytes)

    def _pack(self, tensor: Any) -> Any:
        if not self._movable(tensor):
            self._kept += 1
            return tensor
        if self.keep_backward_saves and backward_running(self._torch):
            self._kept_in_backward += 1
            return tensor
        torch = self._torch
        nbytes = tensor.numel() * tensor.element_size()
        key = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
        with self._lock:
            earlier = self._saved_already(key, tensor)
            if earlier is not None:
                self._shared += 1
                return earlier
        if nbytes > _round_up(self.budget, _store_alignment()):  # can never fit the region
            return self._to_host(tensor, nbytes, key)
        source = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        with self._lock:
            layer = self._next_layer
            pointer = ctypes.c_void_p()
            try:
                _capi.check(_capi.library().fragctl_checkpoint_put(self._store, layer, nbytes, self._stream(),
                                                                   ctypes.byref(pointer)))
            except _capi.OutOfMemoryError:  # the rest of the region is in use (between get and drop)
                return self._to_host(tensor, nbytes, key)
            self._next_layer += 1
            # Queued before the next call into the store, as put requires.
            self._wrap(pointer.value, nbytes).copy_(source)
            saved = _Saved(self, layer, nbytes, tensor.shape, tensor.dtype)
            self._live += 1
            self._moved += 1
            self._remember(key, tensor, saved)
        return saved

    def _remember(self, key: Tuple[Any, ...], tensor: Any, saved: Union["_Saved", "_OnHost"]) -> None:
        try:
            original = weakref.ref(tensor)
        except TypeError:  # a tensor type without weak references: never shared
            return
        self._packed[key] = (original, tensor._version, weakref.ref(saved))

    def _saved_already(self, key: Tuple[Any, ...], tensor: Any) -> Optional[Union["_Saved", "_OnHost"]]:
        """What an earlier save of this very tensor in this step returned, if
        it holds the same bytes: the tensor packed then is still alive (so
        its memory was not reused), at the same address, unmodified since
        (its version counter, shared by every view of the memory, is the
        same), and what it returned is still held by autograd."""
        entry = self._packed.get(key)
        if entry is None:
            return None
        original, version, saved_ref = entry
        first, saved = original(), saved_ref()
        if (first is None or saved is None or saved.generation != self._generation or
                first.data_ptr() != key[0] or tensor._version != version):
            del self._packed[key]
            return None
        return saved

    def _to_host(self, tensor: Any, nbytes: int, key: Tuple[Any, ...]) -> "_OnHost":
        """The tier for a tensor the region cannot take: a host copy (pinned
        when the device is a GPU) queued on the current stream, without a
        host synchronization; PyTorch's pinned-memory cache keeps the buffer
        until the copy has run."""
        host = self._torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu",
                                 pin_memory=self._device.type == "cuda")
        host.copy_(tensor.detach(), non_blocking=True)
        saved = _OnHost(self, host)
        with self._lock:
            self._direct += 1
            self._direct_bytes += nbytes
            self._moved += 1
            self._remember(key, tensor, saved)
        return saved

    def _unpack(self, saved: Any) -> Any:
        if isinstance(saved, _OnHost):
            earlier = saved.unpacked() if saved.unpacked is not None else None
            if earlier is not None:
                return earlier
            out = saved.tensor.to(self._device, non_blocking=True, copy=True)
            saved.unpacked = weakref.ref(out)
            return out
        if not isinstance(saved, _Saved):
            return saved
        torch = self._torch
        with self._lock:
            if self._store is None or saved.generation != self._generation:
                raise RuntimeError("fragctl.torch.offload_activations: a saved tensor (save %d) was unpacked after "
                                   "its store was closed" % saved.layer)
            earlier = saved.unpacked() if saved.unpacked is not None else None
            if earlier is not None:  # saved twice, unpacked for the second user while the first holds it
                return earlier
            out = torch.empty(saved.shape, dtype=saved.dtype, device=self._device)
            if saved.host is not None:  # moved out of the store by _spill_got
                out.reshape(-1).view(torch.uint8).copy_(saved.host, non_blocking=True)
            else:
                out.reshape(-1).view(torch.uint8).copy_(self._wrap(self._get(saved), saved.nbytes))
            saved.unpacked = weakref.ref(out)
        return out

    def _get(self, saved: _Saved) -> int:
        """The store's pointer to `saved`'s checkpoint, in place on the
        current stream. The store keeps a checkpoint it handed out in the
        region until its drop, and autograd drops a saved tensor only when it
        frees it: after a backward with ``retain_graph=True`` (or within one
        node that unpacks several) those pinned checkpoints can fill the
        region, and the next get could not bring one back from the host
        (issue 27: OutOfMemoryError in the second backward when the budget
        equals the largest saved tensor). Then they go to the host first."""
        lib, stream = _capi.library(), self._stream()
        if self._got and self.where(saved.layer) == "host" and self._region_free() < _round_up(saved.nbytes,
                                                                                                _store_alignment()):
            self._spill_got()
        pointer = ctypes.c_void_p()
        status = lib.fragctl_checkpoint_get(self._store, saved.layer, stream, ctypes.byref(pointer))
        if status == _capi.OUT_OF_MEMORY and self._got:  # fragmented: spill and try once more
            self._spill_got()
            status = lib.fragctl_checkpoint_get(self._store, saved.layer, stream, ctypes.byref(pointer))
        _capi.check(status)
        self._got[saved.layer] = (weakref.ref(saved), pointer.value, stream)
        return pointer.value

    def _region_free(self) -> int:
        """Bytes of the store's region no checkpoint holds."""
        text = ctypes.c_void_p()
        _capi.check(_capi.library().fragctl_checkpoint_stats_json(self._store, ctypes.byref(text)))
        stats = json.loads(_capi.take_string(text))
        return stats["device_budget"] - stats["device_bytes"]["current"]

    def _spill_got(self) -> None:
        """Copies each checkpoint an unpack got (and autograd still holds) to
        a host tensor, on the stream of its get, and drops it from the store:
        a later unpack of it copies from the host."""
        torch, lib = self._torch, _capi.library()
        for layer, (ref, pointer, stream) in list(self._got.items()):
            del self._got[layer]
            saved = ref()
            if saved is None or saved.host is not None:
                continue
            host = torch.empty(saved.nbytes, dtype=torch.uint8, device="cpu", pin_memory=self._device.type == "cuda")
            with stream_context(torch, self._device, stream):
                host.copy_(self._wrap(pointer, saved.nbytes))  # blocking: complete before the drop
            lib.fragctl_checkpoint_drop(self._store, layer)
            saved.host = host
            self._spilled += 1

    def _release(self, saved: _Saved) -> None:
        with self._lock:
            if self._store is None or saved.generation != self._generation:
                return
            self._got.pop(saved.layer, None)
            if saved.host is None:
                _capi.library().fragctl_checkpoint_drop(self._store, saved.layer)
            self._live -= 1

    # --- observation ----------------------------------------------------------

    def synchronize(self) -> None:
        """Blocks until every copy the store queued has completed."""
        with self._lock:
            if self._store is not None:
                _capi.check(_capi.library().fragctl_checkpoint_synchronize(self._store))

    def where(self, layer: int) -> str:
        """Where save number ``layer`` of this step is: "device", "host" or "absent"."""
        with self._lock:
            if self._store is None:
                return "absent"
            out = ctypes.c_int()
            _capi.check(_capi.library().fragctl_checkpoint_where(self._store, _capi.c_int(layer, "layer"),
                                                                 ctypes.byref(out)))
            return _RESIDENCE[out.value]

    def stats(self) -> Dict[str, Any]:
        """The store's statistics (docs/checkpoint.md, "Statistics") plus,
        counted by these hooks, ``tensors_moved``, ``tensors_kept`` (saved
        tensors left alone: small, parameters, other devices),
        ``tensors_kept_in_backward`` (movable tensors saved while a backward
        pass ran, left in place), ``tensors_shared`` (saves of a tensor
        already in the store this step, which share its entry),
        ``tensors_spilled`` (tensors an unpack had brought back, which the
        store keeps in place until autograd frees them, moved to the host
        to make room for another unpack: a backward with
        ``retain_graph=True``, or one operation unpacking more than the
        budget holds),
        ``tensors_to_host_direct`` and ``bytes_to_host_direct`` (moved
        tensors the region could not take, copied straight to the host)."""
        with self._lock:
            result: Dict[str, Any] = {}
            if self._store is not None:
                text = ctypes.c_void_p()
                _capi.check(_capi.library().fragctl_checkpoint_stats_json(self._store, ctypes.byref(text)))
                result = json.loads(_capi.take_string(text))
                result["backend"] = _capi.library().fragctl_checkpoint_backend(self._store).decode()
            result["tensors_moved"] = self._moved
            result["tensors_to_host_direct"] = self._direct
            result["bytes_to_host_direct"] = self._direct_bytes
            result["tensors_kept"] = self._kept
            result["tensors_kept_in_backward"] = self._kept_in_backward
            result["tensors_shared"] = self._shared
            result["tensors_spilled"] = self._spilled
            result["saved_alive"] = self._live
            return result

    def __repr__(self) -> str:
        return "fragctl.torch.offload_activations(budget=%d, min_bytes=%d, device=%s)" % (
            self.budget, self.min_bytes, self._device)

