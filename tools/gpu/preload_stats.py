#!/usr/bin/env python3
"""PyTorch's memory statistics under libfragctl_preload.so: allocates 2 GiB,
frees half, resets the peaks, empties the cache, and prints the four byte
figures after each step as one JSON object, with "ok" saying whether they
are fragctl's (nonzero while memory is live, peaks reset, cache released).

    PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync FRAGCTL_BACKEND=cuda \\
    LD_PRELOAD=$PWD/build/libfragctl_preload.so python3 tools/gpu/preload_stats.py

Exit status 0 when "ok", 1 otherwise.
"""
import json
import sys

import torch

GiB = 1 << 30


def figures() -> dict:
    return {
        "memory_allocated": torch.cuda.memory_allocated(),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "memory_reserved": torch.cuda.memory_reserved(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
    }


def main() -> int:
    backend = torch.cuda.memory.get_allocator_backend()
    blocks = [torch.empty(GiB, dtype=torch.uint8, device="cuda") for _ in range(2)]
    torch.cuda.synchronize()
    steps = {"live_2GiB": figures()}
    del blocks[1]
    torch.cuda.synchronize()
    steps["freed_1GiB"] = figures()
    torch.cuda.reset_peak_memory_stats()
    steps["reset_peaks"] = figures()
    torch.cuda.empty_cache()
    steps["empty_cache"] = figures()
    live, freed, reset, emptied = (steps[k] for k in ("live_2GiB", "freed_1GiB", "reset_peaks", "empty_cache"))
    ok = (live["memory_allocated"] >= 2 * GiB and live["memory_reserved"] >= 2 * GiB
          and freed["memory_allocated"] < 2 * GiB <= freed["max_memory_allocated"]
          and reset["max_memory_allocated"] == reset["memory_allocated"] >= GiB
          and reset["max_memory_reserved"] == reset["memory_reserved"]
          and GiB <= emptied["memory_reserved"] < freed["memory_reserved"])
    print(json.dumps({"allocator_backend": backend, "torch": torch.__version__, "steps": steps, "ok": ok},
                     indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
