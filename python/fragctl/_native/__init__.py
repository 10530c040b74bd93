"""The native PyTorch backend: fragctl behind PyTorch's CUDAAllocator interface.

``load()`` compiles ``torch_allocator.cpp`` against the installed torch with
``torch.utils.cpp_extension`` (a C++ compiler and ninja are needed once) and
caches the module under ``FRAGCTL_TORCH_BUILD_DIR`` or
``~/.cache/fragctl/torch-<torch version>-<source hash>``; later processes load
the cached module in well under a second. docs/pytorch.md.
"""
import hashlib
import os
import sys
import threading

_lock = threading.Lock()
_module = None

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_allocator.cpp")


def _include_dirs():
    """Folders holding fragctl/fragctl.h: the package's copy, else the checkout's."""
    from .. import _capi
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    candidates = [os.path.join(here, "include")] + [os.path.join(t, "include") for t in _capi._source_trees()]
    found = [d for d in candidates if os.path.isfile(os.path.join(d, "fragctl", "fragctl.h"))]
    if not found:
        raise FileNotFoundError("fragctl/fragctl.h is in none of: " + ", ".join(candidates))
    return found[:1]


def _build_directory(torch, include_dir):
    with open(_SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read())
    with open(os.path.join(include_dir, "fragctl", "fragctl.h"), "rb") as f:
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
                sources=[_SOURCE],
                extra_include_paths=include,
                extra_cflags=["-O2"],
                with_cuda=True,
                build_directory=directory,
                verbose=verbose,
            )
        return _module
