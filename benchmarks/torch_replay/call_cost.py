"""What one PyTorch allocation and free cost a user, through each allocator (issue 32).

The replays (tools/gpu/fastpath.sh) time the allocators from C++; this times
them where a training loop meets them: from Python, through PyTorch's
dispatcher and its CUDAAllocator interface, so under ``fragctl.torch.enable``
the native module's bookkeeping (its memory history, the block's owner on
free) is counted too. One process per allocator:

    python3 benchmarks/torch_replay/call_cost.py --mode native|expandable|arena [--json OUT]

Patterns, each a loop of --iterations, timed whole with perf_counter_ns,
repeated --repeats times (the median and the lowest are printed):

* ``raw``: ``torch.cuda.caching_allocator_alloc(1 MiB)`` and ``_delete``
  (the allocator's raw_alloc/raw_delete, no tensor);
* ``tensor``: ``torch.empty(1 MiB, device="cuda")`` and its release;
* ``working_set``: 256 tensors live; each iteration replaces one, drawn at
  random, with a tensor of a size drawn log-uniformly from 512 B to 64 MiB
  (draws made before the loop, the same in every process);
* ``memory_allocated``: ``torch.cuda.memory_allocated()`` with the working
  set live (what a loop that logs its memory pays; --iterations / 10 calls).

The working set's first 256 tensors are made before the first loop, so
every pattern is timed with them live.

The figure is ns per iteration (one allocation and one free; one call for
``memory_allocated``). Nothing is
launched on the GPU; a run takes a few seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time


def _setup(mode: str):
    if mode == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch

    if mode == "arena":
        import fragctl.torch

        fragctl.torch.enable("arena")
    if not torch.cuda.is_available():
        sys.exit("call_cost: no CUDA device")
    torch.cuda.init()
    return torch


def _time(loop, iterations: int, repeats: int) -> list[float]:
    loop(min(iterations, 1000))  # warm: the first blocks are mapped or cached here
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        loop(iterations)
        out.append((time.perf_counter_ns() - t0) / iterations)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["native", "expandable", "arena"], required=True)
    parser.add_argument("--iterations", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    if args.iterations < 1 or args.repeats < 1:
        parser.error("--iterations and --repeats must be at least 1")
    torch = _setup(args.mode)

    mib = 1 << 20

    def raw(n: int) -> None:
        alloc, free = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete
        for _ in range(n):
            free(alloc(mib))

    def tensor(n: int) -> None:
        empty = torch.empty
        for _ in range(n):
            t = empty(mib, dtype=torch.uint8, device="cuda")
            del t

    rng = random.Random(32)
    draws = 4096
    sizes = [int(math.exp(rng.uniform(math.log(512), math.log(64 * mib)))) for _ in range(draws)]
    slots = [rng.randrange(256) for _ in range(draws)]
    live = [torch.empty(sizes[i], dtype=torch.uint8, device="cuda") for i in range(256)]

    def working_set(n: int) -> None:
        empty = torch.empty
        for i in range(n):
            k = i & (draws - 1)
            live[slots[k]] = empty(sizes[k], dtype=torch.uint8, device="cuda")

    def memory_allocated(n: int) -> None:
        read = torch.cuda.memory_allocated
        for _ in range(n):
            read()

    result = {"mode": args.mode, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
              "iterations": args.iterations, "repeats": args.repeats, "ns_per_iteration": {}}
    for name, loop, count in (("raw", raw, args.iterations), ("tensor", tensor, args.iterations),
                              ("working_set", working_set, args.iterations),
                              ("memory_allocated", memory_allocated, max(1, args.iterations // 10))):
        samples = _time(loop, count, args.repeats)
        result["ns_per_iteration"][name] = {"median": statistics.median(samples), "min": min(samples),
                                            "samples": samples}
        print(f"{args.mode:10s} {name:16s} median {statistics.median(samples):8.0f} ns, lowest {min(samples):8.0f} ns",
              flush=True)
    live.clear()
    torch.cuda.synchronize()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
