"""ZeRO-3 configuration for fragctl's parameter-block manager, in DeepSpeed's
terms (docs/torch-services.md, "ZeRO-3").

``parse_config`` reads DeepSpeed's stage-3 options, given as keyword
arguments, as a ``zero_optimization`` block (a dict), or as a whole
``ds_config.json`` (a path or a dict holding ``zero_optimization``), and
returns a ``Zero3Config`` whose ``options_string()`` is what the block
manager's C API (``fragctl_zero3_create``, fragctl/zero3/zero3.h) takes.
Keys fragctl does not implement are refused by name, with the reason, rather
than silently ignored: a DeepSpeed user who sets ``offload_param`` must learn
that nothing is offloaded.
"""
import json
import math
import os
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from .. import Allocator, ConfigurationError
from ._blocks import find_blocks
from ._errors import CollectiveError, CollectiveTimeoutError, Zero3Error
from ._sharded import ShardedModule

ConfigSource = Union[None, str, "os.PathLike[str]", Mapping[str, Any]]

# DeepSpeed's defaults, which are also the block manager's (docs/zero3.md).
_DEFAULT_MAX_LIVE = 1_000_000_000
_DEFAULT_PREFETCH = 50_000_000
_DEFAULT_PERSISTENCE = 100_000
_DEFAULT_REDUCE_BUCKET = 500_000_000

# Keys accepted with a value that changes nothing, because fragctl always does
# what the value asks: key -> (the accepted value, why).
_ALWAYS = {
    "overlap_comm": (True, "collectives always run on the manager's own stream, overlapped with compute"),
    "contiguous_gradients": (True, "gradients are always reduced into one contiguous gradient shard"),
    "reduce_scatter": (True, "gradients are always reduce-scattered"),
    "stage3_gather_16bit_weights_on_model_save": (True, "state_dict() always gathers the full parameters"),
    "stage3_gather_fp16_weights_on_model_save": (True, "state_dict() always gathers the full parameters"),
}

def _no_offload(value: Any) -> bool:
    """Whether an offload_param / offload_optimizer block asks for no offload (device "none" or absent)."""
    return isinstance(value, dict) and str(value.get("device", "none")).lower() == "none"


# DeepSpeed keys fragctl refuses: key -> why.
_UNSUPPORTED = {
    "offload_param": "parameters are not offloaded to CPU or NVMe (use fragctl.torch.offload_activations for "
                     "activations)",
    "offload_optimizer": "optimizer state is not offloaded; the torch.optim optimizer keeps it beside the shards",
    "cpu_offload": "offload is not implemented",
    "cpu_offload_params": "offload is not implemented",
    "cpu_offload_use_pin_memory": "offload is not implemented",
    "stage3_max_reuse_distance": "a block is released when its last user releases it; there is no reuse window",
    "sub_group_size": "the optimizer steps each rank's shard as one group",
    "allgather_partitions": "a stage 1-2 key",
    "allgather_bucket_size": "a stage 1-2 key: stage 3 gathers one block at a time",
    "round_robin_gradients": "a stage 1-2 key",
    "elastic_checkpoint": "a stage 1-2 key",
    "load_from_fp32_weights": "the optimizer's state is torch.optim's",
    "zero_hpz_partition_size": "ZeRO++ hierarchical partitioning is not implemented",
    "zero_quantized_weights": "ZeRO++ quantized weights are not implemented",
    "zero_quantized_nontrainable_weights": "ZeRO++ quantized weights are not implemented",
    "zero_quantized_gradients": "ZeRO++ quantized gradients are not implemented",
    "mics_shard_size": "MiCS is not implemented",
    "mics_hierarchical_params_gather": "MiCS is not implemented",
    "memory_efficient_linear": "no Linear is replaced",
    "stage3_module_granularity_threshold": "blocks are the modules given, never merged",
    "ignore_unused_parameters": "every parameter of a block is gathered with it",
    "legacy_stage1": "a stage 1 key",
    "use_multi_rank_bucket_allreduce": "a stage 1-2 key",
}

_COUNTS = ("stage3_max_live_parameters", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
           "reduce_bucket_size")


@dataclass(frozen=True)
class Zero3Config:
    """DeepSpeed stage-3 settings as the block manager reads them. Counts are
    elements, as in DeepSpeed; the manager budgets bytes (count x element size)."""

    stage3_max_live_parameters: int = _DEFAULT_MAX_LIVE
    stage3_prefetch_bucket_size: int = _DEFAULT_PREFETCH
    stage3_param_persistence_threshold: int = _DEFAULT_PERSISTENCE
    #: Elements reduced at once. The manager's two reduce buckets each hold
    #: one block's gradients, so a block (a module of ``block_types`` with its
    #: whole subtree) may not have more trainable elements above the
    #: persistence threshold than this (checked by ``shard``).
    reduce_bucket_size: int = _DEFAULT_REDUCE_BUCKET

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


def _invalid(message: str) -> ConfigurationError:
    """The error of a bad value: a fragctl.ConfigurationError, also a ValueError."""
    return ConfigurationError("fragctl.torch.zero3: " + message, "FRAGCTL_ERROR_INVALID_ARGUMENT")


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


def _block(config: ConfigSource) -> Dict[str, Any]:
    """The zero_optimization block of `config` (a path, a whole ds_config, or
    the block itself). Errors about a file name the file."""
    if config is None:
        return {}
    path = None
    if isinstance(config, (str, os.PathLike)):
        path = config
        try:
            with open(path, encoding="utf-8") as f:
                config = json.load(f)
        except OSError as e:
            raise _invalid("cannot read the DeepSpeed config %s: %s" % (path, e)) from e
        except UnicodeDecodeError as e:
            raise _invalid("the DeepSpeed config %s is not UTF-8 text (byte %d), so not JSON" % (path, e.start)) from e
        except json.JSONDecodeError as e:
            raise _invalid("the DeepSpeed config %s is not JSON: %s" % (path, e)) from e
        except RecursionError as e:
            raise _invalid("the DeepSpeed config %s nests deeper than Python's JSON reader goes; a ds_config is "
                           "a few levels deep" % path) from e
    if not isinstance(config, Mapping):
        if path is not None:
            raise _invalid("the DeepSpeed config %s holds a JSON %s, not an object" % (path, type(config).__name__))
        raise TypeError("fragctl.torch.zero3: config must be a ds_config path, a ds_config dict or a "
                        "zero_optimization dict, got %s" % type(config).__name__)
    if "zero_optimization" in config:
        block = config["zero_optimization"]
        if not isinstance(block, Mapping):
            if path is not None:
                raise _invalid("the DeepSpeed config %s: zero_optimization must be an object, got %s"
                               % (path, type(block).__name__))
            raise TypeError("fragctl.torch.zero3: zero_optimization must be an object, got %s"
                            % type(block).__name__)
        return dict(block)
    return dict(config)


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
    block = _block(config)
    path = config if isinstance(config, (str, os.PathLike)) else None
    from_file = set(block) - set(options) if path is not None else set()
    block.update(options)

    def source(keys: Any) -> str:
        """"the DeepSpeed config PATH: " when a key of `keys` comes from the file."""
        return "the DeepSpeed config %s: " % path if from_file.intersection(keys) else ""

    problems, named = [], []
    for key in sorted(block):
        if key in ("offload_param", "offload_optimizer") and _no_offload(block[key]):
            continue  # Hugging Face's stock stage-3 config: {"device": "none"} means no offload
        if key in _UNSUPPORTED:
            problems.append("%s (unsupported: %s)" % (key, _UNSUPPORTED[key]))
        elif key in _ALWAYS and block[key] != _ALWAYS[key][0]:
            problems.append("%s=%r (unsupported: %s)" % (key, block[key], _ALWAYS[key][1]))
        elif key not in _ALWAYS and key not in _COUNTS and key != "stage":
            problems.append("%s (unknown)" % key)
        else:
            continue
        named.append(key)
    if problems:
        raise _invalid("%sDeepSpeed zero_optimization keys fragctl does not take: %s. "
                       "Accepted: stage (3), %s, and %s at their DeepSpeed defaults"
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
    return Zero3Config(**counts)


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


def shard(model: Any, process_group: Any = None, config: ConfigSource = None, *, timeout: float = 600.0,
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
    GPUs); its own timeout (``init_process_group(timeout=...)``) is what
    expires; ``timeout`` (seconds) is only quoted in messages. A collective
    that fails or times out raises CollectiveError / CollectiveTimeoutError
    naming the rank, the collective and the block.

    CPU models run the manager on fragctl's sim backend in backed mode (set
    here for the call, unless FRAGCTL_BACKEND is set); CUDA models on the
    backend of FRAGCTL_BACKEND (default: the first that finds a device), on
    the model's device.

    Memory: ``allocator`` (a ``fragctl.Allocator`` on the manager's backend
    and device) is where the manager allocates everything, shards, gradient
    slices and gathered blocks; it cannot be closed before the ShardedModule
    is (``TooLateError``). Without it, while ``fragctl.torch.enable()`` is
    active and the model is on a GPU, the manager allocates from PyTorch's
    own allocator (``fragctl.default_allocator(device)``), so memory it frees
    can hold tensors and the reverse; otherwise it makes two private
    allocators of the environment's policy.

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
    another backend or device than the manager, fragctl.ConfigurationError
    (a ValueError) for memory the parameters cannot live in.
    """
    if allocator is not None and not isinstance(allocator, Allocator):
        raise TypeError("fragctl.torch.zero3.shard: allocator must be a fragctl.Allocator, got %s"
                        % type(allocator).__name__)
    from . import _torch
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
    environment = {}
    if first.device.type == "cpu" and "FRAGCTL_BACKEND" not in os.environ:
        total = sum(p.numel() * p.element_size() for p in parameters)
        environment = {"FRAGCTL_BACKEND": "sim", "FRAGCTL_POLICY": "caching",
                       "FRAGCTL_CONF": "sim_backed:true,sim_capacity:%d" % max(8 * total, 256 << 20)}
    elif first.device.type == "cuda" and first.device.index:  # the manager's backend on the model's device
        conf = os.environ.get("FRAGCTL_CONF", "")
        environment = {"FRAGCTL_CONF": (conf + "," if conf else "") + "device:%d" % first.device.index}
    saved = {k: os.environ.get(k) for k in environment}
    os.environ.update(environment)
    try:
        return ShardedModule(torch, model, group, text, int(timeout * 1000), tuple(block_types), allocator)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


__all__ = ["CollectiveError", "CollectiveTimeoutError", "ShardedModule", "Zero3Config", "Zero3Error", "parse_config",
           "shard"]
