#!/usr/bin/env python3
"""ns per allocate/free of a real training trace, replayed in C++ through
PyTorch's current CUDA allocator.

    python3 benchmarks/torch_replay/replay_speed.py ROUTE [--repeats N]

ROUTE: torch (PyTorch's own allocator), native or pluggable
(fragctl.torch.enable with that route, policy from FRAGCTL_TEST_POLICY,
default arena). The trace is FRAGCTL_REPLAY_TRACE, default
tests/data/gpt2m.trace.csv.gz. The C++ replay loop
(current_allocator_replay.cpp) is compiled with torch.utils.cpp_extension
into FRAGCTL_TORCH_BUILD_DIR/replay (or a temporary folder). The last line
printed is a JSON object: ok, ns_per_op, ops, route (tools/gpu/torch_backend.sh
collects them). Needs PyTorch 2.x and a CUDA GPU.
"""
import argparse
import gzip
import json
import os
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def setup(route):
    import torch
    if route in ("native", "pluggable"):
        import fragctl.torch
        fragctl.torch.enable(os.environ.get("FRAGCTL_TEST_POLICY", "arena"), route=route)
    return torch


def read_trace(path):
    """(ops, sizes) of a fragctl trace CSV: allocations numbered in order, frees as -slot-1."""
    ops, sizes, slot_of = [], [], {}
    with gzip.open(path, "rt") as f:
        next(f)
        for line in f:
            if line.startswith("#"):
                continue
            action, addr, size = line.split(",")[:3]
            if action == "alloc":
                slot_of[addr] = len(sizes)
                ops.append(len(sizes))
                sizes.append(int(size))
            elif action == "free_requested" and addr in slot_of:
                ops.append(-slot_of.pop(addr) - 1)
    return ops, sizes


def load_module():
    from torch.utils import cpp_extension
    base = os.environ.get("FRAGCTL_TORCH_BUILD_DIR")
    directory = os.path.join(base, "replay") if base else tempfile.mkdtemp(prefix="fragctl-replay-")
    os.makedirs(directory, exist_ok=True)
    return cpp_extension.load(name="fragctl_current_allocator_replay",
                              sources=[os.path.join(HERE, "current_allocator_replay.cpp")],
                              extra_cflags=["-O2"], with_cuda=True, build_directory=directory, verbose=False)


def replay_speed(torch, repeats):
    trace = os.environ.get("FRAGCTL_REPLAY_TRACE", os.path.join(ROOT, "tests", "data", "gpt2m.trace.csv.gz"))
    ops, sizes = read_trace(trace)
    module = load_module()
    torch.zeros(1, device="cuda")  # initializes the allocator of the device
    module.replay(ops, sizes, 1)  # warm: the cache and the pages
    torch.cuda.synchronize()
    ns = module.replay(ops, sizes, repeats)
    return {"ns_per_op": ns, "ops": len(ops) * repeats}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("route", choices=["torch", "native", "pluggable"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch = setup(args.route)
    try:
        result = {"ok": True, **replay_speed(torch, args.repeats)}
    except Exception as e:
        result = {"ok": False, "error": "%s: %s" % (type(e).__name__, e), "traceback": traceback.format_exc()[-3000:]}
    if args.route in ("native", "pluggable"):
        import fragctl.torch
        result["route"] = fragctl.torch.route()
    sys.stdout.flush()
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
