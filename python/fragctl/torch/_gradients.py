"""The gradient half of a sharded module (docs/torch-services.md,
"Backward" and "Gradient accumulation"): each application's gradient of a
gathered parameter is summed until the parameter has all of them, averaged
over the ranks into the block's reduce bucket, and reduce-scattered into
the block's gradient slice once the block has every gradient; when backward
ends the persistent gradients are summed and the shards' ``.grad`` set to
views of the slices. The slices are freed before the next forward when
every ``.grad`` is None (not in a checkpoint's recompute during backward).
"""
import ctypes
from typing import Any

from ._blocks import Block


class GradientFlow:
    """ShardedModule's gradient methods (a mixin: they use its manager
    handle, blocks, shards and helpers)."""

    def _on_gradient(self, b: Block, i: int, grad: Any) -> None:
        """The gradient of one application of parameter `i` of `b` (from the
        gather function's backward). A parameter applied several times in the
        forward (a shared layer, a loop) reaches the bucket once, as the sum of
        its applications' gradients."""
        if not self._backward_queued:
            self._begin_backward()
        b.uses[i] -= 1
        if b.partial[i] is not None:
            grad = b.partial[i] + grad
        if b.uses[i] > 0:
            b.partial[i] = grad
            return
        b.partial[i] = None
        self._deliver(b, i, grad)

    def _begin_backward(self) -> None:
        """Queues the end of this backward. Gradients accumulate as torch's do:
        a shard whose ``.grad`` is still set (no ``zero_grad(set_to_none=True)``
        since the last backward) gets this backward's gradient added to it."""
        self._backward_queued = True
        self._torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
        self._carry = [shard.grad.detach().clone() if shard.grad is not None else None for shard, _ in self._shards]
        self._again = [None] * len(self._shards)
        for _, grad in self._shards:
            if grad is not None:
                grad.zero_()  # a held slice without gradients this backward contributes zero

    def _deliver(self, b: Block, i: int, grad: Any) -> None:
        """Copies the whole gradient of parameter `i` of `b` into its bucket;
        reduces the block once all its trainable parameters have one."""
        p = b.params[i]
        if b.bucket is None:
            n = len(b.params)
            pointers, sizes = (ctypes.c_void_p * n)(), (ctypes.c_size_t * n)()
            self._check(self._lib.fragctl_zero3_begin_gradients(self._z, b.index, self._stream(), pointers, sizes, n))
            b.bucket = [pointers[k] for k in range(n)]
            b.received = set()
        view = self._typed(b.bucket[i], b.shapes[i], p.dtype)
        if b.reduced and b.persistent[i]:  # its gradient from an earlier reduce of this backward is still there
            view.add_(grad / self.world_size)
        else:
            view.copy_(grad).div_(self.world_size)
        b.received.add(i)
        if len(b.received) == sum(b.trainable):
            self._reduce(b)

    def _reduce(self, b: Block) -> None:
        if b.reduced:
            self._keep_reduced_slice(b)
        self._check(self._lib.fragctl_zero3_reduce_gradients(self._z, b.index, self._stream()))
        b.reduced = True
        b.bucket = None
        if b.backward_held:
            b.backward_held = False
            self._release(b)

    def _keep_reduced_slice(self, b: Block) -> None:
        """Before a second reduce of `b` in one backward (a checkpoint
        recomputed the root's forward inside it, after `b`'s gradients had
        been reduced): the reduce-scatter overwrites the slice, so its sum so
        far is kept aside and added when backward ends. The host waits for
        the manager's streams first (the first reduce must have landed):
        this path alone, and only in such a backward."""
        self._check(self._lib.fragctl_zero3_synchronize(self._z))
        data, grad, n = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_size_t()
        self._check(self._lib.fragctl_zero3_trainable_shard(self._z, b.index, ctypes.byref(data), ctypes.byref(grad),
                                                            ctypes.byref(n)))
        if not grad.value:
            return
        k = self._shard_blocks.index(b)
        earlier = self._typed(grad.value, (n.value,), self._shards[k][0].dtype).clone()
        self._again[k] = earlier if self._again[k] is None else self._again[k] + earlier

    def _end_backward(self) -> None:
        self._settle_blocks()
        self._check(self._lib.fragctl_zero3_finish_gradients(self._z, self._stream()))
        self._bind_gradients()
        carry, self._carry = self._carry or [None] * len(self._shards), None
        again, self._again = self._again or [None] * len(self._shards), []
        for pair, earlier, reduced_before in zip(self._shards, carry, again):
            shard, grad = pair
            if grad is None:  # a block that got no gradient this backward (None, as torch leaves it)
                grad = pair[1] = earlier
            elif earlier is not None:
                grad.add_(earlier)
            if reduced_before is not None:  # held: the block was reduced in this backward
                grad.add_(reduced_before)
            shard.grad = grad
        self._step_open = True

    def _settle_blocks(self) -> None:
        """Ends this backward's per-block state: delivers the partial sums of
        applications whose output got no gradient, reduces every bucket still
        held (a parameter without a gradient contributes zero) and releases
        the blocks backward still holds."""
        self._backward_queued = False
        for b in self._blocks:
            for i, partial in enumerate(b.partial):  # applications whose output got no gradient
                if partial is not None:
                    b.partial[i] = None
                    self._deliver(b, i, partial)
            b.uses = [0] * len(b.params)
            if b.bucket is not None:  # a trainable parameter got no gradient this step
                for i, (p, t) in enumerate(zip(b.params, b.trainable)):
                    # (a persistent parameter's view holds its earlier reduce's gradient then: kept)
                    if t and i not in b.received and not (b.reduced and b.persistent[i]):
                        self._typed(b.bucket[i], b.shapes[i], p.dtype).zero_()
                self._reduce(b)
            if b.backward_held:
                b.backward_held = False
                self._release(b)
            b.reduced = False  # after the reduce above, which may be this backward's second of `b`

    def _abandon_backward(self) -> None:
        """Before a forward, after a backward that raised (its end callback
        never ran): settles the blocks as backward's end would (reduces are
        collectives: every rank must have failed alike) without summing the
        persistent gradients or setting ``.grad``, and ends the step. The
        slices it reduced stay held until released; the values of gradients
        ``.grad`` kept are unspecified, and the blocks newly given a slice
        have no view of it until the next backward ends."""
        self._settle_blocks()
        self._carry = None
        self._again = []
        self._step_open = True

    def _bind_gradients(self) -> None:
        """Points each block shard's gradient view at its current gradient
        slice (the manager may have allocated it anew in this backward),
        None where the block holds none."""
        data, grad, n = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_size_t()
        for pair, b in zip(self._shards, self._shard_blocks):
            if b is None:
                continue
            self._check(self._lib.fragctl_zero3_trainable_shard(self._z, b.index, ctypes.byref(data),
                                                                ctypes.byref(grad), ctypes.byref(n)))
            current = pair[1]
            if not grad.value:
                pair[1] = None
            elif current is None or current.data_ptr() != grad.value:
                pair[1] = self._typed(grad.value, (n.value,), pair[0].dtype)

    def _release_unused_gradients(self) -> None:
        """Before a forward outside backward: when the manager holds gradient
        slices and every shard's ``.grad`` is None (the optimizer's
        ``zero_grad(set_to_none=True)``), frees them, so none is held during
        forward and backward until each block's reduce. Whether slices are
        held is the manager's count, not the Python views: a backward that
        raised after some reduces left slices no ``.grad`` points at. A kept
        ``.grad`` (``set_to_none=False``, or accumulation over micro-batches)
        keeps them all."""
        if any(shard.grad is not None for shard, _ in self._shards):
            return
        if self.stats()["gradient_bytes"]["current"] == 0:
            return
        self._check(self._lib.fragctl_zero3_release_gradients(self._z, self._stream()))
        for pair, b in zip(self._shards, self._shard_blocks):
            if b is not None:
                pair[1] = None
