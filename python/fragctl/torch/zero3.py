"""ZeRO-3 configuration for fragctl's parameter-block manager, in DeepSpeed's
terms (docs/torch-services.md, "ZeRO-3").

``parse_config`` reads DeepSpeed's stage-3 options, given as keyword
arguments, as a ``zero_optimization`` block (a dict), or as a whole
``ds_config.json`` (a path or a dict holding ``zero_optimization``), and
returns a ``Zero3Config`` whose ``options_string()`` is what the block
manager's C API (``fragctl_zero3_create``, fragctl/zero3/zero3.h) takes.
Stock Hugging Face and DeepSpeed stage-3 configs are taken (issue 31): keys
that tune DeepSpeed's own internals (``sub_group_size``,
``stage3_max_reuse_distance``, ...) and values at DeepSpeed's defaults are
accepted with one DeepSpeedKeyNote warning that says what fragctl does
instead. Values that ask for something fragctl cannot do are refused by name,
with the reason, rather than silently ignored: a DeepSpeed user who sets
``offload_param`` to ``cpu`` must learn that nothing is offloaded; so are
keys DeepSpeed does not have (misspellings).
"""
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

from .. import Allocator, _capi
from ._blocks import find_blocks
from ._collectives import END_GRACE_S
from ._deepspeed import ConfigSource, DeepSpeedKeyNote, invalid, note, read_section, shown
from ._errors import CollectiveError, CollectiveTimeoutError, Zero3Error
from ._progress import DEADLINE_FRACTION, group_timeout
from ._sharded import ShardedModule


_defaults: Optional[Dict[str, int]] = None


def _default(key: str) -> int:
    """DeepSpeed's default of a count, which is also the block manager's
    (docs/zero3.md): held once, in the library (zero3/options.hpp), and read
    through fragctl_zero3_default_options_json on first use."""
    global _defaults
    if _defaults is None:
        _defaults = _capi.take_json(_capi.library().fragctl_zero3_default_options_json)
    return _defaults[key]

# What parse_config does with each DeepSpeed zero_optimization key (issue 31:
# stock Hugging Face and DeepSpeed stage-3 configs are taken). Every rule is
# in one of these tables; a key in none of them is refused as unknown.

# Behaviours fragctl always has: key -> what fragctl does. True (or "auto") is
# silent; false is taken with the note, since fragctl does it anyway.
_ALWAYS = {
    "overlap_comm": "collectives always run on the manager's communication stream, overlapped with compute",
    "contiguous_gradients": "gradients are always reduced into one contiguous gradient slice per block",
    "reduce_scatter": "gradients are always reduce-scattered",
    "stage3_gather_16bit_weights_on_model_save": "full_state_dict() gathers the whole parameters whenever it is "
                                                 "called",
    "stage3_gather_fp16_weights_on_model_save": "full_state_dict() gathers the whole parameters whenever it is "
                                                "called",
}

_STAGE_1_2 = "a stage 1-2 key, which DeepSpeed ignores at stage 3; so does fragctl"
_NO_CHECKPOINT = ("fragctl writes no DeepSpeed checkpoint: full_state_dict() gives whole parameters, the optimizer's "
                  "state is torch.optim's state_dict()")

# Keys that tune DeepSpeed's own internals, taken with any value and the
# note: key -> what fragctl does instead.
_INTERNAL = {
    "sub_group_size": "the torch.optim optimizer steps each rank's shards itself; there are no sub-groups to tile",
    "stage3_max_reuse_distance": "a block is freed by its last consumer and gathered again when needed, "
                                 "unless it is the next fetch (the forward/backward turnaround); "
                                 "stage3_max_live_parameters alone bounds gathered memory",
    "stage3_module_granularity_threshold": "blocks are the modules given (block_types), never merged by size",
    "stage3_use_all_reduce_for_fetch_params": "a block is gathered by one all-gather into one buffer",
    "stage3_allgather_sequential": "a block is gathered by one all-gather into one buffer",
    "stage3_partition_stream_chunk_size": "shard() partitions a model that is already built, one parameter at a "
                                          "time",
    "memory_efficient_linear": "no Linear is replaced: tensors autograd saves that alias a gathered weight are "
                               "re-gathered in backward",
    "override_module_apply": "nn.Module.apply is not overridden",
    "log_trace_cache_warnings": "a fetch out of the recorded order is counted in stats()['prefetch']['trace_misses']",
    "enable_sanity_checks": "the manager always checks its calls (consumers, buckets, budget)",
    "pipeline_loading_checkpoint": _NO_CHECKPOINT,
    "load_from_fp32_weights": _NO_CHECKPOINT,
    "elastic_checkpoint": _NO_CHECKPOINT,
    "leaf_module": "pass block_types= to shard() for modules gathered whole",
    "save_muon_momentum_buffer_in_memory": "nothing is offloaded to NVMe",
    "cpu_offload_use_pin_memory": "nothing is offloaded, so nothing is pinned",
    "zeropp_loco_param": "gradients are not quantized, so there is no quantization error to track",
    "allgather_partitions": _STAGE_1_2,
    "allgather_bucket_size": _STAGE_1_2,
    "use_multi_rank_bucket_allreduce": _STAGE_1_2,
    "round_robin_gradients": _STAGE_1_2,
    "ignore_unused_parameters": _STAGE_1_2 + " (a parameter without a gradient keeps .grad None, as torch leaves "
                                             "it)",
    "legacy_stage1": _STAGE_1_2,
    "compute_grad_norm": _STAGE_1_2,
    "parameter_alignment": _STAGE_1_2 + " (every parameter is aligned to 512 bytes anyway)",
}


def _no_offload(value: Any) -> bool:
    """Whether an offload_param / offload_optimizer block asks for no offload
    (device "none" or absent; Hugging Face's stock config writes "none")."""
    return isinstance(value, Mapping) and str(value.get("device", "none")).lower() == "none"


def _off(value: Any) -> bool:
    return value is False or value is None


# Keys whose values may ask for something fragctl cannot do: key -> (whether
# a value asks for nothing fragctl lacks, why other values are refused).
# "auto" always passes (Hugging Face fills it with DeepSpeed's default).
_CAPABILITY = {
    "offload_param": (_no_offload, "parameters are not offloaded to CPU or NVMe (use "
                                   "fragctl.torch.offload_activations for activations)"),
    "offload_optimizer": (_no_offload, "optimizer state is not offloaded; the torch.optim optimizer keeps it beside "
                                       "the shards"),
    "cpu_offload": (_off, "optimizer offload is not implemented"),
    "cpu_offload_param": (_off, "parameter offload is not implemented"),
    "cpu_offload_params": (_off, "parameter offload is not implemented"),
    "zenflow": (lambda v: v is None, "ZenFlow's CPU optimizer offload is not implemented"),
    "zero_hpz_partition_size": (lambda v: v in (0, 1), "ZeRO++ hierarchical partitioning is not implemented: each "
                                                       "rank gathers from every rank"),
    "zero_quantized_weights": (_off, "ZeRO++ quantized weights are not implemented"),
    "zero_quantized_nontrainable_weights": (_off, "ZeRO++ quantized weights are not implemented"),
    "zero_quantized_gradients": (_off, "ZeRO++ quantized gradients are not implemented"),
    "mics_shard_size": (lambda v: not isinstance(v, bool) and isinstance(v, int) and v <= 0,
                        "MiCS is not implemented: parameters are sharded over the whole process group"),
    "mics_hierarchical_params_gather": (_off, "MiCS is not implemented"),
    "stage3_model_persistence_threshold": (lambda v: not isinstance(v, bool) and isinstance(v, int)
                                           and v >= sys.maxsize,
                                           "the persistent parameters' total is not capped; lower "
                                           "stage3_param_persistence_threshold instead"),
}

_COUNTS = ("stage3_max_live_parameters", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
           "reduce_bucket_size")


@dataclass(frozen=True)
class Zero3Config:
    """DeepSpeed stage-3 settings as the block manager reads them. Counts are
    elements, as in DeepSpeed; the manager budgets bytes (count x element size)."""

    #: None (the default) takes DeepSpeed's default, the block manager's
    #: (fragctl_zero3_default_options_json), as does every count below.
    stage3_max_live_parameters: int = None  # type: ignore[assignment]
    stage3_prefetch_bucket_size: int = None  # type: ignore[assignment]
    stage3_param_persistence_threshold: int = None  # type: ignore[assignment]
    #: Elements reduced at once. The manager's two reduce buckets each hold
    #: one block's gradients, so a block (a module of ``block_types`` with its
    #: whole subtree) may not have more trainable elements above the
    #: persistence threshold than this (checked by ``shard``).
    reduce_bucket_size: int = None  # type: ignore[assignment]
    #: The lines of the DeepSpeedKeyNote parse_config emitted: keys taken
    #: without DeepSpeed's effect, each with what fragctl does instead.
    notes: Tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        for key in _COUNTS:
            if getattr(self, key) is None:
                object.__setattr__(self, key, _default(key))

    def options_string(self, element_bytes: int = 2, gradient_type: str = "bf16") -> str:
        """The block manager's option text (docs/zero3.md, "Options") for
        parameters of ``element_bytes`` bytes and gradients of ``gradient_type``
        ("bf16", "fp16" or "fp32")."""
        if element_bytes not in (1, 2, 4, 8):
            raise ValueError("fragctl.torch.zero3: element_bytes=%r: expected 1, 2, 4 or 8" % (element_bytes,))
        if gradient_type not in ("bf16", "fp16", "fp32"):
            raise ValueError("fragctl.torch.zero3: gradient_type=%r: expected 'bf16', 'fp16' or 'fp32'"
                             % (gradient_type,))
        return ("element_bytes:%d,stage3_max_live_parameters:%d,stage3_prefetch_bucket_size:%d,"
                "stage3_param_persistence_threshold:%d,gradient_type:%s"
                % (element_bytes, self.stage3_max_live_parameters, self.stage3_prefetch_bucket_size,
                   self.stage3_param_persistence_threshold, gradient_type))


#: The largest element count: 2**62 bytes (the most any device may have, as
#: for every fragctl size) of the widest element, 8 bytes. The manager
#: multiplies counts by the element size.
MAX_COUNT = (1 << 62) // 8


_WHO = "fragctl.torch.zero3"


def _invalid(message: str) -> Exception:
    """The error of a bad value: a fragctl.ConfigurationError, also a ValueError."""
    return invalid(_WHO, message)


def _count(key: str, value: Any) -> int:
    """A DeepSpeed element count: an int, a whole float such as 5e7, or the
    HF Trainer's "auto" (DeepSpeed's default: nothing fills it here); at
    most MAX_COUNT."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("fragctl.torch.zero3: %s=%r: expected an element count such as 5e7" % (key, value))
    if isinstance(value, float) and (not math.isfinite(value) or value != math.floor(value)):
        raise _invalid("%s=%r: expected a whole number of elements" % (key, value))
    if value < 0:
        raise _invalid("%s=%r: a count cannot be negative" % (key, value))
    if value > MAX_COUNT:
        raise _invalid("%s=%r: more elements than any device holds; at most 2**59 (%d: 2**62 bytes of 8-byte "
                       "elements)" % (key, value, MAX_COUNT))
    return int(value)


def parse_config(config: ConfigSource = None, **options: Any) -> Zero3Config:
    """DeepSpeed stage-3 options -> Zero3Config.

    ``config``: a ``ds_config.json`` path, a ds_config dict (its
    ``zero_optimization`` block is read; the other sections belong to other
    parts of DeepSpeed and are not looked at), or a ``zero_optimization``
    dict. ``options`` (DeepSpeed's key names) override it. ``"auto"`` values
    (as Hugging Face configs write them) take DeepSpeed's defaults.

    Raises fragctl.ConfigurationError (a ValueError) naming every key that
    is unknown or unsupported (with the reason), a ``stage`` other than 3, a
    bad value (a count above MAX_COUNT too), or a file that cannot be read or
    is not a JSON object; TypeError for a value of the wrong type given as a
    dict or keyword. An error about the file's contents names the file.
    """
    block, path = read_section(config, "zero_optimization", _WHO)
    from_file = set(block) - set(options) if path is not None else set()
    block.update(options)

    def source(keys: Any) -> str:
        """"the DeepSpeed config PATH: " when a key of `keys` comes from the file."""
        return "the DeepSpeed config %s: " % path if from_file.intersection(keys) else ""

    problems, named, taken = [], [], []
    for key in sorted(block):
        value = block[key]
        if key in _COUNTS or key == "stage":
            continue
        if key in _ALWAYS:
            if value is False:
                taken.append((key, value, _ALWAYS[key]))
            if isinstance(value, bool) or value == "auto":
                continue
            problems.append("%s=%s (expected true, false or \"auto\")" % (key, shown(value)))
        elif key in _INTERNAL:
            taken.append((key, value, _INTERNAL[key]))
            continue
        elif key in _CAPABILITY:
            accepts, why = _CAPABILITY[key]
            if value == "auto" or accepts(value):
                continue
            problems.append("%s=%s (unsupported: %s)" % (key, shown(value), why))
        else:
            problems.append("%s (unknown)" % key)
        named.append(key)
    if problems:
        raise _invalid("%sDeepSpeed zero_optimization keys fragctl does not take: %s. Accepted: stage (3), %s; "
                       "%s (true, false or \"auto\"); the keys that tune DeepSpeed's internals (with a note); "
                       "offload, ZeRO++ and MiCS keys where they ask for none"
                       % (source(named), "; ".join(problems), ", ".join(_COUNTS), ", ".join(sorted(_ALWAYS))))
    stage = block.get("stage", 3)
    if stage != 3 or isinstance(stage, bool):
        raise _invalid("%sstage=%r: fragctl implements ZeRO stage 3 only" % (source(["stage"]), stage))
    counts = {}
    for key in _COUNTS:
        if key in block and block[key] != "auto":
            try:
                counts[key] = _count(key, block[key])
            except (TypeError, ValueError) as e:
                if not source([key]):
                    raise
                raise _invalid(source([key]) + str(e).replace("fragctl.torch.zero3: ", "", 1)) from e
    return Zero3Config(**counts, notes=note(_WHO, taken))


def _check_reduce_bucket(blocks: Any, cfg: Zero3Config) -> None:
    """Raises ValueError for a block (a module of ``block_types`` counts with
    its whole subtree) whose reduce-scattered gradients, its trainable
    parameters above the persistence threshold, have more elements than
    ``reduce_bucket_size``: one block's gradients fill one reduce bucket."""
    for b in blocks:
        reduced = sum(p.numel() for p in b.params
                      if p.requires_grad and p.numel() >= cfg.stage3_param_persistence_threshold)
        if reduced > cfg.reduce_bucket_size:
            raise ValueError("fragctl.torch.zero3.shard: block %s has %d trainable elements to reduce-scatter, more "
                             "than reduce_bucket_size=%d" % (b.name, reduced, cfg.reduce_bucket_size))


_GRADIENT_TYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _deadline(dist: Any, group: Any, timeout: Optional[float]) -> Tuple[float, Optional[float]]:
    """(fragctl's deadline per collective, the group's timeout) in seconds.
    Raises ValueError for a `timeout` that is not a positive number or is not
    below the group's timeout (the group would give up first)."""
    group_seconds = group_timeout(dist, group)
    if timeout is None:
        if group_seconds is None:
            from datetime import timedelta
            group_seconds = getattr(dist, "default_pg_timeout", timedelta(minutes=30)).total_seconds()
        return DEADLINE_FRACTION * group_seconds, group_seconds
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) \
            or timeout <= 0:
        raise ValueError("fragctl.torch.zero3.shard: timeout=%r: expected seconds > 0, or None for %g x the process "
                         "group's timeout" % (timeout, DEADLINE_FRACTION))
    if group_seconds is not None and timeout >= group_seconds:
        raise ValueError("fragctl.torch.zero3.shard: timeout=%g s is not below the process group's timeout of %g s, "
                         "which would end the collective first; pass less, or None for %g x the group's"
                         % (timeout, group_seconds, DEADLINE_FRACTION))
    return float(timeout), group_seconds


def shard(model: Any, process_group: Any = None, config: ConfigSource = None, *, timeout: Optional[float] = None,
          block_types: Tuple[type, ...] = (), allocator: Optional[Allocator] = None,
          **options: Any) -> ShardedModule:
    """Partitions ``model``'s parameters over the ranks of ``process_group``
    (default: the whole world) in fragctl's ZeRO-3 block manager.

    ``config`` and ``options`` as parse_config (DeepSpeed's stage-3 keys, a
    ``zero_optimization`` block or a ``ds_config.json``). Blocks: every module
    of one of ``block_types`` (e.g. a transformer layer class) with all the
    parameters of its subtree, and every other module that owns parameters
    directly. A block is gathered before its module's forward (and in
    backward when autograd needs its parameters) and released after; a
    parameter read outside its block's forward (nn.MultiheadAttention reads
    ``out_proj.weight`` itself) needs a block type above it. Gradients are
    averaged over the ranks and reduce-scattered into the shards. Returns a
    ShardedModule: call it as the model, give its ``parameters()`` (the local
    shards) to a torch.optim optimizer, save and load with
    ``full_state_dict()`` / ``load_full_state_dict()``.

    Collectives run through ``process_group`` (gloo on CPU ranks, NCCL on
    GPUs). Each has fragctl's deadline: ``timeout`` seconds, by default
    (None) DEADLINE_FRACTION (0.8) x the group's timeout (``init_process_group(timeout=...)``),
    so it comes first; a ``timeout`` not below the group's is a ValueError.
    On CPU ranks a collective past it raises CollectiveTimeoutError naming
    the ranks that have not entered it, where each last was and how long it
    has been silent (every rank publishes its collectives' progress through
    the group's store); one that fails otherwise raises CollectiveError. On
    GPUs PyTorch's NCCL watchdog enforces the group's timeout.

    CPU models run the manager on fragctl's sim backend in backed mode
    (unless FRAGCTL_BACKEND is set); CUDA models on the backend of
    FRAGCTL_BACKEND (default: the first that finds a device), on the model's
    device. The backend and device go to the allocators made for the
    manager (fragctl/torch/_pools.py); the process environment is not
    changed.

    Memory: ``allocator`` (a ``fragctl.Allocator`` on the manager's backend
    and device) is where the manager allocates everything, shards, gradient
    slices and gathered blocks; it cannot be closed before the ShardedModule
    is (``TooLateError``). Without it, while ``fragctl.torch.enable()`` is
    active and the model is on a GPU, the manager allocates from PyTorch's
    own allocator (``fragctl.default_allocator(device)``), so memory it frees
    can hold tensors and the reverse; otherwise two private allocators
    (long-lived memory, gathered blocks) are made for it with the
    environment's policy (FRAGCTL_POLICY, FRAGCTL_CONF), closed with the
    ShardedModule.

    The manager's memory must be what the parameters can live in: host
    memory for a CPU model (sim in backed mode), GPU memory for a CUDA one.
    An ``allocator`` of another kind, or ``FRAGCTL_BACKEND=sim`` without
    ``sim_backed:true`` in ``FRAGCTL_CONF`` for the manager's own (addresses
    without memory: every rank died of SIGSEGV, issue 27), raises
    fragctl.ConfigurationError saying what to pass, before anything is
    written.

    Raises RuntimeError when torch.distributed is not initialized,
    ValueError for bad options, shared parameters, mixed dtypes, a block (with
    ``block_types``, a whole layer) with more trainable elements above the
    persistence threshold than ``reduce_bucket_size``; TypeError for an
    ``allocator`` that is not a ``fragctl.Allocator``, ValueError for one on
    another GPU than the model, fragctl.ConfigurationError
    (a ValueError) for memory the parameters cannot live in.
    """
    if allocator is not None and not isinstance(allocator, Allocator):
        raise TypeError("fragctl.torch.zero3.shard: allocator must be a fragctl.Allocator, got %s"
                        % type(allocator).__name__)
    from ._runtime import _torch
    torch = _torch()
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("fragctl.torch.zero3.shard: torch.distributed is not initialized; call "
                           "torch.distributed.init_process_group first (gloo on CPU, nccl on GPUs)")
    cfg = parse_config(config, **options)
    parameters = list(model.parameters())
    if not parameters:
        raise ValueError("fragctl.torch.zero3.shard: the model has no parameters")
    dtypes = {p.dtype for p in parameters}
    if len(dtypes) != 1 or str(parameters[0].dtype).replace("torch.", "") not in _GRADIENT_TYPES:
        raise ValueError("fragctl.torch.zero3.shard: parameters must share one of float32, bfloat16, float16; "
                         "found %s" % sorted(str(d) for d in dtypes))
    _check_reduce_bucket(find_blocks(model, tuple(block_types)), cfg)
    first = parameters[0]
    text = cfg.options_string(first.element_size(), _GRADIENT_TYPES[str(first.dtype).replace("torch.", "")])
    group = process_group if process_group is not None else dist.group.WORLD
    deadline, group_seconds = _deadline(dist, group, timeout)
    return ShardedModule(torch, model, group, text, deadline, group_seconds, timeout is not None,
                         tuple(block_types), allocator)

__all__ = ["CollectiveError", "CollectiveTimeoutError", "DEADLINE_FRACTION", "DeepSpeedKeyNote", "END_GRACE_S",
           "ShardedModule", "Zero3Config", "Zero3Error", "parse_config", "shard"]
