"""Blocks of a sharded module (docs/torch-services.md, "Blocks"): which
parameters the block manager gathers and releases together, the C struct
that registers them, and the autograd function through which a gathered
parameter's gradient reaches the manager.
"""
import ctypes
from typing import Any, List, Optional, Tuple


class ParamSpec(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("elements", ctypes.c_size_t), ("element_bytes", ctypes.c_size_t),
                ("trainable", ctypes.c_int)]


class Block:
    __slots__ = ("index", "name", "module", "keys", "owners", "attrs", "params", "shapes", "trainable", "views",
                 "forward_held", "holders")

    def __init__(self, index, name, module, owned):
        """`owned`: (state-dict key, owning module, attribute, Parameter) per parameter."""
        self.index = index
        self.name = name
        self.module = module  # whose forward gathers and releases the block
        self.keys = [k for k, _, _, _ in owned]
        self.owners = [m for _, m, _, _ in owned]
        self.attrs = [a for _, _, a, _ in owned]
        self.params = [p for _, _, _, p in owned]
        self.shapes = [p.shape for p in self.params]
        self.trainable = [p.requires_grad for p in self.params]
        self.views: Optional[List[Any]] = None  # the gathered parameters while gathered
        self.forward_held = 0  # forward's fetches not released yet (module hooks, full_state_dict)
        self.holders = 0  # every fetch not released yet (forward's and backward's): the views live while held


def find_blocks(module: Any, block_types: Tuple[type, ...]) -> List[Block]:
    """Blocks in module order: each module of `block_types` with every
    parameter of its subtree, and every other module that owns
    parameters directly, outside those subtrees."""
    blocks, seen, inside = [], set(), set()
    for name, m in module.named_modules():
        if id(m) in inside:
            continue
        if block_types and isinstance(m, block_types):
            members = list(m.named_modules(prefix=name))
            inside.update(id(sub) for _, sub in members)
        else:
            members = [(name, m)]
        owned = []
        for prefix, owner in members:
            for attr, p in owner.named_parameters(recurse=False):
                key = "%s.%s" % (prefix, attr) if prefix else attr
                if id(p) in seen:
                    raise ValueError("fragctl.torch.zero3.shard: parameter %s is shared with another module; "
                                     "shared (tied) parameters are not supported" % key)
                seen.add(id(p))
                owned.append((key, owner, attr, p))
        if owned:
            blocks.append(Block(len(blocks), name or "<root>", m, owned))
    return blocks


def gather_function(torch: Any) -> Any:
    """The autograd function whose output is a gathered parameter: its
    backward receives the parameter's whole gradient (all uses summed)."""

    class GatheredParameter(torch.autograd.Function):
        @staticmethod
        def forward(ctx, anchor, view, owner, block, index):  # noqa: ARG004 (anchor makes the output require grad)
            ctx.owner, ctx.block, ctx.index = owner, block, index
            return view.view_as(view)

        @staticmethod
        def backward(ctx, grad):
            ctx.owner._on_gradient(ctx.block, ctx.index, grad)
            return None, None, None, None, None

    return GatheredParameter
