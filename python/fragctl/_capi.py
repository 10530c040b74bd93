"""Loading libfragctl.so and calling its C API (include/fragctl/fragctl.h).

Where the library is looked for, in order:

1. ``FRAGCTL_LIBRARY``: the path of libfragctl.so (nothing else is tried).
2. A libfragctl already loaded in this process (``LD_PRELOAD`` of
   libfragctl_preload.so loads it): the package must use that copy, so that
   ``fragctl.stats()`` sees the allocators the preload library serves.
3. ``fragctl/lib/libfragctl.so`` inside the package (copy it there to ship it).
4. The build directories of the checkout the package comes from (the one it
   was ``pip install``-ed from, or the one it is imported from): ``build/``
   first, then other ``build*/`` directories, most recently built first.
5. The system loader: ``libfragctl.so.0`` on ``LD_LIBRARY_PATH`` or in an
   installed prefix.
"""
import ctypes
import glob
import operator
import os
import threading

_lock = threading.Lock()
_library = None
_library_path = None

# fragctl_status values (stable, part of the ABI: fragctl.h), for every C
# function, the services' included; their names come from the library
# (fragctl_status_string, see status_name).
OK = 0
(INVALID_ARGUMENT, OUT_OF_MEMORY, BACKEND, NOT_OWNED, SIZE_MISMATCH, IO, STATE, INTERNAL, BUDGET, COLLECTIVE,
 TIMEOUT) = range(1, 12)

# fragctl_memory_kind values (stable, part of the ABI) by the names Python uses.
_MEMORY_KINDS = {0: "none", 1: "host", 2: "device"}


class FragctlError(RuntimeError):
    """A fragctl call failed. ``status`` is the fragctl_status name."""

    def __init__(self, message, status="FRAGCTL_ERROR_INTERNAL"):
        super().__init__(message)
        self.status = status


class ConfigurationError(FragctlError, ValueError):
    """A bad policy expression, option, size or backend name."""


class OutOfMemoryError(FragctlError, MemoryError):
    """The allocator could not serve a request; the message says why."""


class TooLateError(FragctlError):
    """A call not valid now: configuration asked for after allocation
    started, a pause of a paused allocator, a resume of one not paused, an
    allocation while paused."""


class LibraryNotFoundError(FragctlError, OSError):
    """libfragctl.so could not be found or loaded."""


_ERROR_CLASSES = {INVALID_ARGUMENT: ConfigurationError, OUT_OF_MEMORY: OutOfMemoryError, STATE: TooLateError}


def _source_trees():
    trees = []
    try:
        from . import _location  # written by the wheel build
        trees.append(_location.source_tree)
    except ImportError:
        pass
    # Imported from the checkout itself (PYTHONPATH=python).
    trees.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    return trees


def _loaded_copy():
    """Path of a libfragctl.so this process has loaded already, or None."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.split(None, 5)  # address perms offset device inode [path]
                if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith("libfragctl.so"):
                    return fields[5].strip()
    except OSError:
        pass
    return None


def _candidates():
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "lib", "libfragctl.so")
    seen = set()
    for tree in _source_trees():
        builds = glob.glob(os.path.join(tree, "build*", "libfragctl.so"))
        builds.sort(key=lambda p: (os.path.basename(os.path.dirname(p)) != "build", -os.path.getmtime(p)))
        for path in builds:
            if path not in seen:
                seen.add(path)
                yield path


# fragctl_watch_spans's callback (event, address, size, context) and fragctl_spans's visitor.
SPAN_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p)
SPAN_VISIT = ctypes.CFUNCTYPE(None, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p)


def _declare(lib):
    c = ctypes
    status, p, char_p = c.c_int, c.c_void_p, c.c_char_p
    signatures = {
        "fragctl_version": (char_p, []),
        "fragctl_status_string": (char_p, [status]),
        "fragctl_last_error": (char_p, []),
        "fragctl_policy_names": (char_p, []),
        "fragctl_create": (status, [char_p, char_p, char_p, c.c_int, c.POINTER(p)]),
        "fragctl_destroy": (status, [p]),
        "fragctl_malloc": (status, [p, c.POINTER(p), c.c_size_t, p]),
        "fragctl_free": (status, [p, p, c.c_size_t, p]),
        "fragctl_stream_ending": (status, [p, p]),
        "fragctl_release_cached": (status, [p]),
        "fragctl_pause": (status, [p, c.c_int]),
        "fragctl_resume": (status, [p]),
        "fragctl_paused": (status, [p, c.POINTER(c.c_int)]),
        "fragctl_enable_peer_access": (status, [p, c.c_int]),
        "fragctl_watch_spans": (status, [p, SPAN_CALLBACK, p]),
        "fragctl_spans": (status, [p, SPAN_VISIT, p]),

        "fragctl_export_block": (status, [p, p, c.c_size_t, p, c.c_size_t, c.POINTER(c.c_size_t),
                                         c.POINTER(c.c_size_t)]),
        "fragctl_import_block": (status, [p, p, c.c_size_t, c.POINTER(p)]),
        "fragctl_close_block": (status, [p, p]),
        "fragctl_memory_kind_of": (status, [p, c.POINTER(c.c_int)]),
        "fragctl_environment_memory_kind": (status, [c.POINTER(c.c_int)]),
        "fragctl_policy": (char_p, [p]),
        "fragctl_stats_json": (status, [p, c.POINTER(p)]),
        "fragctl_string_free": (None, [p]),
        "fragctl_write_report": (status, [p, char_p]),
        "fragctl_flush": (status, []),
        "fragctl_configure_defaults": (status, [char_p, char_p, char_p]),
        "fragctl_default_allocator": (status, [c.c_int, c.c_int, c.POINTER(p)]),
        "fragctl_write_default_report": (status, [char_p]),
        "fragctl_parse_size": (status, [char_p, c.POINTER(c.c_size_t)]),
        "fragctl_device_memory_split_json": (status, [p, c.POINTER(p)]),
        "fragctl_attribute_device_memory": (status, [p, char_p, char_p, c.c_size_t]),
        "fragctl_process_device_memory_outside": (status, [p, c.POINTER(c.c_size_t)]),
        # The activation-checkpoint store (fragctl/checkpoint/checkpoint.h).
        "fragctl_checkpoint_create": (status, [p, c.c_size_t, c.c_size_t, c.c_int, c.POINTER(p)]),
        "fragctl_checkpoint_destroy": (None, [p]),
        "fragctl_checkpoint_put": (status, [p, c.c_int, c.c_size_t, p, c.POINTER(p)]),
        "fragctl_checkpoint_get": (status, [p, c.c_int, p, c.POINTER(p)]),
        "fragctl_checkpoint_drop": (status, [p, c.c_int]),
        "fragctl_checkpoint_reset": (status, [p]),
        "fragctl_checkpoint_synchronize": (status, [p]),
        "fragctl_checkpoint_where": (status, [p, c.c_int, c.POINTER(c.c_int)]),
        "fragctl_checkpoint_copy_stream": (status, [p, c.POINTER(p)]),
        "fragctl_checkpoint_backend": (char_p, [p]),
        "fragctl_checkpoint_stats_json": (status, [p, c.POINTER(p)]),
        "fragctl_checkpoint_alignment": (c.c_size_t, []),
        # The ZeRO-3 block manager (fragctl/zero3/zero3.h). The collectives
        # struct is declared where it is built (fragctl/torch/_collectives.py).
        "fragctl_zero3_create_with_collectives": (status, [p, p, char_p, p, c.POINTER(p)]),
        "fragctl_zero3_add_block": (status, [p, char_p, p, c.c_size_t]),
        "fragctl_zero3_start": (status, [p]),
        "fragctl_zero3_fetch": (status, [p, c.c_size_t, p, c.POINTER(p), c.POINTER(c.c_size_t), c.c_size_t]),
        "fragctl_zero3_release": (status, [p, c.c_size_t, p]),
        "fragctl_zero3_shard_of": (status, [p, c.c_size_t, c.c_size_t, c.POINTER(c.c_size_t), c.POINTER(p),
                                            c.POINTER(c.c_size_t)]),
        "fragctl_zero3_trainable_shard": (status, [p, c.c_size_t, c.POINTER(p), c.POINTER(p),
                                                   c.POINTER(c.c_size_t)]),
        "fragctl_zero3_persistent": (status, [p, c.c_size_t, c.c_size_t, c.POINTER(p), c.POINTER(p)]),
        "fragctl_zero3_begin_gradients": (status, [p, c.c_size_t, p, c.POINTER(p), c.POINTER(c.c_size_t),
                                                   c.c_size_t]),
        "fragctl_zero3_reduce_gradients": (status, [p, c.c_size_t, p]),
        "fragctl_zero3_finish_gradients": (status, [p, p]),
        "fragctl_zero3_release_gradients": (status, [p, p]),
        "fragctl_zero3_end_step": (status, [p, p]),
        "fragctl_zero3_synchronize": (status, [p]),
        "fragctl_zero3_gradient_event": (status, [p, c.c_int, c.c_size_t, c.c_size_t, p, c.c_char_p, c.c_size_t, p,
                                                  c.c_size_t, c.POINTER(c.c_size_t), c.POINTER(c.c_int)]),
        "fragctl_zero3_stats_json": (status, [p, c.POINTER(p)]),
        "fragctl_zero3_default_options_json": (status, [c.POINTER(p)]),
        "fragctl_zero3_record_hang": (status, [p, char_p]),
        "fragctl_zero3_destroy": (None, [p]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def _load(path):
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    try:
        _declare(lib)
    except AttributeError as e:  # not libfragctl, or an older one without a name this package calls
        raise OSError("not a libfragctl of this version: %s" % e) from None
    return lib


def library():
    """The loaded libfragctl.so (ctypes.CDLL), loading it on first use."""
    global _library, _library_path
    with _lock:
        if _library is not None:
            return _library
        tried = []
        explicit = os.environ.get("FRAGCTL_LIBRARY")
        if explicit:
            candidates = [explicit]
        else:
            loaded = _loaded_copy()
            candidates = ([loaded] if loaded else []) + list(_candidates()) + ["libfragctl.so.0", "libfragctl.so"]
        for path in candidates:
            if os.sep in path and not os.path.exists(path):
                tried.append("%s (missing)" % path)
                continue
            try:
                _library = _load(path)
                _library_path = os.path.realpath(path) if os.sep in path else _loaded_copy() or path
                return _library
            except OSError as e:
                tried.append("%s (%s)" % (path, e))
        raise LibraryNotFoundError(
            "fragctl: cannot load libfragctl.so; build it (tools/build.sh) or set FRAGCTL_LIBRARY to its path. "
            "Tried: " + "; ".join(tried),
            "FRAGCTL_ERROR_BACKEND")


def library_path():
    """Absolute path of the loaded libfragctl.so (what torch's pluggable allocator loads)."""
    library()
    return _library_path


def preload_library():
    """Absolute path of libfragctl_preload.so, the LD_PRELOAD shim: the one
    beside the loaded libfragctl.so (the wheel carries both in fragctl/lib).
    LibraryNotFoundError when it is not there."""
    path = os.path.join(os.path.dirname(library_path()), "libfragctl_preload.so")
    if not os.path.isfile(path):
        raise LibraryNotFoundError("fragctl: no libfragctl_preload.so beside %s (build the target fragctl_preload, "
                                   "or install the wheel, which carries it)" % library_path(),
                                   "FRAGCTL_ERROR_BACKEND")
    return path


# What the C API's integer parameters hold: size_t and pointers (64 bits) and
# int (device ordinals). A Python int outside them is refused here: ctypes
# would otherwise wrap it silently (2**64 + 100 bytes becomes 100).
SIZE_MAX = (1 << 64) - 1
INT_MAX = (1 << 31) - 1
MAX_SIZE = 1 << 62  # the largest size any option takes (no device holds more)


def integer(value, what):
    """``value`` as a Python int (anything with __index__, bool excluded); TypeError otherwise."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError("fragctl: %s must be an integer, got %s %r" % (what, type(value).__name__, value))
    return operator.index(value)


def size(value, what="nbytes"):
    """A byte count for a size_t parameter: ValueError below 0, OverflowError above 2**64 - 1."""
    n = integer(value, what)
    if n < 0:
        raise ValueError("fragctl: %s=%d: a size cannot be negative" % (what, n))
    if n > SIZE_MAX:
        raise OverflowError("fragctl: %s=%d does not fit in size_t (at most 2**64 - 1)" % (what, n))
    return n


def parse_size(value, what="size"):
    """A byte count from an int or a size string ("8GiB", "512MiB", "1.5GiB"),
    parsed by libfragctl as every option is. TypeError for other types (bool
    included), ConfigurationError for a bad string, ValueError below 0."""
    if isinstance(value, str):
        out = ctypes.c_size_t()
        status_code = library().fragctl_parse_size(text(value, what), ctypes.byref(out))
        if status_code != OK:
            message = library().fragctl_last_error().decode(errors="replace")
            raise ConfigurationError("fragctl: %s=%r: %s" % (what, value, message), status_name(status_code))
        return out.value
    n = size(value, what)
    if n > MAX_SIZE:  # as a string is, and every option: no device holds more
        raise ConfigurationError("fragctl: %s=%d: expected a size of at most 4 EiB (2^62 bytes)" % (what, n),
                                 "FRAGCTL_ERROR_INVALID_ARGUMENT")
    return n


def c_int(value, what):
    """An int parameter of the C API (a layer id): OverflowError outside
    -2**31 .. 2**31 - 1, where ctypes would wrap it (2**32 became 0)."""
    n = integer(value, what)
    if not -INT_MAX - 1 <= n <= INT_MAX:
        raise OverflowError("fragctl: %s=%d does not fit in a C int" % (what, n))
    return n


def address(value, what):
    """A pointer or stream handle (0 = NULL) for a void* parameter, as size()."""
    return size(value, what) or None


def device(value, allow_unset=False):
    """A device ordinal for an int parameter (-1 too with ``allow_unset``)."""
    n = integer(value, "device")
    if n < (-1 if allow_unset else 0):
        raise ValueError("fragctl: device=%d: expected a device ordinal >= 0%s"
                         % (n, " (or -1: the options' device)" if allow_unset else ""))
    if n > INT_MAX:
        raise OverflowError("fragctl: device=%d does not fit in a C int (at most 2**31 - 1)" % n)
    return n


def text(value, what="argument"):
    """A str argument as C text; ValueError for a NUL byte, which would end it early."""
    if value is None:
        return None
    value = str(value)
    if "\0" in value:
        raise ValueError("fragctl: %s %r contains a NUL byte" % (what, value))
    return value.encode()


def path(value, what="path"):
    """A file path (str, bytes or os.PathLike) as C text, encoded as the
    file system does (os.fsencode: a name that is not UTF-8 survives);
    TypeError for anything else (str() of it named a file "5" or "b'x'"),
    ValueError for a NUL byte."""
    if not isinstance(value, (str, bytes, os.PathLike)):
        raise TypeError("fragctl: %s must be a str, bytes or os.PathLike, got %s %r" % (what, type(value).__name__,
                                                                                       value))
    encoded = os.fsencode(value)
    if b"\0" in encoded:
        raise ValueError("fragctl: %s %r contains a NUL byte" % (what, value))
    return encoded


def check(status_code):
    """Raises the FragctlError subclass for a failed fragctl_status."""
    if status_code == OK:
        return
    message = library().fragctl_last_error().decode(errors="replace")
    raise _ERROR_CLASSES.get(status_code, FragctlError)(message, status_name(status_code))


def status_name(status_code):
    """The fragctl_status name of a code ("FRAGCTL_ERROR_OUT_OF_MEMORY"), as
    the library spells it; "FRAGCTL_ERROR_UNKNOWN" for a code it lacks."""
    return library().fragctl_status_string(status_code).decode()


def memory_kind_name(kind):
    """A fragctl_memory_kind value as Allocator.memory_kind names it: "none", "host" or "device"."""
    return _MEMORY_KINDS.get(kind, "unknown (%d)" % kind)


def take_json(function, *args):
    """The JSON document a C function returns through its last argument
    (char**, freed with fragctl_string_free), parsed; raises as check()."""
    import json
    out = ctypes.c_void_p()
    check(function(*args, ctypes.byref(out)))
    return json.loads(take_string(out))


def take_string(pointer):
    """Copies and frees a string fragctl returned."""
    try:
        return ctypes.string_at(pointer.value).decode()
    finally:
        library().fragctl_string_free(pointer)


def options_string(options):
    """FRAGCTL_CONF text from keyword options: sizes as ints (bytes) or
    strings ("512MiB"), booleans, strings. None is refused (TypeError): it
    would hide a misspelt key."""
    items = []
    for key, value in options.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif value is None:
            raise TypeError("fragctl: option %s=None: give a value, or leave the option out for its default" % key)
        value = str(value)
        if "," in value or "," in key:
            raise ConfigurationError("option %s=%r: values may not contain ','" % (key, value),
                                     "FRAGCTL_ERROR_INVALID_ARGUMENT")
        items.append("%s:%s" % (key, value))
    return ",".join(items)
