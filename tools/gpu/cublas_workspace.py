"""Checks on a GPU that PyTorch's cuBLAS workspaces are allocations of its
CUDA allocator, so that under fragctl.torch.enable() they are fragctl's
bytes (docs/reports.md, "cuBLAS and cuDNN workspaces"). One process:

    python3 tools/gpu/cublas_workspace.py            # PyTorch's allocator
    python3 tools/gpu/cublas_workspace.py arena      # under enable("arena")

A first matmul on the Python thread, then a backward (the autograd
engine's thread: another cuBLAS handle), each on a fresh process's default
stream. Prints the allocated bytes each added beyond its tensors and
PyTorch's expected workspace (CUBLAS_WORKSPACE_CONFIG, else 32 MiB on
compute capability 9.0 and 8 MiB + 128 KiB elsewhere), then one
"check ... ok|FAILED" line: ok when each step added at least one
workspace. Exits 1 when it failed.
"""
import os
import re
import sys

import torch


def expected_workspace() -> int:
    """PyTorch 2.11's cuBLAS workspace size (CublasHandlePool.cpp)."""
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    pairs = re.findall(r":([0-9]+):([0-9]+)", config or "")
    if pairs:
        return sum(int(size) * 1024 * int(count) for size, count in pairs)
    return 4096 * 8 * 1024 if torch.cuda.get_device_capability() == (9, 0) else 4096 * 1024 * 2 + 16 * 1024 * 8


def main() -> int:
    policy = sys.argv[1] if len(sys.argv) > 1 else None
    if policy:
        import fragctl
        import fragctl.torch
        fragctl.torch.enable(policy)

    def allocated() -> int:
        """fragctl's requested bytes under enable(), else PyTorch's allocated bytes."""
        if policy:
            return fragctl.stats(torch.cuda.current_device())["requested_bytes"]["current"]
        return torch.cuda.memory_allocated()
    x = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    torch.cuda.synchronize()
    tensor = x.numel() * x.element_size()
    before = allocated()
    y = x @ x  # the Python thread's handle
    torch.cuda.synchronize()
    forward = allocated() - before - tensor
    before = allocated()
    y.sum().backward()  # the autograd engine's thread: another handle
    torch.cuda.synchronize()
    backward = allocated() - before - tensor  # x.grad
    workspace = expected_workspace()
    print("allocator: %s; expected cuBLAS workspace %d bytes; added beyond tensors: forward %d, backward %d"
          % (policy or "PyTorch's", workspace, forward, backward))
    ok = forward >= workspace and backward >= workspace
    print("check cuBLAS workspaces are allocations of PyTorch's allocator (%s): %s"
          % ("fragctl's under enable()" if policy else "its own", "ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
