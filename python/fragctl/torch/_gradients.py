"""The gradient half of a sharded module (docs/torch-services.md,
"Backward" and "Gradient accumulation"): each application's gradient of a
gathered parameter is summed until the parameter has all of them, averaged
over the ranks into the block's reduce bucket, and reduce-scattered into
the gradient shard once the block has every gradient; when backward ends
the persistent gradients are summed and the shards' ``.grad`` set.
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
        for _, grad in self._shards:
            grad.zero_()  # a block without gradients this backward contributes zero

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
        self._typed(b.bucket[i], b.shapes[i], p.dtype).copy_(grad).div_(self.world_size)
        b.received.add(i)
        if len(b.received) == sum(b.trainable):
            self._reduce(b)

    def _reduce(self, b: Block) -> None:
        self._check(self._lib.fragctl_zero3_reduce_gradients(self._z, b.index, self._stream()))
        b.bucket = None
        if b.backward_held:
            b.backward_held = False
            self._release(b)

    def _end_backward(self) -> None:
        self._backward_queued = False
        for b in self._blocks:
            for i, partial in enumerate(b.partial):  # applications whose output got no gradient
                if partial is not None:
                    b.partial[i] = None
                    self._deliver(b, i, partial)
            b.uses = [0] * len(b.params)
            if b.bucket is not None:  # a trainable parameter got no gradient this step
                for i, (p, t) in enumerate(zip(b.params, b.trainable)):
                    if t and i not in b.received:
                        self._typed(b.bucket[i], b.shapes[i], p.dtype).zero_()
                self._reduce(b)
            if b.backward_held:
                b.backward_held = False
                self._release(b)
        self._check(self._lib.fragctl_zero3_finish_gradients(self._z, self._stream()))
        carry, self._carry = self._carry or [None] * len(self._shards), None
        for (shard, grad), earlier in zip(self._shards, carry):
            if earlier is not None:
                grad.add_(earlier)
            shard.grad = grad
        self._step_open = True

