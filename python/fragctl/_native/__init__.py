"""The native PyTorch backend: fragctl behind PyTorch's CUDAAllocator interface.

``load()`` compiles the module's sources (every ``*.cpp`` beside this file:
``torch_allocator.cpp``, the glue, and its rooms) against the installed torch
with ``torch.utils.cpp_extension`` (a C++ compiler and ninja are needed once)
and caches the module under ``FRAGCTL_TORCH_BUILD_DIR`` or
``~/.cache/fragctl/torch-<torch version>-<hash>``, the hash covering every
source and header beside this file and fragctl's C headers; later processes
load the cached module in well under a second. docs/pytorch.md.
"""
import hashlib
import os
import sys
import threading

_lock = threading.Lock()
_module = None

_HERE = os.path.dirname(os.path.abspath(__file__))


def _files(*suffixes):
    return sorted(os.path.join(_HERE, name) for name in os.listdir(_HERE) if name.endswith(suffixes))


def _sources():
    """The module's C++ sources, torch_allocator.cpp (the glue) first."""
    return sorted(_files(".cpp"), key=lambda p: os.path.basename(p) != "torch_allocator.cpp")


def _include_dirs():
    """Folders holding fragctl/fragctl.h: the package's copy, else the checkout's."""
    from .. import _capi
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    candidates = [os.path.join(here, "include")] + [os.path.join(t, "include") for t in _capi._source_trees()]
    found = [d for d in candidates if os.path.isfile(os.path.join(d, "fragctl", "fragctl.h"))]
    if not found:
        raise FileNotFoundError("fragctl/fragctl.h is in none of: " + ", ".join(candidates))
    return found[:1]


def _hashed_files(include_dir):
    """Every file the build reads: the module's sources and headers, fragctl's C headers."""
    headers = []
    for directory, _, names in os.walk(os.path.join(include_dir, "fragctl")):
        headers += [os.path.join(directory, n) for n in names if n.endswith(".h")]
    return _files(".cpp", ".hpp") + sorted(headers)


def _build_directory(torch, include_dir):
    digest = hashlib.sha256()
    for path in _hashed_files(include_dir):
        digest.update(os.path.basename(path).encode() + b"\0")
        with open(path, "rb") as f:
            digest.update(f.read())
    base = os.environ.get("FRAGCTL_TORCH_BUILD_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fragctl")
    path = os.path.join(base, "torch-%s-%s" % (torch.__version__.replace("+", "_"), digest.hexdigest()[:12]))
    os.makedirs(path, exist_ok=True)
    return path


def load(verbose=False):
    """The compiled module (built on first use, then cached). Raises on any failure to build."""
    global _module
    with _lock:
        if _module is None:
            import torch
            from torch.utils import cpp_extension
            include = _include_dirs()
            directory = _build_directory(torch, include[0])
            if not any(name.endswith(".so") for name in os.listdir(directory)):
                print("fragctl: compiling the native PyTorch backend for torch %s (once; cached in %s)"
                      % (torch.__version__, directory), file=sys.stderr, flush=True)
            _module = cpp_extension.load(
                name="fragctl_torch_native",
                sources=_sources(),
                extra_include_paths=include,
                extra_cflags=["-O2"],
                with_cuda=True,
                build_directory=directory,
                verbose=verbose,
            )
        return _module
