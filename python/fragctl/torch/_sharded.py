"""ZeRO-3 for a torch.nn.Module over fragctl's block manager (docs/torch-services.md).

Theory. Every module that owns parameters directly is a block of the
manager (fragctl/zero3/zero3.h), registered in ``model.modules()`` order;
its parameters live as flat shards in the manager and the Parameter objects
keep only an empty tensor between uses.

* Forward: a pre-hook fetches the block (all-gather) and points each
  Parameter's ``.data`` at its slice of the gathered buffer; a post-hook
  releases it. Tensors autograd saves that alias a gathered buffer (the
  weight, ``weight.t()``) are packed as (block, parameter, view geometry) by
  a saved-tensor hook installed around the root module's forward, never as
  the memory itself, which the next gather may reuse.
* Backward: unpacking such a tensor fetches its block again (held until the
  block's gradients are reduced, or until backward ends) and rebuilds the
  view in the new buffer. The gather function's backward gets one
  application's gradient; once every application of the parameter in this
  forward has reported, their sum, divided by the world size (a mean over
  ranks, as DDP), goes into the block's reduce bucket; when a block has all
  its gradients the bucket is reduce-scattered into the block's gradient
  slice (the manager allocates it at that reduce). A backward adds to
  gradient shards whose ``.grad`` is still set (torch's accumulation). When
  backward ends (an engine callback) the persistent
  gradients are summed and every block still held is released. The block
  manager decides and holds all of this (fragctl/zero3/gradient_flow.hpp);
  _gradients.py reports the events and does the tensor work it answers.
* Optimizer: ``parameters()`` are the local shards (each block's trainable
  slice, each persistent trainable parameter) with ``.grad`` pointing at
  their gradient shard; a torch.optim optimizer steps them in place. The
  next forward ends the manager's step first.
* Gradient lifetime: at the next forward, when every shard's ``.grad`` is
  None (``zero_grad(set_to_none=True)``) and the manager holds slices, the
  manager frees them, so no gradient exists during forward (FSDP2's
  lifetime); with ``.grad`` kept (``set_to_none=False``) they stay. A
  forward that a backward runs (a checkpoint's recompute) frees nothing; a
  backward that raised is settled at the next forward.

Memory: the manager allocates shards, gradient slices and reduce buckets
from a long-lived allocator and gathered blocks from a transient one, as
_pools.open_pools decides: the caller's (both), else PyTorch's own (the
process-default allocator of the model's device) when fragctl.torch.enable
is active, so that one pool serves both and memory the manager frees can
hold tensors; else two private allocators made for the manager.

Frozen parameters are gathered with their block and get no gradient buffer.
Streams: all work is on the current stream (None on CPU); the manager orders
its communication stream with events.

Files: this one holds the module (set-up, gather and release, saved-tensor
hooks, state dict); _blocks.py which parameters form a block; _gradients.py
the binding of the block manager's gradient path (the manager decides);
_errors.py the exceptions; _collectives.py the torch.distributed
collectives; _interop.py memory as tensors and streams.
"""
import ctypes
import json
import weakref
from typing import Any, Dict, Iterator, List, Optional, Tuple

from .. import Allocator, _capi
from . import _collectives, _errors, _gradients, _interop, _pools
from ._blocks import Block, ParamSpec, find_blocks, gather_function
from ._gradients import GradientFlow


def _weak_describe(sharded: "ShardedModule") -> Any:
    """sharded._describe, held weakly (the progress publisher must not keep
    the module alive)."""
    method = weakref.WeakMethod(sharded._describe)

    def describe(block: Any) -> Tuple[str, List[str]]:
        bound = method()
        return bound(block) if bound is not None else (str(block), [])
    return describe


class ShardedModule(GradientFlow):
    """What fragctl.torch.zero3.shard returns: call it as the module, give
    ``parameters()`` to a torch.optim optimizer. Not thread-safe.

    ``allocator``: the fragctl.Allocator the manager allocates from (kept
    here until close(), which sets it to None), or None when the manager
    uses two private allocators (``_pools``, closed by close())."""

    def __init__(self, torch: Any, module: Any, group: Any, options: str, deadline: float,
                 group_timeout: Optional[float], explicit_deadline: bool, block_types: Tuple[type, ...] = (),
                 allocator: Optional[Allocator] = None) -> None:
        self._torch = torch
        self.module = module
        self._lib = _capi.library()
        first = next(module.parameters(), None)
        if first is None:
            raise ValueError("fragctl.torch.zero3.shard: the model has no parameters")
        self.device = first.device
        self.dtype = first.dtype
        self._blocks = find_blocks(module, block_types)
        self._collectives = _collectives.TorchCollectives(torch, group, deadline, group_timeout, explicit_deadline,
                                                          self.device)
        self._collectives.progress.describe = _weak_describe(self)
        # Tensors over the gathered blocks and the reduce buckets, made once
        # per address (fetch and the gradients' bucket copies run per block
        # and parameter twice a step).
        self._tensors = _interop.Tensors(torch, self.device)
        self.rank = self._collectives.rank
        self.world_size = self._collectives.size
        self._shards: List[List[Any]] = []
        self._hooks: List[Any] = []
        self.allocator: Optional[Allocator] = None
        # Parameters are read and written as tensors on self.device, so the
        # manager's memory must be of that kind (issue 27 H4: a sim
        # allocator without memory behind its addresses crashed the ranks);
        # open_pools checks it.
        if allocator is not None:
            _pools.require_device(allocator, self.device, "fragctl.torch.zero3.shard")
        parameter_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
        self._pools = _pools.open_pools(torch, self.device, "fragctl.torch.zero3.shard", allocator,
                                        _pools.zero3_private(self.device, parameter_bytes), roles=2)
        try:
            handle = ctypes.c_void_p()
            self._check(self._pools.long_lived._call(lambda long_lived: self._pools.transient._call(
                lambda transient: self._lib.fragctl_zero3_create_with_collectives(
                    long_lived, transient, options.encode(),
                    ctypes.cast(ctypes.pointer(self._collectives.struct), ctypes.c_void_p), ctypes.byref(handle)))))
        except BaseException:
            self._pools.close()
            raise
        self._z = handle
        self._collectives.handle = handle
        try:
            self.allocator = allocator if allocator is not None else (
                None if self._pools.owned else self._pools.long_lived)
            self._set_up(torch, module)
        except BaseException:
            self.close()  # the manager must not outlive a failed shard()
            raise

    def _set_up(self, torch: Any, module: Any) -> None:
        """Registers the blocks, loads the values and installs the hooks."""
        for b in self._blocks:
            specs = (ParamSpec * len(b.params))(*[
                ParamSpec(n.encode(), p.numel(), p.element_size(), int(p.requires_grad))
                for n, p in zip(b.keys, b.params)])
            self._check(self._lib.fragctl_zero3_add_block(self._z, b.name.encode(), ctypes.cast(specs, ctypes.c_void_p),
                                                          len(b.params)))
        self._check(self._lib.fragctl_zero3_start(self._z))
        self._load([[p.detach() for p in b.params] for b in self._blocks])
        for b in self._blocks:
            for p in b.params:  # the manager holds the values now: free the whole-model copy
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        self._shards = self._local_shards()
        self._by_storage: Dict[int, Tuple[Block, int]] = {}
        self._gradients_init()
        self._saved_hooks = None
        self._outer = None  # the offload_activations block around this forward, if any
        self._anchor = torch.zeros((), requires_grad=True)  # makes gathered parameters require grad
        self._gather = gather_function(torch)
        for b in self._blocks:
            for owner, attr in zip(b.owners, b.attrs):
                del owner._parameters[attr]  # the owner reads a gathered tensor while in use
                owner.__dict__[attr] = self._placeholder(b)
        # The root's hooks first: its pre-hook ends the last step before any
        # block (the root itself may be one) is fetched.
        self._hooks = [module.register_forward_pre_hook(self._root_pre),
                       module.register_forward_hook(self._root_post)]
        for b in self._blocks:
            self._hooks.append(b.module.register_forward_pre_hook(self._make_pre(b)))
            self._hooks.append(b.module.register_forward_hook(self._make_post(b)))

    # --- memory ----------------------------------------------------------------

    def _wrap(self, pointer: int, nbytes: int) -> Any:
        return _interop.wrap(self._torch, self.device, pointer, nbytes)

    def _typed(self, pointer: int, shape: Any, dtype: Any) -> Any:
        return _interop.typed(self._torch, self.device, pointer, shape, dtype)

    def _stream(self) -> Optional[int]:
        return _interop.current_stream(self._torch, self.device)

    def _describe(self, block: Any) -> Tuple[str, List[str]]:
        """A block's name as the manager's messages write it ("block 3
        'layers.2'") and the modules that own its parameters; a tag that
        names no block ("persistent gradients") as itself."""
        if isinstance(block, int) and 0 <= block < len(self._blocks):
            b = self._blocks[block]
            modules = []
            for key, attr in zip(b.keys, b.attrs):
                owner = key[:-len(attr) - 1] if key.endswith("." + attr) else b.name
                if owner not in modules:
                    modules.append(owner)
            return "block %d '%s'" % (b.index, b.name), modules
        return str(block), []

    def progress(self) -> Dict[str, Any]:
        """This rank's record of its collectives, as it publishes it through
        the process group's store: ``in`` the collective it is in and
        ``done`` the last one completed (queued, on GPUs), each
        [number, kind, block, bytes, wall time]; ``gave_up`` the one it
        abandoned at fragctl's deadline, [number, wall time]."""
        return self._collectives.progress.record()

    def _check(self, status: int) -> None:
        if status != _capi.OK:
            _errors.raise_for_status(status, self._lib, self._collectives, self.rank, getattr(self, "_z", None))

    def _load(self, values: List[List[Any]]) -> None:
        """Copies full parameter values (per block, per parameter) into this
        rank's shards, converted to the parameter's dtype."""
        lib = self._lib
        for b, block_values in zip(self._blocks, values):
            for i, value in enumerate(block_values):
                offset, pointer, nbytes = ctypes.c_size_t(), ctypes.c_void_p(), ctypes.c_size_t()
                self._check(lib.fragctl_zero3_shard_of(self._z, b.index, i, ctypes.byref(offset),
                                                       ctypes.byref(pointer), ctypes.byref(nbytes)))
                if pointer.value:
                    flat = value.detach().to(device=self.device, dtype=b.params[i].dtype)
                    flat = flat.contiguous().reshape(-1).view(self._torch.uint8)
                    self._wrap(pointer.value, nbytes.value).copy_(flat[offset.value:offset.value + nbytes.value])

    def _local_shards(self) -> List[List[Any]]:
        """[Parameter over shard memory, gradient view] pairs an optimizer
        steps, in the manager's shard order. A block's gradient view is None
        while the manager holds no gradient slice for it (the manager binds it
        after backward)."""
        torch, lib, out = self._torch, self._lib, []
        for b in self._blocks:
            data, grad, n = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_size_t()
            self._check(lib.fragctl_zero3_trainable_shard(self._z, b.index, ctypes.byref(data), ctypes.byref(grad),
                                                          ctypes.byref(n)))
            if n.value:
                dtype = next(p.dtype for p, t in zip(b.params, b.trainable) if t)
                out.append([torch.nn.Parameter(self._typed(data.value, (n.value,), dtype)),
                            self._typed(grad.value, (n.value,), dtype) if grad.value else None])
            for i, p in enumerate(b.params):
                self._check(lib.fragctl_zero3_persistent(self._z, b.index, i, ctypes.byref(data), ctypes.byref(grad)))
                if data.value and grad.value:
                    out.append([torch.nn.Parameter(self._typed(data.value, b.shapes[i], p.dtype)),
                                self._typed(grad.value, b.shapes[i], p.dtype)])
        return out

    # --- gather and release -----------------------------------------------------

    def _placeholder(self, b: Block) -> Any:
        return self._torch.empty(0, dtype=b.params[0].dtype, device=self.device)

    def _fetch(self, b: Block, for_module: bool) -> None:
        """Adds a consumer of `b`, gathering it if needed; `for_module` also
        sets the module's attributes to the gathered parameters (forward)."""
        if b.views is None:
            pointers = (ctypes.c_void_p * len(b.params))()
            sizes = (ctypes.c_size_t * len(b.params))()
            self._check(self._lib.fragctl_zero3_fetch(self._z, b.index, self._stream(), pointers, sizes,
                                                      len(b.params)))
            made = self._tensors.typed
            b.views = [made(pointers[i], b.shapes[i], p.dtype) for i, p in enumerate(b.params)]
            for i, view in enumerate(b.views):
                self._by_storage[view.data_ptr()] = (b, i)  # a view at its storage's start
        else:
            self._check(self._lib.fragctl_zero3_fetch(self._z, b.index, self._stream(), None, None, 0))
        b.holders += 1
        if for_module and b.forward_held == 0:
            tracked = self._gradient_event(_gradients.APPLIED, b.index) if self._torch.is_grad_enabled() else ()
            for i, (owner, attr) in enumerate(zip(b.owners, b.attrs)):
                view = b.views[i]
                if i in tracked:
                    view = self._gather.apply(self._anchor, view, self, b, i)
                owner.__dict__[attr] = view

    def _release(self, b: Block) -> None:
        self._check(self._lib.fragctl_zero3_release(self._z, b.index, self._stream()))
        b.holders -= 1
        if b.forward_held == 0:
            for owner, attr in zip(b.owners, b.attrs):
                owner.__dict__[attr] = self._placeholder(b)
        if b.holders == 0:
            for view in b.views:
                self._by_storage.pop(view.data_ptr(), None)
            b.views = None

    def _storage_ptr(self, tensor: Any) -> int:
        """The address where `tensor`'s storage begins, read from the tensor
        (making a storage object costs more, and every saved tensor is
        looked up); from the storage where the tensor has no data pointer."""
        try:
            return tensor.data_ptr() - tensor.storage_offset() * tensor.element_size()
        except (RuntimeError, NotImplementedError):
            storage = tensor.untyped_storage() if hasattr(tensor, "untyped_storage") else tensor.storage()
            return storage.data_ptr()

    def _make_pre(self, b: Block):
        def pre(_module, _inputs):
            self._fetch(b, for_module=True)
            b.forward_held += 1
        return pre

    def _make_post(self, b: Block):
        def post(_module, _inputs, _output):
            b.forward_held -= 1
            self._release(b)
        return post

    def _root_pre(self, _module, _inputs):
        # The manager settles a backward that raised, ends the optimizer's
        # step and frees unused gradient slices; not in a recompute.
        self._gradients_before_forward(_interop.backward_running(self._torch))
        if self._torch.is_grad_enabled():
            from .offload import active
            self._outer = active()
            self._saved_hooks = self._torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
            self._saved_hooks.__enter__()

    def _root_post(self, _module, _inputs, _output):
        if self._saved_hooks is not None:
            self._saved_hooks.__exit__(None, None, None)
            self._saved_hooks = None
        self._outer = None

    def _pack(self, tensor: Any) -> Any:
        found = self._by_storage.get(self._storage_ptr(tensor)) if tensor.device == self.device else None
        if found is None:  # an activation: offload_activations' if one is active, else autograd's
            return self._outer._pack(tensor) if self._outer is not None else tensor
        b, i = found
        return (b, i, tuple(tensor.size()), tuple(tensor.stride()), tensor.storage_offset())

    def _unpack(self, packed: Any) -> Any:
        if not isinstance(packed, tuple):
            owner = getattr(packed, "owner", None)  # offload_activations' handle
            return owner._unpack(packed) if owner is not None else packed
        b, i, size, stride, offset = packed
        self._gradient_event(_gradients.UNPACKED, b.index)  # the first unpack in a backward fetches b
        return b.views[i].as_strided(size, stride, offset)


    # --- the module's surface -------------------------------------------------------

    def _require_open(self) -> None:
        """Raises Zero3Error once close() has run: the parameters are empty
        then, and the module would fail on them with a shape error."""
        if not getattr(self, "_z", None):
            raise _errors.Zero3Error("fragctl.torch.zero3: the ShardedModule is closed: its parameters went with its "
                                     "manager; shard the model again (load a full_state_dict() saved before close)",
                                     _capi.STATE)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._require_open()
        try:
            return self.module(*args, **kwargs)
        except BaseException:
            self._abort_forward()
            raise

    def _abort_forward(self) -> None:
        """After an exception in forward: removes the saved-tensor hooks and
        releases every block the forward still holds (their post-hooks did
        not run)."""
        self._root_post(None, None, None)
        for b in self._blocks:
            while b.forward_held > 0:
                b.forward_held -= 1
                self._release(b)

    def parameters(self) -> Iterator[Any]:
        """This rank's shards as Parameters, with ``.grad`` on their gradient
        shards after backward: give them to a torch.optim optimizer."""
        return iter([shard for shard, _ in self._shards])

    def full_state_dict(self) -> Dict[str, Any]:
        """The whole (unsharded) parameters by name, as CPU tensors. A
        collective: every rank must call it."""
        self._require_open()
        self._end_open_step()
        out = {}
        for b in self._blocks:
            self._fetch(b, for_module=False)
            b.forward_held += 1
            try:
                for key, view in zip(b.keys, b.views):
                    out[key] = view.detach().to("cpu", copy=True)
            finally:
                b.forward_held -= 1
                self._release(b)
        self._end_open_step()
        return out

    def load_full_state_dict(self, state: Dict[str, Any]) -> None:
        """Loads whole parameter values by name (every parameter must be there)
        into this rank's shards, converted to each parameter's dtype (an fp32
        state dict into a bf16 model). Every rank calls it with the same values."""
        self._require_open()
        self._end_open_step()
        values = []
        for b in self._blocks:
            row = []
            for key, shape in zip(b.keys, b.shapes):
                if key not in state:
                    raise KeyError("fragctl.torch.zero3: load_full_state_dict: %s is missing" % key)
                if tuple(state[key].shape) != tuple(shape):
                    raise ValueError("fragctl.torch.zero3: load_full_state_dict: %s has shape %s, the model %s"
                                     % (key, tuple(state[key].shape), tuple(shape)))
                row.append(state[key])
            values.append(row)
        self._load(values)

    def _end_open_step(self) -> None:
        """Ends the manager's step, which also frees blocks gathered ahead of
        use (stale once shards are written). Outside forward and backward."""
        self._check(self._lib.fragctl_zero3_end_step(self._z, self._stream()))

    def __del__(self) -> None:
        self.close()

    def stats(self) -> Dict[str, Any]:
        """The manager's statistics (docs/zero3.md, "Statistics")."""
        self._require_open()
        out = ctypes.c_void_p()
        self._check(self._lib.fragctl_zero3_stats_json(self._z, ctypes.byref(out)))
        return json.loads(_capi.take_string(out))

    def close(self) -> None:
        """Frees the manager; the module keeps empty parameters and
        ``parameters()`` is empty (the shards were the manager's memory).
        Calling the module, ``stats()`` or a state-dict method afterwards
        raises Zero3Error. Closing again does nothing."""
        for h in getattr(self, "_hooks", ()):
            h.remove()
        self._hooks = []
        for shard, _ in getattr(self, "_shards", ()):
            shard.grad = None
            shard.data = self._torch.empty(0, dtype=shard.dtype)
        self._shards = []
        if getattr(self, "_z", None):
            self._collectives.detach()  # no hang is recorded through the manager from now on
            self._lib.fragctl_zero3_destroy(self._z)
            self._z = None
        if getattr(self, "_pools", None) is not None:
            self._pools.close()  # the private allocators, after the manager that used them
        if getattr(self, "_collectives", None) is not None:
            self._collectives.close()  # stops publishing this rank's record
        self.allocator = None
