"""Reading DeepSpeed's ``ds_config.json`` for fragctl.torch's services: one
section of it (``zero_optimization`` for zero3.parse_config,
``activation_checkpointing`` for offload_activations), from a path or a
dict, with errors that name the file; and the one note that says which keys
fragctl takes without doing what DeepSpeed does with them, and what it does
instead.

The rule both readers follow (issue 31): a key that tunes DeepSpeed's own
internals, or one at DeepSpeed's default, is taken with that note; a value
that asks for something fragctl cannot do is refused, named with the reason;
a key neither reader knows is refused as unknown (a misspelling must not pass
silently, as it does in DeepSpeed).
"""
import json
import os
import warnings
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple, Union

from .. import ConfigurationError

ConfigSource = Union[None, str, "os.PathLike[str]", Mapping[str, Any]]


class DeepSpeedKeyNote(UserWarning):
    """The note of a DeepSpeed config whose keys fragctl takes without acting
    on them as DeepSpeed does; the message says what fragctl does instead.
    Silence it with ``warnings.simplefilter("ignore", DeepSpeedKeyNote)``."""


#: The most characters of a ds_config file read: real ones are a few KiB.
_LARGEST_CONFIG = 16 << 20


def invalid(who: str, message: str) -> ConfigurationError:
    """The error of a bad value: a fragctl.ConfigurationError, also a ValueError."""
    return ConfigurationError("%s: %s" % (who, message), "FRAGCTL_ERROR_INVALID_ARGUMENT")


# Top-level sections of a ds_config (DeepSpeed's config-json reference): a
# dict or file that holds one of them but not the section asked for is a
# whole ds_config without that section, whose block is then empty.
_TOP_LEVEL = frozenset((
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer", "scheduler",
    "fp16", "bf16", "amp", "torch_autocast", "gradient_clipping", "zero_optimization", "activation_checkpointing",
    "steps_per_print", "wall_clock_breakdown", "communication_data_type", "prescale_gradients",
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "flops_profiler", "tensorboard", "wandb",
    "checkpoint", "data_types"))


def read_section(config: ConfigSource, section: str, who: str) -> Tuple[Dict[str, Any], Optional[str]]:
    """The ``section`` block of ``config`` and the file it came from (None for
    a dict). ``config``: None (an empty block), a ``ds_config.json`` path, a
    ds_config dict holding ``section``, or the block itself (a dict without
    it). Errors about a file name the file and are ConfigurationErrors; a
    dict of the wrong shape is a TypeError."""
    if config is None:
        return {}, None
    path = None
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        try:
            with open(path, encoding="utf-8") as f:
                # Bounded: a ds_config is a few KiB, and /dev/zero (or a FIFO
                # that never ends) was read until memory ran out.
                text = f.read(_LARGEST_CONFIG + 1)
        except OSError as e:
            raise invalid(who, "cannot read the DeepSpeed config %s: %s" % (path, e)) from e
        except UnicodeDecodeError as e:
            raise invalid(who, "the DeepSpeed config %s is not UTF-8 text (byte %d), so not JSON"
                          % (path, e.start)) from e
        if len(text) > _LARGEST_CONFIG:
            raise invalid(who, "the DeepSpeed config %s is larger than %d Mi characters; a ds_config is a few KiB"
                          % (path, _LARGEST_CONFIG >> 20))
        try:
            config = json.loads(text)
        except json.JSONDecodeError as e:
            raise invalid(who, "the DeepSpeed config %s is not JSON: %s" % (path, e)) from e
        except RecursionError as e:
            raise invalid(who, "the DeepSpeed config %s nests deeper than Python's JSON reader goes; a ds_config "
                          "is a few levels deep" % path) from e
        except ValueError as e:  # an integer of more digits than Python converts (4300), say
            raise invalid(who, "the DeepSpeed config %s is not a JSON ds_config: %s" % (path, e)) from e
    if not isinstance(config, Mapping):
        if path is not None:
            raise invalid(who, "the DeepSpeed config %s holds a JSON %s, not an object" % (path, type(config).__name__))
        raise TypeError("%s: config must be a ds_config path, a ds_config dict or a %s dict, got %s"
                        % (who, section, type(config).__name__))
    if section in config:
        block = config[section]
        if not isinstance(block, Mapping):
            if path is not None:
                raise invalid(who, "the DeepSpeed config %s: %s must be an object, got %s"
                              % (path, section, type(block).__name__))
            raise TypeError("%s: %s must be an object, got %s" % (who, section, type(block).__name__))
        return dict(block), path
    if _TOP_LEVEL.intersection(config):
        return {}, path
    return dict(config), path


def shown(value: Any) -> str:
    """A value as a ds_config writes it: JSON, counts as DeepSpeed writes
    them (1e9, 9.4e5), a long or deep object by its kind."""
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1e4:
        mantissa, exponent = ("%e" % value).split("e")
        return "%se%d" % (mantissa.rstrip("0").rstrip("."), int(exponent))
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = None
    if text is not None and len(text) <= 80:
        return text
    return "an object" if isinstance(value, Mapping) else "a %s" % type(value).__name__


def note(who: str, taken: Iterable[Tuple[str, Any, str]], stacklevel: int = 2) -> Tuple[str, ...]:
    """Emits one DeepSpeedKeyNote for the keys `taken` ((key, value, what
    fragctl does instead) each), none when there are none; returns its
    lines."""
    lines = tuple("%s=%s: %s" % (key, shown(value), instead) for key, value, instead in taken)
    if lines:
        warnings.warn("%s: DeepSpeed keys taken without DeepSpeed's effect (what fragctl does instead): %s"
                      % (who, "; ".join(lines)), DeepSpeedKeyNote, stacklevel=stacklevel + 1)
    return lines


# DeepSpeed's activation_checkpointing keys at DeepSpeed's defaults (its
# config-json reference), which a block given to offload_activations starts
# from; without a block, offload_activations' own defaults (it exists to
# offload, into one region).
ACTIVATION_DEFAULTS = {"partition_activations": False, "cpu_checkpointing": False,
                       "contiguous_memory_optimization": False, "number_checkpoints": None,
                       "synchronize_checkpoint_boundary": False, "profile": False}
OFFLOAD_DEFAULTS = dict(ACTIVATION_DEFAULTS, cpu_checkpointing=True, contiguous_memory_optimization=True)

# Values fragctl cannot honour: key -> why.
_ACTIVATION_REFUSED = {
    "partition_activations": "splitting activations over model-parallel ranks is not done here",
    "profile": "fragctl logs no per-checkpoint times; stats() counts what the store moved and copied",
}


def activation_checkpointing(config: ConfigSource, given: Mapping[str, Any],
                             who: str) -> Tuple[Dict[str, Any], Tuple[str, ...]]:
    """offload_activations' DeepSpeed settings and the lines of its note.

    ``config``: a ds_config path or dict, or its ``activation_checkpointing``
    block (keys absent from it take DeepSpeed's defaults: no CPU
    checkpointing); None: OFFLOAD_DEFAULTS. ``given``: the keywords passed
    (None: not passed), which override the block. Raises TypeError for a
    value of the wrong type (fragctl.ConfigurationError naming the file when
    it comes from one), ConfigurationError (a ValueError) naming every
    unknown key and every value fragctl cannot honour, with the reason.
    Emits one DeepSpeedKeyNote for values taken without DeepSpeed's effect."""
    block, path = read_section(config, "activation_checkpointing", who)
    from_file = set(block) - {k for k, v in given.items() if v is not None} if path is not None else set()
    values = dict(block)
    values.update({k: v for k, v in given.items() if v is not None})
    settings = dict(ACTIVATION_DEFAULTS if config is not None else OFFLOAD_DEFAULTS)
    problems = []
    for key in sorted(values):
        value = values[key]
        where = "the DeepSpeed config %s: " % path if key in from_file else ""
        if key not in ACTIVATION_DEFAULTS:
            problems.append("%s%s (unknown)" % (where, key))
            continue
        if key == "number_checkpoints":
            fits = value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)
            expected = "a count of checkpoints or null"
        else:
            fits, expected = isinstance(value, bool), "true or false"
        if not fits:
            if where:
                raise invalid(who, "%s%s=%s: expected %s" % (where, key, shown(value), expected))
            raise TypeError("%s: %s must be %s, got %r" % (who, key, "a bool" if expected == "true or false"
                                                           else "an int >= 0 or None", value))
        settings[key] = value
        if key in _ACTIVATION_REFUSED and value:
            problems.append("%s%s=true (unsupported: %s)" % (where, key, _ACTIVATION_REFUSED[key]))
    if problems:
        raise invalid(who, "DeepSpeed activation_checkpointing keys fragctl does not take: %s. Accepted: %s"
                      % ("; ".join(problems), ", ".join(ACTIVATION_DEFAULTS)))
    taken = []
    if given.get("cpu_checkpointing") is None and config is not None and not settings["cpu_checkpointing"]:
        taken.append(("cpu_checkpointing", False, "no hooks are installed: activations stay where autograd keeps "
                                                  "them (offload_activations recomputes nothing; "
                                                  "torch.utils.checkpoint does)"))
    if not settings["contiguous_memory_optimization"]:
        taken.append(("contiguous_memory_optimization", False, "the store keeps every device copy in its one "
                                                               "region anyway"))
    if settings["number_checkpoints"] is not None:
        taken.append(("number_checkpoints", settings["number_checkpoints"], "the budget sizes the store's region"))
    return settings, note(who, taken, stacklevel=3)
