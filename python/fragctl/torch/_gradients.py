"""The gradient half of a sharded module: a binding of the block manager's
gradient path (fragctl/zero3/gradient_flow.hpp states the semantics;
docs/torch-services.md, "Backward" and "Gradient accumulation"). The
manager holds the state and makes every decision (which gradients are summed
aside, when a block is reduced, what is carried across backwards, when
slices are freed); this file reports events (a parameter applied in forward,
a saved parameter unpacked, a gradient arrived, backward ended, a forward
begins) and does the actions the manager answers, in order: the tensor
arithmetic, which needs torch's kernels.
"""
import ctypes
from typing import Any, Dict, List

# fragctl_zero3_gradient_event (fragctl/zero3/zero3.h)
APPLIED, UNPACKED, ARRIVED, BACKWARD_ENDED, FORWARD, FORWARD_IN_BACKWARD, RESUME = range(7)
# fragctl_zero3_gradient_do
(TRACK, FETCH, QUEUE_END, REPORT, CARRY, ZERO_VIEW, KEEP, ADD_KEPT, TAKE, DROP, BUCKET_COPY, BUCKET_ADD, BUCKET_ZERO,
 KEEP_SLICE, ADD_SLICE, RELEASE, BIND, BIND_KEPT, ADD_TO_VIEW, SET_GRAD) = range(20)
CAPACITY = 64  # actions per call


class GradientAction(ctypes.Structure):
    _fields_ = [("what", ctypes.c_int), ("block", ctypes.c_size_t), ("param", ctypes.c_size_t),
                ("shard", ctypes.c_size_t), ("slot", ctypes.c_size_t), ("pointer", ctypes.c_void_p),
                ("elements", ctypes.c_size_t)]


class GradientFlow:
    """ShardedModule's gradient methods (a mixin over its manager handle,
    blocks, shards and helpers). ``self._shards[k]`` is shard k's
    [Parameter, gradient view]; ``self._kept`` the tensors kept for the
    manager, by slot."""

    def _gradient_event(self, event: int, block: int = 0, param: int = 0, value: Any = None,
                        report: bool = False) -> List[int]:
        """Reports `event` and does the manager's actions until it has none
        left; returns the parameters a TRACK named. `value`: the gradient in
        hand (the one that arrived); `report`: pass which shards have a
        gradient (as the manager asks with REPORT)."""
        actions, kept, shards = self._actions, self._kept, self._shards
        count, more, tracked = ctypes.c_size_t(), ctypes.c_int(), []
        while True:
            flags = bytes(shard.grad is not None for shard, _ in shards) if report else None
            self._check(self._lib.fragctl_zero3_gradient_event(
                self._z, event, block, param, self._stream(), flags, len(shards) if report else 0,
                self._actions_pointer, CAPACITY, ctypes.byref(count), ctypes.byref(more)))
            event, report = RESUME, False
            for a in actions[:count.value]:
                what = a.what
                if what == TRACK:
                    tracked.append(a.param)
                elif what == FETCH:
                    self._fetch(self._blocks[a.block], for_module=False)
                elif what == KEEP:
                    kept[a.slot] = value
                # A kept tensor leaves `kept` only once the arithmetic that uses it is done, so that an
                # error in it (out of memory) leaves the slots as the manager believes them.
                elif what == ADD_KEPT:
                    value = kept[a.slot] + value
                    del kept[a.slot]
                elif what == TAKE:
                    value = kept.pop(a.slot)
                elif what == BUCKET_COPY:
                    self._bucket_copy(self._bucket_view(a), value)
                elif what == BUCKET_ADD:
                    self._bucket_view(a).add_(value / self.world_size)
                elif what == BUCKET_ZERO:
                    self._bucket_view(a).zero_()
                elif what == RELEASE:
                    self._release(self._blocks[a.block])
                elif what == QUEUE_END:
                    self._torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
                elif what == REPORT:
                    report = True
                elif what == CARRY:
                    kept[a.slot] = shards[a.shard][0].grad.detach().clone()
                elif what == ZERO_VIEW:
                    shards[a.shard][1].zero_()
                elif what == DROP:
                    kept.pop(a.slot, None)
                elif what == KEEP_SLICE:
                    kept[a.slot] = self._slice(a).clone()
                elif what == ADD_SLICE:
                    kept[a.slot] = kept[a.slot] + self._slice(a)
                elif what == BIND:
                    shards[a.shard][1] = self._slice(a) if a.pointer else None
                elif what == BIND_KEPT:
                    shards[a.shard][1] = kept.pop(a.slot)
                elif what == ADD_TO_VIEW:
                    shards[a.shard][1].add_(kept[a.slot])
                    del kept[a.slot]
                elif what == SET_GRAD:
                    shards[a.shard][0].grad = shards[a.shard][1]
                else:
                    raise AssertionError("fragctl.torch.zero3: unknown gradient action %d" % what)
            if not more.value:
                return tracked

    def _bucket_view(self, a: GradientAction) -> Any:
        b = self._blocks[a.block]
        return self._tensors.typed(a.pointer, b.shapes[a.param], b.params[a.param].dtype)

    def _bucket_copy(self, bucket: Any, value: Any) -> None:
        """bucket = value / world size, in one kernel where the types and
        shapes match (the same rounding as a copy then an in-place
        division: both divide the bucket's type by the same scalar), else
        as a copy then a division (out= takes no value that autograd
        tracks: a backward with create_graph)."""
        if value.dtype == bucket.dtype and value.shape == bucket.shape and not value.requires_grad:
            self._torch.div(value, self.world_size, out=bucket)
        else:
            bucket.copy_(value).div_(self.world_size)

    def _slice(self, a: GradientAction) -> Any:
        return self._tensors.typed(a.pointer, (a.elements,), self._shards[a.shard][0].dtype)

    def _on_gradient(self, b: Any, i: int, grad: Any) -> None:
        """The gradient of one application of parameter `i` of `b` (from the
        gather function's backward)."""
        self._gradient_event(ARRIVED, b.index, i, value=grad)

    def _end_backward(self) -> None:
        self._gradient_event(BACKWARD_ENDED)

    def _gradients_before_forward(self, backward_running: bool) -> None:
        """The root's forward begins (a checkpoint's recompute when
        `backward_running`)."""
        self._gradient_event(FORWARD_IN_BACKWARD if backward_running else FORWARD, report=True)

    def _gradients_init(self) -> None:
        self._kept: Dict[int, Any] = {}
        self._actions = (GradientAction * CAPACITY)()
        # Cast once: the manager is told of every application, unpack and
        # gradient (hundreds of calls a step).
        self._actions_pointer = ctypes.cast(self._actions, ctypes.c_void_p)
