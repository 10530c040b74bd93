"""Shared by the fragctl.torch service tests: torch if importable, else the
reason every test skips with."""
KiB = 1 << 10
MiB = 1 << 20

try:
    import torch
    SKIP = None
except ImportError as e:
    torch = None
    SKIP = ("fragctl.torch services need PyTorch, which is missing here (%s): install python3-torch "
            "(tools/install-deps.sh --torch) and configure with an interpreter that has it "
            "(-DFRAGCTL_TORCH_PYTHON=/usr/bin/python3)" % e)
